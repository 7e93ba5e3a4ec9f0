// LoadService (daemon/load_service.h) in process, into memfd-backed registered tensors: the
// newest committed step or a named one, the first load read from storage and a replica's load
// of the same bytes served from the hot cache, a load resharded across the stored shards, the
// rank's extra blob (also for a rank the saved job did not have), errors for a missing step or
// tensor, the non-strict load, the pins released once a load ends, and a load planned across
// nodes whose peers fail (fake peers serving the step's files): what a failed peer did not
// deliver comes from the range's other sources, and only what none delivered from storage.
#include "daemon/load_service.h"

#include <sys/mman.h>
#include <unistd.h>

#include <fcntl.h>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <chrono>

#include <filesystem>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "common/step_layout.h"
#include "tests/checkpoint_builder.h"
#include "tests/test_util.h"

namespace ckpt {
namespace {

namespace pb = ckptd::v1;
using Catch::Matchers::Contains;
using testing::TempDir;
using testing::TestTensor;

const LayoutOptions kLayout{.checksum_chunk = 4096, .slot_size = 16384};
constexpr uint32_t kWorld = 2;
constexpr uint64_t kCols = 2048;  // a row of "w" is 8 KiB: two checksum pieces
const std::string kJob = "job";

UniqueFd MemFd(uint64_t size) {
  UniqueFd fd(::memfd_create("load-service-test", MFD_CLOEXEC));
  REQUIRE(fd);
  REQUIRE(::ftruncate(fd.get(), static_cast<off_t>(size)) == 0);
  return fd;
}

std::vector<std::byte> ReadFd(const UniqueFd& fd, uint64_t size) {
  std::vector<std::byte> out(size);
  REQUIRE(::pread(fd.get(), out.data(), size, 0) == static_cast<ssize_t>(size));
  return out;
}

// A float32 box shard of tensor `name` in fd 0 (Registration places it).
pb::TensorSpec BoxSpec(const std::string& name, Shape shape, Shape offsets, Shape lengths) {
  pb::TensorSpec s;
  s.set_name(name);
  s.set_dtype("float32");
  uint64_t numel = 1;
  for (size_t d = 0; d < shape.size(); ++d) {
    s.add_global_shape(shape[d]);
    s.mutable_geometry()->mutable_box()->add_offsets(offsets[d]);
    s.mutable_geometry()->mutable_box()->add_lengths(lengths[d]);
    numel *= lengths[d];
  }
  s.mutable_host()->set_fd_index(0);
  s.mutable_host()->set_offset(0);
  s.mutable_host()->set_length(numel * 4);
  return s;
}

// A rank's registration: the specs over one memfd, which receives what is loaded.
struct Registration {
  std::vector<UniqueFd> fds;
  std::shared_ptr<const CapturePlan> plan;
  uint64_t bytes = 0;

  Registration(MappingCache& cache, std::vector<pb::TensorSpec> specs) {
    for (auto& s : specs) {  // one after the other in the memfd
      s.mutable_host()->set_offset(bytes);
      bytes += s.host().length();
    }
    fds.push_back(MemFd(bytes));
    auto built = BuildCapturePlan(specs, fds, cache, kLayout);
    REQUIRE_OK(built);
    plan = *built;
  }
  std::vector<std::byte> Contents() const { return ReadFd(fds[0], bytes); }
};

struct Fixture {
  TempDir dir;
  std::string root = dir / "root";
  boost::asio::io_context io;
  // Keeps run_one_for waiting for the load threads' answers instead of stopping the loop.
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work =
      boost::asio::make_work_guard(io);
  std::unique_ptr<HostPool> pool;
  std::unique_ptr<HotCache> hot;
  std::unique_ptr<CommitEngine> commit;
  std::unique_ptr<LoadService> loads;
  MappingCache mappings;
  std::map<uint64_t, TestTensor> saved;  // tensor "w" of each step written

