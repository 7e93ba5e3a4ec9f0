// The peer-memory tier's replication on real processes (daemon/peer/replicator.h,
// daemon/coordinator/holder_registry.h): one ckpt-coordinator and three ckptd with a data plane,
// a peer pool and --replicas 1, one rank each. The coordinator gives every node a holder; each
// rank persisted is copied into its holder's memory, and the step is decided replicated. What a
// holder keeps is the rank's data file byte for byte: with the file gone from storage, the holder
// still serves it. A daemon asking for more holders than there are other nodes hears why its
// steps are not replicated.
#include "tests/integration/coordinator_harness.h"  // first: it configures Catch

#include "daemon/peer/peer_client.h"
#include "tests/integration/admin_client.h"
#include "tests/integration/http_scrape.h"

#include <filesystem>
#include <future>
#include <set>
#include <thread>

namespace ckpt::itest {
namespace {

constexpr uint32_t kTensors = 12;
constexpr int kNodes = 3;
const std::string kJob = "replicas";

std::vector<std::string> TierFlags(const std::string& replicas) {
  return {"--peer-listen", "127.0.0.1:0", "--peer-pool", "64MiB",
          "--host-pool",   "96MiB",       "--replicas",  replicas};
}

ckptd::v1::GetStatusResponse StatusOf(const DaemonProcess& d) {
  auto admin = ckptd::v1::Admin::NewStub(
      grpc::CreateChannel("unix:" + d.admin_socket(), grpc::InsecureChannelCredentials()));
  return GetStatus(*admin);
}

double Metric(const DaemonProcess& d, const std::string& series) {
  const std::string address = ConfigValue(StatusOf(d), "metrics-bound");
  return std::max(0.0, Sample(HttpGet(address, "/metrics"), series));
}

// Until every node heard its holders from the coordinator (they are planned as nodes register).
void WaitForHolders(const std::vector<std::unique_ptr<DaemonProcess>>& nodes, int each) {
  for (const auto& n : nodes) {
    REQUIRE(PollUntil([&] { return StatusOf(*n).peer().holders_size() == each; }));
  }
}

// A coordinator and `count` daemons with --replicas `replicas`, each having heard `holders`
// holders, and one rank of the model per daemon (tensor parallel `tp`).
struct Tier {
  Tier(int count, const std::string& replicas, int holders, uint32_t tp = 1,
       std::vector<std::string> coordinator_flags = {})
      : coordinator({dir / "coordinator.sock",
                     root,
                     dir / "coordinator.log",
                     std::move(coordinator_flags),
                     {}}),
        nodes(StartNodes(dir, root, coordinator.address(), count, TierFlags(replicas))) {
    WaitForHolders(nodes, holders);
    for (int i = 0; i < count; ++i) {
      ranks.push_back(std::make_unique<ModelRank>(nodes[i]->socket(), kJob, i,
                                                  static_cast<uint32_t>(count), tp, kTensors));
    }
  }
  testing::TempDir dir;
  std::string root = dir / "root";
  CoordinatorProcess coordinator;
  std::vector<std::unique_ptr<DaemonProcess>> nodes;
  std::vector<std::unique_ptr<ModelRank>> ranks;
};

TEST_CASE("peer tier: every rank lands in its holder's memory and the step is replicated",
          "[peer_tier]") {
  Tier t(kNodes, "1", 1);
  auto& nodes = t.nodes;
  auto& ranks = t.ranks;
  const std::string& root = t.root;

  // Each node has one holder, never itself. (Which one depends on the order the nodes
  // registered in: a holder plan keeps its holders as nodes join, holder_plan.h.)
  std::map<std::string, std::string> holder_of;
  std::map<std::string, std::string> address_of;
  for (const auto& n : nodes) {
    const auto s = StatusOf(*n);
    CHECK(s.peer().replicas() == 1);
    CHECK(s.peer().pool_bytes() == 64ull << 20);
    REQUIRE(s.peer().holders_size() == 1);
    CHECK(s.peer().holders(0) != s.node_id());
    holder_of[s.node_id()] = s.peer().holders(0);
    address_of[s.peer().holders(0)] = s.peer().holder_addresses(0);
  }
  std::set<std::string> holders;
  for (const auto& [node, h] : holder_of) holders.insert(h);
  CHECK(holders.size() >= 2);
  // ckptctl status shows it too.
  auto [rc, out] = RunCkptctl(t.dir, {"--admin", "unix:" + nodes[0]->admin_socket(), "status"});
  CHECK(rc == 0);
  CHECK_THAT(out, Catch::Contains("peer pool 64.0 MiB: holds") &&
                      Catch::Contains("replicas 1; held by " + holder_of["n0"] + " (" +
                                      address_of[holder_of["n0"]] + ")"));

  for (auto& r : ranks) REQUIRE_OK(r->SaveStep(1));
  for (auto& r : ranks) {
    REQUIRE_OK(r->client().Wait(1, WaitState::kReplicated, std::chrono::seconds(60)));
    REQUIRE_OK(r->WaitCommitted(1));
  }

  // Each holder holds the written part of the data file of the node it holds for: every shard
  // (the gaps between slots, zeros in the file, are not sent).
  uint64_t held = 0;
  for (const auto& n : nodes) held += StatusOf(*n).peer().held_bytes();
  uint64_t shard_bytes = 0;
  for (const auto& [node, bytes] : NodeBytes(root, kJob, 1)) shard_bytes += bytes;
  CHECK(held >= shard_bytes);
  CHECK(held <= DataFileBytes(root, kJob, 1));

  // The holder's copy is the file's bytes: read each shard, delete the file, fetch the shard
  // from the holder.
  for (int i = 0; i < kNodes; ++i) {
    const std::string node = "n" + std::to_string(i);
    const std::string dir_path = StepDir(root, kJob, 1);
    auto manifest =
        ReadNodeManifest(PosixFileSystem(), JoinPath(dir_path, "node-" + node + ".nmf"));
    REQUIRE_OK(manifest);
    const std::string file = DataFileName(static_cast<uint32_t>(i));
    const std::string on_disk = ReadWholeFile(JoinPath(dir_path, file));
    REQUIRE(!on_disk.empty());
    std::filesystem::remove(JoinPath(dir_path, file));
    peer::PeerClient client({address_of[holder_of[node]], std::chrono::seconds(20), 1 << 20});
    int fetched_shards = 0;
    for (const auto& t : manifest->tensors()) {
      for (const auto& sh : t.shards()) {
        if (sh.file() != file || sh.length() == 0) continue;
        std::string fetched(sh.length(), '\0');
        REQUIRE_OK(client.Fetch({kJob, 1, file, sh.offset(), sh.length()},
                                reinterpret_cast<std::byte*>(fetched.data())));
        CHECK(fetched == on_disk.substr(sh.offset(), sh.length()));
        ++fetched_shards;
      }
    }
    CHECK(fetched_shards > 0);
  }
}

TEST_CASE(
    "peer tier: a node asking for more holders than exist is told its step is not "
    "replicated, and why",
    "[peer_tier]") {
  Tier t(2, "2", 1);  // one other node: one of the two holders asked for
  auto& ranks = t.ranks;
  for (auto& r : ranks) REQUIRE_OK(r->SaveStep(1));
  for (auto& r : ranks) {
    REQUIRE_OK(r->WaitCommitted(1));  // the checkpoint itself is unharmed
    const Status st = r->client().Wait(1, WaitState::kReplicated, std::chrono::seconds(60));
    INFO(st.ToString());
    CHECK(st.code() == StatusCode::kFailedPrecondition);
    CHECK_THAT(st.message(), Catch::Contains("not replicated") && Catch::Contains("1 of the 2"));
  }
}

TEST_CASE("peer tier: a holder keeps each node's newest two steps, not every step", "[peer_tier]") {
  Tier t(2, "1", 1, /*tp=*/2);
  auto& nodes = t.nodes;
  auto& ranks = t.ranks;
  auto held = [&] {
    uint64_t sum = 0;
    for (const auto& n : nodes) sum += StatusOf(*n).peer().held_bytes();
    return sum;
  };
  std::vector<uint64_t> held_after;
  for (uint64_t step = 1; step <= 5; ++step) {
    for (auto& r : ranks) REQUIRE_OK(r->SaveStep(step));
    for (auto& r : ranks) {
      REQUIRE_OK(r->client().Wait(step, WaitState::kReplicated, std::chrono::seconds(60)));
    }
    held_after.push_back(held());
  }
  // Step 1 is written whole (before the writer plan); from step 2 on each step holds the same
  // bytes. Once three steps were replicated, the holders keep two: the total stops growing.
  INFO("held after each step: " << held_after[0] << " " << held_after[1] << " " << held_after[2]
                                << " " << held_after[3] << " " << held_after[4]);
  const uint64_t one_step = held_after[1] - held_after[0];
  CHECK(one_step > 0);
  CHECK(held_after[2] == 2 * one_step);
  CHECK(held_after[3] == 2 * one_step);
  CHECK(held_after[4] == 2 * one_step);
}

TEST_CASE("peer tier: a replacement node restores a lost node's ranks from memory, not storage",
          "[peer_tier]") {
  // Data parallel 3: each rank needs every tensor, written once across the three data files.
  Tier t(kNodes, "1", 1);
  auto& nodes = t.nodes;
  auto& ranks = t.ranks;
  for (uint64_t step = 1; step <= 2; ++step) {
    for (auto& r : ranks) REQUIRE_OK(r->SaveStep(step));
    for (auto& r : ranks) {
      REQUIRE_OK(r->WaitCommitted(step));
      REQUIRE_OK(r->client().Wait(step, WaitState::kReplicated, std::chrono::seconds(60)));
    }
  }

  // Node n0 dies with its memory; a fresh daemon with another node id takes its rank.
  ranks[0].reset();
  nodes[0]->Kill(SIGKILL);
  DaemonProcess::Options o;
  o.socket = t.dir / "n3.sock";
  o.storage_root = t.root;
  o.log_path = t.dir / "n3.log";
  o.flags = {"--node-id", "n3", "--coordinator", t.coordinator.address()};
  for (const auto& f : TierFlags("1")) o.flags.push_back(f);
  auto replacement = std::make_unique<DaemonProcess>(o);
  ranks[0] = std::make_unique<ModelRank>(replacement->socket(), kJob, 0, kNodes, 1, kTensors);

  // The whole job restarts from step 2: the survivors hold their own files, n0's file is on
  // its holder, and what each rank lacks is fetched from those daemons.
  std::vector<std::future<Result<uint64_t>>> loads;
  for (auto& r : ranks) {
    loads.push_back(std::async(std::launch::async, [&r] { return r->LoadAndCheck(2); }));
  }
  for (auto& l : loads) {
    auto mismatches = l.get();
    REQUIRE_OK(mismatches);
    CHECK(*mismatches == 0);
  }
  const std::vector<const DaemonProcess*> live = {replacement.get(), nodes[1].get(),
                                                  nodes[2].get()};
  double from_storage = 0;
  for (const DaemonProcess* d : live) {
    from_storage += Metric(*d, "ckptd_read_bytes_total{source=\"storage\"}");
  }
  INFO("data bytes the three daemons read from storage: " << from_storage);
  CHECK(from_storage == 0);
  // The replacement held nothing and saved nothing: everything it received, it fetched.
  CHECK(Metric(*replacement, "ckptd_peer_bytes_total{direction=\"received\"}") > 0);
}

TEST_CASE(
    "peer tier: a memory-only step is never written, restores on a replacement node from peers' "
    "memory, and latest() falls back to the persisted step once its copies are gone",
    "[peer_tier]") {
  constexpr int kFour = 4;
  Tier t(kFour, "1", 1);
  auto& nodes = t.nodes;
  auto& ranks = t.ranks;
  // Step 1 persisted, step 2 memory-only.
  for (auto& r : ranks) REQUIRE_OK(r->SaveStep(1));
  for (auto& r : ranks) REQUIRE_OK(r->WaitCommitted(1));
  for (auto& r : ranks) REQUIRE_OK(r->SaveStep(2, /*persist=*/false));
  for (auto& r : ranks) {
    REQUIRE_OK(r->client().Wait(2, WaitState::kReplicated, std::chrono::seconds(60)));
    const Status committed = r->client().Wait(2, WaitState::kCommitted, std::chrono::seconds(5));
    CHECK(committed.code() == StatusCode::kFailedPrecondition);
    CHECK_THAT(committed.message(), Catch::Contains("memory-only"));
  }
  // Nothing of step 2 on storage: no directory, no MANIFEST, no data file.
  CHECK_FALSE(std::filesystem::exists(StepDir(t.root, kJob, 2)));
  {
    // The coordinator describes it, with where each rank's copies live: its node and holder.
    auto [rc, out] = RunCkptctl(t.dir, {"--admin", t.coordinator.address(), "describe", kJob, "2"});
    CHECK(rc == 0);
    INFO(out);
    CHECK_THAT(out, Catch::Contains("memory-only: not on storage"));
    for (int r = 0; r < kFour; ++r) {
      CHECK_THAT(out, Catch::Contains("rank " + std::to_string(r) + " in memory on n" +
                                      std::to_string(r) + ", n"));
    }
  }
  {
    auto latest = ranks[1]->client().Latest();
    REQUIRE_OK(latest);
    CHECK(*latest == std::optional<uint64_t>(2));
  }

  // Node n0 dies with its memory; a fresh daemon with another node id takes its rank, and the
  // whole job restarts from its restore point: step 2, from the survivors' memory and n0's
  // holder, with nothing read from storage.
  ranks[0].reset();
  nodes[0]->Kill(SIGKILL);
  DaemonProcess::Options o;
  o.socket = t.dir / "n4.sock";
  o.storage_root = t.root;
  o.log_path = t.dir / "n4.log";
  o.flags = {"--node-id", "n4", "--coordinator", t.coordinator.address()};
  for (const auto& f : TierFlags("1")) o.flags.push_back(f);
  auto replacement = std::make_unique<DaemonProcess>(o);
  ranks[0] = std::make_unique<ModelRank>(replacement->socket(), kJob, 0, kFour, 1, kTensors);
  {
    // The lost node's copies go when the coordinator sees its stream end; its rank stays
    // restorable from its holder.
    auto point = ranks[0]->client().RestorePoint();
    REQUIRE_OK(point);
    CHECK(*point == std::optional<uint64_t>(2));
  }
  std::vector<std::future<Result<uint64_t>>> loads;
  for (auto& r : ranks) {
    loads.push_back(std::async(std::launch::async, [&r] { return r->LoadAndCheck(2); }));
  }
  for (auto& l : loads) {
    auto mismatches = l.get();
    REQUIRE_OK(mismatches);
    CHECK(*mismatches == 0);
  }
  double from_storage = Metric(*replacement, "ckptd_read_bytes_total{source=\"storage\"}");
  for (int i = 1; i < kFour; ++i) {
    from_storage += Metric(*nodes[i], "ckptd_read_bytes_total{source=\"storage\"}");
  }
  CHECK(from_storage == 0);
  CHECK(Metric(*replacement, "ckptd_peer_bytes_total{direction=\"received\"}") > 0);

  // Every original daemon dies: no live daemon holds step 2 any more (the replacement only
  // loaded it), so the job's newest restorable step is the persisted one, and it loads.
  for (int i = 1; i < kFour; ++i) {
    ranks[static_cast<size_t>(i)].reset();
    nodes[static_cast<size_t>(i)]->Kill(SIGKILL);
  }
  REQUIRE(PollUntil([&] {
    auto latest = ranks[0]->client().Latest();
    return latest.ok() && *latest == std::optional<uint64_t>(1);
  }));
  auto mismatches = ranks[0]->LoadAndCheck(1);
  REQUIRE_OK(mismatches);
  CHECK(*mismatches == 0);
}

// The nodes the coordinator counts as holding rank `rank` of a memory-only step in memory now.
std::vector<std::string> CopiesOf(const CoordinatorProcess& coordinator, uint64_t step,
                                  uint32_t rank) {
  auto admin = ckptd::v1::Admin::NewStub(
      grpc::CreateChannel(coordinator.address(), grpc::InsecureChannelCredentials()));
  ckptd::v1::DescribeCheckpointRequest request;
  request.set_job(kJob);
  request.set_step(step);
  ckptd::v1::DescribeCheckpointResponse reply;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  if (!admin->DescribeCheckpoint(&ctx, request, &reply).ok()) return {};
  for (const auto& c : reply.copies()) {
    if (c.rank() == rank) return {c.nodes().begin(), c.nodes().end()};
  }
  return {};
}

// Whether the coordinator has node `id`'s event stream open.
bool Connected(const CoordinatorProcess& coordinator, const std::string& id) {
  auto admin = ckptd::v1::Admin::NewStub(
      grpc::CreateChannel(coordinator.address(), grpc::InsecureChannelCredentials()));
  const auto status = GetStatus(*admin);
  for (const auto& n : status.nodes()) {
    if (n.node_id() == id) return n.connected();
  }
  return false;
}

bool Has(const std::vector<std::string>& v, const std::string& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

TEST_CASE(
    "peer tier: a daemon frozen for 10 s stops counting as a copy within 5 s, and when it wakes "
    "it either rejoins (within the lease) or stays fenced from what it held (after it)",
    "[peer_tier]") {
  // Within the lease (30 s) the woken node is the same node again; after it (3 s) the coordinator
  // declared it lost, and what it held before no longer counts, though its process kept it.
  const bool fenced = GENERATE(false, true);
  Tier t(3, "1", 1, 1, {"--lease", fenced ? "3s" : "30s"});
  auto& nodes = t.nodes;
  auto& ranks = t.ranks;
  for (auto& r : ranks) REQUIRE_OK(r->SaveStep(1));
  for (auto& r : ranks) REQUIRE_OK(r->WaitCommitted(1));
  for (auto& r : ranks) REQUIRE_OK(r->SaveStep(2, /*persist=*/false));
  for (auto& r : ranks) {
    REQUIRE_OK(r->client().Wait(2, WaitState::kReplicated, std::chrono::seconds(60)));
  }
  const auto before = CopiesOf(t.coordinator, 2, 1);
  REQUIRE(Has(before, "n1"));
  REQUIRE(before.size() == 2);  // its node and its holder

  // SIGSTOP: the process lives and holds its memory, but answers nothing (not even the
  // coordinator's keepalive pings). The coordinator stops counting it within 5 s.
  const auto frozen_at = std::chrono::steady_clock::now();
  nodes[1]->Kill(SIGSTOP);
  REQUIRE(PollUntil([&] { return !Has(CopiesOf(t.coordinator, 2, 1), "n1"); },
                    std::chrono::seconds(20)));
  const auto noticed = std::chrono::steady_clock::now() - frozen_at;
  INFO("noticed after " << std::chrono::duration<double>(noticed).count() << " s");
  CHECK(noticed < std::chrono::seconds(5));
  {
    // Every rank still has a live copy (rank 1 on its holder): step 2 stays restorable.
    auto latest = ranks[0]->client().Latest();
    REQUIRE_OK(latest);
    CHECK(*latest == std::optional<uint64_t>(2));
  }

  // Woken up late: after 10 s frozen (the scenario's length, not a synchronisation).
  std::this_thread::sleep_until(frozen_at + std::chrono::seconds(10));
  nodes[1]->Kill(SIGCONT);

  // It reconnects by itself. Within its lease it is the same node again, holding what it held;
  // after it, the coordinator declared it lost (its steps in flight ended, its copies forgotten)
  // and what it held before does not count again, though its process kept it: fenced.
  REQUIRE(PollUntil([&] { return Connected(t.coordinator, "n1"); }, std::chrono::seconds(60)));
  const auto after = CopiesOf(t.coordinator, 2, 1);
  const bool lost = t.coordinator.Log().find("node 'n1' lost") != std::string::npos;
  CHECK(lost == fenced);
  CHECK(Has(after, "n1") == !fenced);
  CHECK(after.size() == (fenced ? 1u : 2u));

  // Its rank trains on: once every node has its holder again (a node that was lost is planned
  // afresh), a persisted step 3 on every rank commits and is replicated, and restores
  // bit-exactly on every rank.
  WaitForHolders(nodes, 1);
  for (auto& r : ranks) REQUIRE_OK(r->SaveStep(3));
  for (auto& r : ranks) {
    REQUIRE_OK(r->WaitCommitted(3));
    REQUIRE_OK(r->client().Wait(3, WaitState::kReplicated, std::chrono::seconds(60)));
  }
  std::vector<std::future<Result<uint64_t>>> loads;
  for (auto& r : ranks) {
    loads.push_back(std::async(std::launch::async, [&r] { return r->LoadAndCheck(3); }));
  }
  for (auto& l : loads) {
    auto mismatches = l.get();
    REQUIRE_OK(mismatches);
    CHECK(*mismatches == 0);
  }
}

}  // namespace
}  // namespace ckpt::itest