  explicit Fixture(uint32_t keep = 0,
                   const std::function<void(LoadService::Config&)>& configure = nullptr) {
    auto p = HostPool::Create(
        HostPool::Config{.size = 64 * 16384, .slot_size = 16384, .lock_memory = false});
    REQUIRE_OK(p);
    pool = std::move(p).value();
    hot = std::make_unique<HotCache>(pool.get());
    commit = std::make_unique<CommitEngine>(CommitEngine::Config{root, keep, "test", {}},
                                            PosixFileSystem());
    LoadService::Config config;
    config.storage_root = root;
    config.threads = 1;
    config.reader.io_threads = 2;
    if (configure) configure(config);
    loads = std::make_unique<LoadService>(io, config, PosixFileSystem(), commit.get(), hot.get());
    loads->Start();
  }
  ~Fixture() { loads->Stop(); }

  // A committed step of `kWorld` ranks: tensor "w" float32 [kWorld, kCols], rank r wrote row r.
  void Save(uint64_t step) {
    std::mt19937_64 rng(step);
    TestTensor t;
    t.name = "w";
    t.shape = {kWorld, kCols};
    t.data = testing::RandomBytes(rng, kWorld * kCols * 4);
    for (uint32_t r = 0; r < kWorld; ++r) {
      auto g = ShardGeometry::Box(t.shape, {r, 0}, {1, kCols});
      REQUIRE_OK(g);
      t.shards.push_back({*g, r});
    }
    testing::NoSyncFileSystem nosync;
    REQUIRE_OK(testing::WriteTestCheckpoint(&nosync, StepDir(root, kJob, step), kJob, step, kWorld,
                                            {t}, kLayout));
    saved[step] = t;
  }
  // The bytes of `w` in [offsets, offsets + lengths) as saved at `step`.
  std::vector<std::byte> Expected(uint64_t step, Shape offsets, Shape lengths) {
    auto g = ShardGeometry::Box(saved.at(step).shape, offsets, lengths);
    REQUIRE_OK(g);
    return testing::ExtractShard(saved.at(step).data, *g, 4);
  }

  LoadService::Request Request(const Registration& reg, uint32_t rank,
                               std::optional<uint64_t> step = std::nullopt) {
    LoadService::Request r;
    r.job = kJob;
    r.step = step;
    r.rank = rank;
    r.plan = reg.plan;
    return r;
  }

  // Load (planned when the config plans), the loop run until it answers.
  Result<LoadService::Outcome> RunLoad(LoadService::Request request) {
    std::optional<Result<LoadService::Outcome>> answer;
    loads->Load(std::move(request), [&](Result<LoadService::Outcome> r) { answer = std::move(r); });
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!answer && std::chrono::steady_clock::now() < deadline) {
      io.run_one_for(std::chrono::milliseconds(50));
    }
    REQUIRE(answer.has_value());
    return std::move(*answer);
  }
};

// A committed step's data file bytes, as a holder in memory would have them.
Status ReadStored(const std::string& root, const std::string& job, uint64_t step,
                  const std::string& file, uint64_t offset, uint64_t length, std::byte* out) {
  UniqueFd fd(::open((StepDir(root, job, step) + "/" + file).c_str(), O_RDONLY));
  if (!fd) return NotFound(file);
  if (::pread(fd.get(), out, length, static_cast<off_t>(offset)) != static_cast<ssize_t>(length)) {
    return OutOfRange(file);
  }
  return Status::Ok();
}

// Daemons' data planes, faked: each address serves the committed step's data files from storage
// (as a holder serves its copy), except the addresses that are down, those that answer their
// first FETCH with NOT_FOUND (a holder lacking that range), and those whose copy has a flipped
// byte. Counts FETCHes per address.
struct FakePeers {
  std::string root;
  std::set<std::string> down;
  std::set<std::string> corrupt;
  std::mutex mu;
  std::set<std::string> lacking_first;
  std::map<std::string, int> fetches;

  class Peer final : public PeerFetch {
   public:
    Peer(FakePeers* peers, std::string address) : peers_(peers), address_(std::move(address)) {}
    Status Fetch(const std::string& job, uint64_t step, const std::string& file, uint64_t offset,
                 uint64_t length, std::byte* out) override {
      {
        std::lock_guard lock(peers_->mu);
        ++peers_->fetches[address_];
        if (peers_->lacking_first.erase(address_) > 0) return NotFound("no " + file + " here");
      }
      if (peers_->down.contains(address_)) return Unavailable("peer " + address_ + " is down");
      RETURN_IF_ERROR(ReadStored(peers_->root, job, step, file, offset, length, out));
      if (peers_->corrupt.contains(address_)) out[length / 2] ^= std::byte{1};
      return Status::Ok();
    }

   private:
    FakePeers* peers_;
    std::string address_;
  };
  int FetchesOf(const std::string& address) {
    std::lock_guard lock(mu);
    return fetches[address];
  }
};

// The plan a coordinator would make for one rank whose file two daemons hold: each range the
// load needs cut in two halves, the first fetched from `a` then `b`, the second from `b` then
// `a` (alternates), or from `only` alone when it is set (a range read from storage for the
// others: no alternates).
pb::LoadPlanResponse TwoSourcePlan(const pb::LoadPlanRequest& ask, const std::string& only,
                                   const std::string& a = "a:1", const std::string& b = "b:1") {
  pb::LoadPlanResponse plan;
  plan.set_ready(true);
  plan.set_round(1);
  for (const auto& need : ask.needs()) {
    const uint64_t half = need.length() / 2;
    for (int part = 0; part < 2; ++part) {
      auto* f = plan.add_fetch();
      f->mutable_range()->set_file(need.file());
      f->mutable_range()->set_offset(need.offset() + (part == 0 ? 0 : half));
      f->mutable_range()->set_length(part == 0 ? half : need.length() - half);
      const std::string first = !only.empty() ? only : part == 0 ? a : b;
      f->set_node_id(first);
      f->set_peer_address(first);
      if (only.empty()) {
        auto* alternate = f->add_alternates();
        alternate->set_node_id(part == 0 ? b : a);
        alternate->set_peer_address(alternate->node_id());
      }
    }
  }
  return plan;
}

TEST_CASE("LoadService: the newest step is read from storage once, a replica's load from memory",
          "[daemon][load_service]") {
  Fixture f;
  f.Save(3);
  f.Save(5);
  Registration rank0(f.mappings, {BoxSpec("w", {kWorld, kCols}, {0, 0}, {1, kCols})});
  // Rank 1 of another data-parallel group holds the same shard.
  Registration replica(f.mappings, {BoxSpec("w", {kWorld, kCols}, {0, 0}, {1, kCols})});

  auto first = f.loads->LoadNow(f.Request(rank0, 0));
  REQUIRE_OK(first);
  CHECK(first->step == 5);
  CHECK(first->bytes_from_storage >= kCols * 4);
  CHECK(first->bytes_from_memory == 0);
  CHECK(first->missing.empty());
  CHECK(first->saved_world_size == kWorld);
  CHECK(first->extra_rank == 0);
  CHECK(first->extra == "extra of rank 0");
  CHECK(rank0.Contents() == f.Expected(5, {0, 0}, {1, kCols}));
  CHECK(f.hot->resident_bytes() >= kCols * 4);

  auto second = f.loads->LoadNow(f.Request(replica, 1));
  REQUIRE_OK(second);
  CHECK(second->step == 5);
  CHECK(second->bytes_from_storage == 0);
  CHECK(second->bytes_from_memory == kCols * 4);
  CHECK(second->extra == "extra of rank 1");
  CHECK(replica.Contents() == f.Expected(5, {0, 0}, {1, kCols}));

  // A named older step is read from storage (the cache holds step 5's bytes, not step 3's).
  auto older = f.loads->LoadNow(f.Request(rank0, 0, 3));
  REQUIRE_OK(older);
  CHECK(older->step == 3);
  CHECK(older->bytes_from_memory == 0);
  CHECK(older->bytes_from_storage >= kCols * 4);
  CHECK(rank0.Contents() == f.Expected(3, {0, 0}, {1, kCols}));
}

TEST_CASE("LoadService: a load in another layout gathers its shard from every stored one",
          "[daemon][load_service]") {
  Fixture f;
  f.Save(1);
  // Saved as rows by 2 ranks; loaded as column halves by 2 ranks (each spans both files).
  Registration left(f.mappings, {BoxSpec("w", {kWorld, kCols}, {0, 0}, {kWorld, kCols / 2})});
  Registration right(f.mappings,
                     {BoxSpec("w", {kWorld, kCols}, {0, kCols / 2}, {kWorld, kCols / 2})});
  auto l = f.loads->LoadNow(f.Request(left, 0));
  REQUIRE_OK(l);
  auto r = f.loads->LoadNow(f.Request(right, 1));
  REQUIRE_OK(r);
  CHECK(left.Contents() == f.Expected(1, {0, 0}, {kWorld, kCols / 2}));
  CHECK(right.Contents() == f.Expected(1, {0, kCols / 2}, {kWorld, kCols / 2}));
  // Each half is one checksum piece of each file: neither load touched the other's bytes.
  CHECK(l->bytes_from_storage >= kWorld * kCols * 2);
  CHECK(r->bytes_from_storage >= kWorld * kCols * 2);
  CHECK(l->bytes_from_memory + r->bytes_from_memory == 0);
  // Everything is resident now: a load of the whole tensor reads nothing from storage.
  Registration whole(f.mappings, {BoxSpec("w", {kWorld, kCols}, {0, 0}, {kWorld, kCols})});
  auto w = f.loads->LoadNow(f.Request(whole, 0));
  REQUIRE_OK(w);
  CHECK(w->bytes_from_storage == 0);
  CHECK(w->bytes_from_memory == kWorld * kCols * 4);
  CHECK(whole.Contents() == f.saved.at(1).data);
}

TEST_CASE("LoadService: a rank the saved job did not have gets the blob of rank mod world size",
          "[daemon][load_service]") {
  Fixture f;
  f.Save(2);
  Registration reg(f.mappings, {BoxSpec("w", {kWorld, kCols}, {1, 0}, {1, kCols})});
  auto out = f.loads->LoadNow(f.Request(reg, 3));
  REQUIRE_OK(out);
  CHECK(out->saved_world_size == kWorld);
  CHECK(out->extra_rank == 1);
  CHECK(out->extra == "extra of rank 1");
  CHECK(reg.Contents() == f.Expected(2, {1, 0}, {1, kCols}));
}

TEST_CASE("LoadService: errors name what is missing and leave the memory alone",
          "[daemon][load_service]") {
  Fixture f;
  Registration reg(f.mappings, {BoxSpec("w", {kWorld, kCols}, {0, 0}, {1, kCols})});
  const std::vector<std::byte> untouched = reg.Contents();

  SECTION("no committed step") {
    auto r = f.loads->LoadNow(f.Request(reg, 0));
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kNotFound);
    CHECK_THAT(r.status().message(), Contains("has no committed checkpoint"));
  }
  SECTION("a named step that is not committed") {
    f.Save(4);
    REQUIRE(std::filesystem::remove(StepDir(f.root, kJob, 4) + "/MANIFEST"));
    auto r = f.loads->LoadNow(f.Request(reg, 0, 4));
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kNotFound);
    CHECK_THAT(r.status().message(), Contains("step 4"));
    CHECK_THAT(r.status().message(), Contains("not committed"));
  }
  SECTION("a step that does not exist at all") {
    f.Save(4);
    auto r = f.loads->LoadNow(f.Request(reg, 0, 5));
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kNotFound);
    CHECK_THAT(r.status().message(), Contains("step 5"));
  }
  SECTION("nothing registered") {
    f.Save(4);
    LoadService::Request req = f.Request(reg, 0);
    req.plan = nullptr;
    auto r = f.loads->LoadNow(req);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kFailedPrecondition);
  }
  SECTION("a registered tensor the step does not hold, strict") {
    f.Save(4);
    Registration extra(f.mappings, {BoxSpec("w", {kWorld, kCols}, {0, 0}, {1, kCols}),
                                    BoxSpec("optimizer.m", {8}, {0}, {8})});
    auto r = f.loads->LoadNow(f.Request(extra, 0));
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kNotFound);
    CHECK_THAT(r.status().message(), Contains("'optimizer.m'"));
    CHECK(ReadFd(extra.fds[0], kCols * 4) == std::vector<std::byte>(kCols * 4));
  }
  SECTION("a registered shape that differs from the stored one") {
    f.Save(4);
    Registration wrong(f.mappings, {BoxSpec("w", {kWorld, kCols * 2}, {0, 0}, {1, kCols})});
    auto r = f.loads->LoadNow(f.Request(wrong, 0));
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kInvalidArgument);
    CHECK_THAT(r.status().message(), Contains("'w'"));
  }
  CHECK(reg.Contents() == untouched);
}

TEST_CASE("LoadService: a non-strict load fills what the step holds and lists the rest",
          "[daemon][load_service]") {
  Fixture f;
  f.Save(4);
  Registration reg(f.mappings, {BoxSpec("w", {kWorld, kCols}, {1, 0}, {1, kCols}),
                                BoxSpec("optimizer.m", {8}, {0}, {8})});
  LoadService::Request req = f.Request(reg, 1);
  req.strict = false;
  auto r = f.loads->LoadNow(req);
  REQUIRE_OK(r);
  CHECK(r->missing == std::vector<std::string>{"optimizer.m"});
  std::vector<std::byte> expected = f.Expected(4, {1, 0}, {1, kCols});
  expected.resize(expected.size() + 8 * 4);  // the missing tensor's memory stays zero
  CHECK(reg.Contents() == expected);
}

TEST_CASE("LoadService: Load runs off the loop, answers on it, and its pins end with it",
          "[daemon][load_service]") {
  Fixture f(/*keep=*/1);
  f.Save(1);
  Registration reg(f.mappings, {BoxSpec("w", {kWorld, kCols}, {0, 0}, {1, kCols})});
  std::optional<Result<LoadService::Outcome>> answer;
  f.loads->Load(f.Request(reg, 0), [&](Result<LoadService::Outcome> r) { answer = std::move(r); });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!answer && std::chrono::steady_clock::now() < deadline) {
    f.io.run_one_for(std::chrono::milliseconds(50));
  }
  REQUIRE(answer.has_value());
  REQUIRE_OK(*answer);
  CHECK((*answer)->step == 1);
  CHECK(reg.Contents() == f.Expected(1, {0, 0}, {1, kCols}));

  // The load unpinned step 1: retention (keep 1) removes it once step 2 commits.
  testing::NoSyncFileSystem nosync;
  auto m = testing::WriteTestCheckpoint(&nosync, StepDir(f.root, kJob, 2), kJob, 2, kWorld,
                                        {f.saved.at(1)}, kLayout);
  REQUIRE_OK(m);
  REQUIRE(std::filesystem::remove(StepDir(f.root, kJob, 2) + "/MANIFEST"));
  pb::NodeManifest node;  // one node held both ranks
  node.set_format_version(m->format_version());
  node.set_job(kJob);
  node.set_step(2);
  node.set_world_size(kWorld);
  node.set_node_id("n");
  *node.mutable_tensors() = m->tensors();
  *node.mutable_ranks() = m->ranks();
  REQUIRE_OK(f.commit->Commit(std::span(&node, 1)));
  CHECK(*f.commit->List(kJob) == std::vector<uint64_t>{2});
}

TEST_CASE(
    "LoadService: what a failed peer did not deliver comes from the range's other holders, and "
    "only what no source delivered from storage",
    "[daemon][load_service]") {
  FakePeers peers;
  std::string only;            // the plan's single source, when set
  std::string first = "a:1";   // the source of the first half, the second's alternate
  bool bad_held_copy = false;  // this node holds a copy of every range, with a flipped byte
  auto configure = [&](LoadService::Config& c) {
    c.read_held_copy = [&](const std::string& job, uint64_t step, const std::string& file,
                           uint64_t offset, uint64_t length, std::byte* out) {
      if (!bad_held_copy || !ReadStored(peers.root, job, step, file, offset, length, out).ok()) {
        return false;
      }
      out[0] ^= std::byte{0x80};
      return true;
    };
    c.node_id = "n0";
    c.peer_address = [] { return std::string("n0:1"); };
    c.plan_load = [&](pb::LoadPlanRequest ask, CoordinatorPort::PlanLoadDone done) {
      done(TwoSourcePlan(ask, only, first));
    };
    c.connect_peer = [&](const std::string& address) -> std::unique_ptr<PeerFetch> {
      return std::make_unique<FakePeers::Peer>(&peers, address);
    };
  };
  Fixture f(0, configure);
  peers.root = f.root;
  f.Save(1);
  Registration reg(f.mappings, {BoxSpec("w", {kWorld, kCols}, {0, 0}, {1, kCols})});
  auto request = f.Request(reg, 0, 1);
  request.world_size = 1;
  const uint64_t bytes = kCols * 4;
  // A load that no peer served: bit-exact, from storage.
  auto from_storage_only = [&](const Result<LoadService::Outcome>& out) {
    REQUIRE_OK(out);
    CHECK(reg.Contents() == f.Expected(1, {0, 0}, {1, kCols}));
    CHECK(out->bytes_from_peers == 0);
    CHECK(out->bytes_from_storage >= bytes);
  };

  SECTION("a holder down: its half comes from the other, once asked") {
    peers.down = {"a:1"};
    auto out = f.RunLoad(request);
    REQUIRE_OK(out);
    CHECK(reg.Contents() == f.Expected(1, {0, 0}, {1, kCols}));
    CHECK(out->bytes_from_storage == 0);
    CHECK(out->bytes_from_peers == bytes);
    CHECK(peers.FetchesOf("a:1") == 1);  // failed once, not asked again by this load
    CHECK(peers.FetchesOf("b:1") == 2);  // its own half, then a's
  }
  SECTION("a holder lacking a range passes on just that range and serves the others") {
    // a:1 answers NOT_FOUND for the first half, which goes to b:1; b:1 is down, so its half
    // goes to a:1, which still serves it. The first half has no source left: storage.
    peers.lacking_first = {"a:1"};
    peers.down = {"b:1"};
    auto out = f.RunLoad(request);
    REQUIRE_OK(out);
    CHECK(reg.Contents() == f.Expected(1, {0, 0}, {1, kCols}));
    CHECK(out->bytes_from_peers == bytes / 2);
    CHECK(out->bytes_from_storage >= bytes / 2);
    CHECK(peers.FetchesOf("a:1") == 2);
    CHECK(peers.FetchesOf("b:1") == 1);
  }
  SECTION("a holder serving bad bytes: its half comes from the other, never from storage") {
    peers.corrupt = {"a:1"};
    auto out = f.RunLoad(request);
    REQUIRE_OK(out);
    CHECK(reg.Contents() == f.Expected(1, {0, 0}, {1, kCols}));
    CHECK(out->bytes_from_storage == 0);
    CHECK(out->bytes_from_peers == bytes);
    CHECK(peers.FetchesOf("a:1") == 1);
    CHECK(peers.FetchesOf("b:1") == 2);
  }
  SECTION("a bad copy held here is fetched from the plan's holder instead") {
    bad_held_copy = true;
    auto out = f.RunLoad(request);
    REQUIRE_OK(out);
    CHECK(reg.Contents() == f.Expected(1, {0, 0}, {1, kCols}));
    CHECK(out->bytes_from_storage == 0);
    CHECK(out->bytes_from_peers == bytes);
    CHECK(peers.FetchesOf("a:1") == 1);
    CHECK(peers.FetchesOf("b:1") == 1);
  }
  SECTION("a bad copy held here, of a range the plan names this node for: the next holder's") {
    // Its own data plane would serve the same copy: not asked.
    first = "n0:1";
    bad_held_copy = true;
    auto out = f.RunLoad(request);
    REQUIRE_OK(out);
    CHECK(reg.Contents() == f.Expected(1, {0, 0}, {1, kCols}));
    CHECK(out->bytes_from_storage == 0);
    CHECK(out->bytes_from_peers == bytes);
    CHECK(peers.FetchesOf("n0:1") == 0);
    CHECK(peers.FetchesOf("b:1") == 2);
  }
  SECTION("both down: storage, after each was asked once") {
    peers.down = {"a:1", "b:1"};
    from_storage_only(f.RunLoad(request));
    CHECK(peers.FetchesOf("a:1") == 1);
    CHECK(peers.FetchesOf("b:1") == 1);
  }
  SECTION("a range read for the others has no alternates: storage when its reader fails") {
    only = "a:1";
    peers.down = {"a:1"};
    from_storage_only(f.RunLoad(request));
    CHECK(peers.FetchesOf("a:1") == 1);
  }
}

}  // namespace
}  // namespace ckpt
