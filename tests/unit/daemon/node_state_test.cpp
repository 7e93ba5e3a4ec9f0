// NodeState (daemon/node_state.h) driven in process through its public interface, on a real
// io_context with the daemon's real pieces (HostPool, HotCache, FlushEngine, CaptureEngine,
// TaskPool, CommitEngine) and the embedded coordinator (InProcessCoordinator), trainer memory
// in memfds: a save committed end to end (files, MANIFEST, LATEST, bytes), a rank whose session
// closes before its capture aborts the step and its directory is removed, Abandon before and
// after a capture, a save of a step not newer than a committed one refused (also a step
// committed by an earlier daemon), max_steps_in_flight deferring a newer capture, and Drain
// running `idle` once nothing is in flight. A write held by the fault filesystem
// (StallWriteNumber) keeps a captured step from persisting, so "in flight" is a state the test
// controls, not a race. The loop runs until a callback fires or a deadline fails the test.
#include "daemon/node_state.h"

#include <sys/mman.h>
#include <unistd.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/checkpoint_reader.h"
#include "common/fault_file_system.h"
#include "common/manifest_io.h"
#include "common/step_layout.h"
#include "daemon/capture_engine.h"
#include "daemon/coordinator/in_process_coordinator.h"
#include "daemon/flush_engine.h"
#include "tests/checkpoint_builder.h"
#include "tests/test_util.h"

namespace ckpt {
namespace {

namespace pb = ckptd::v1;
using Catch::Matchers::Contains;
using testing::TempDir;

const LayoutOptions kLayout{.checksum_chunk = 4096, .slot_size = 16384};
constexpr uint64_t kCols = 1024;  // a rank's row of "w": 4 KiB
const std::string kJob = "job";
const std::string kNode = "node-a";

// Counts RemoveAll calls per path (the step directories the daemon and its coordinator remove).
class RemovalCountingFileSystem : public testing::NoSyncFileSystem {
 public:
  Status RemoveAll(const std::string& path) override {
    Status st = NoSyncFileSystem::RemoveAll(path);
    std::lock_guard lock(mu_);
    ++removed_[path];
    return st;
  }
  int removals(const std::string& path) const {
    std::lock_guard lock(mu_);
    auto it = removed_.find(path);
    return it == removed_.end() ? 0 : it->second;
  }

 private:
  mutable std::mutex mu_;
  std::map<std::string, int> removed_;
};

// A rank's registered memory: row `rank` of float32 "w" [world, kCols], in a memfd filled with
// a pattern of `seed`.
struct RankMemory {
  UniqueFd fd;
  std::shared_ptr<const CapturePlan> plan;
  std::vector<std::byte> bytes;

  RankMemory(MappingCache& cache, uint32_t rank, uint32_t world, uint8_t seed) {
    fd = UniqueFd(::memfd_create("node-state-test", MFD_CLOEXEC));
    REQUIRE(fd);
    bytes.resize(kCols * 4);
    for (size_t i = 0; i < bytes.size(); ++i) {
      bytes[i] = static_cast<std::byte>((i * 31 + seed + rank * 7) & 0xff);
    }
    REQUIRE(::pwrite(fd.get(), bytes.data(), bytes.size(), 0) ==
            static_cast<ssize_t>(bytes.size()));
    pb::TensorSpec s;
    s.set_name("w");
    s.set_dtype("float32");
    s.add_global_shape(world);
    s.add_global_shape(kCols);
    auto* box = s.mutable_geometry()->mutable_box();
    box->add_offsets(rank);
    box->add_offsets(0);
    box->add_lengths(1);
    box->add_lengths(kCols);
    s.mutable_host()->set_fd_index(0);
    s.mutable_host()->set_offset(0);
    s.mutable_host()->set_length(bytes.size());
    std::vector<UniqueFd> fds;
    fds.push_back(UniqueFd(::dup(fd.get())));
    auto built = BuildCapturePlan(std::span(&s, 1), fds, cache, kLayout);
    REQUIRE_OK(built);
    plan = *built;
  }
};

// The daemon's core as daemon/main.cc wires it, single node, embedded coordinator.
struct Daemon {
  std::string root;
  boost::asio::io_context io;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work =
      boost::asio::make_work_guard(io);
  RemovalCountingFileSystem base;
  FaultInjectingFileSystem faults{&base};
  std::unique_ptr<HostPool> pool;
  std::unique_ptr<CommitEngine> commit;
  std::unique_ptr<TaskPool> storage;
  std::unique_ptr<HotCache> hot;
  std::unique_ptr<FlushEngine> flush;
  std::unique_ptr<CaptureEngine> capture;
  std::unique_ptr<InProcessCoordinator> coordinator;
  std::unique_ptr<NodeState> node;
  MappingCache mappings;
  uint64_t next_session = 1;

  explicit Daemon(std::string storage_root, uint32_t max_steps_in_flight = 32)
      : root(std::move(storage_root)) {
    auto p = HostPool::Create(
        HostPool::Config{.size = 32 * 16384, .slot_size = 16384, .lock_memory = false});
    REQUIRE_OK(p);
    pool = std::move(p).value();
    commit = std::make_unique<CommitEngine>(CommitEngine::Config{root, 0, "node-state-test", {}},
                                            &faults);
    storage = std::make_unique<TaskPool>();
    hot = std::make_unique<HotCache>(pool.get());
    pool->SetReclaimer([this] { return hot->ReclaimOne(); });
    flush = std::make_unique<FlushEngine>(FlushEngine::Config{2}, pool.get(), hot.get());
    capture = std::make_unique<CaptureEngine>(CaptureEngine::Config{1}, pool.get(), flush.get());
    CoordinatorCore::Config core;
    core.storage_root = root;
    core.step_timeout = std::chrono::minutes(1);
    core.refuse_recovered_steps = false;
    core.writer = "node-state-test";
    coordinator = std::make_unique<InProcessCoordinator>(io, kNode, core, &faults, commit.get());
    REQUIRE_OK(coordinator->Recover());
    NodeState::Config config;
    config.node_id = kNode;
    config.storage_root = root;
    config.max_steps_in_flight = max_steps_in_flight;
    config.layout = kLayout;
    node = std::make_unique<NodeState>(io, config, &faults, pool.get(), hot.get(), capture.get(),
                                       commit.get(), storage.get());
    node->AttachCoordinator(coordinator.get());
    REQUIRE_OK(coordinator->Start(node.get()));
    storage->Start();
    flush->Start();
    capture->Start();
  }
  ~Daemon() {              // daemon/main.cc's order
    faults.ClearFaults();  // releases a stalled write
    node->CancelAll("the test is over");
    capture->Stop();
    coordinator->Stop();
    flush->Stop();
    storage->Stop();
  }

  // Runs the loop until `done()` or the deadline; returns done().
  template <class Pred>
  bool RunUntil(Pred done, std::chrono::seconds limit = std::chrono::seconds(20)) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (!done() && std::chrono::steady_clock::now() < deadline) {
      io.run_one_for(std::chrono::milliseconds(20));
    }
    return done();
  }

  Result<NodeState::SaveOutcome> Save(uint64_t step, uint32_t rank, uint32_t world,
                                      const RankMemory& memory, uint64_t session) {
    NodeState::SaveRequest req;
    req.job = kJob;
    req.step = step;
    req.rank = rank;
    req.world_size = world;
    req.session_id = session;
    req.pid = 1000 + static_cast<int32_t>(rank);
    req.plan = memory.plan;
    req.extra = "extra " + std::to_string(rank) + "@" + std::to_string(step);
    return node->StartSave(std::move(req));
  }

  // The status WaitState gives for `state` of `step`, once it is known.
  // (The answer is shared: a waiter left behind by a failed REQUIRE is answered at teardown.)
  Status Wait(uint64_t step, pb::StepState state = pb::STEP_STATE_COMMITTED) {
    auto out = std::make_shared<std::optional<Status>>();
    node->WaitState(kJob, step, state, [out](Status st) { *out = st; });
    REQUIRE(RunUntil([&] { return out->has_value(); }));
    return **out;
  }
  Status WaitCaptured(uint64_t step, uint32_t rank) {
    auto out = std::make_shared<std::optional<Status>>();
    node->WaitCaptured(kJob, step, rank, [out](Status st) { *out = st; });
    REQUIRE(RunUntil([&] { return out->has_value(); }));
    return **out;
  }

  std::optional<StepSnapshot> Snapshot(uint64_t step) const {
    for (const auto& s : node->Snapshot()) {
      if (s.job == kJob && s.step == step) return s;
    }
    return std::nullopt;
  }
  std::string StepDirOf(uint64_t step) const { return StepDir(root, kJob, step); }
  std::optional<std::string> LatestFile() const {
    std::ifstream in(JobDir(root, kJob) + "/LATEST");
    if (!in) return std::nullopt;
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  // Holds the next write of a data file until faults.ReleaseStalls(): its step is captured but
  // cannot persist.
  void HoldNextDataWrite() {
    faults.LimitFaultsTo(".data");
    faults.StallWriteNumber(1);
  }
  // Releases the held write once it is held (released earlier, it would stall afterwards).
  void ReleaseHeldWrite() {
    REQUIRE(RunUntil([&] { return faults.stalled_writes() >= 1; }));
    faults.ReleaseStalls();
  }
  // The step directory of an ended step is removed by the coordinator's decision and, once
  // every capture let go of its files, by this node: both removals done, nothing writes there.
  bool WaitRemovedTwice(uint64_t step) {
    return RunUntil([&] { return base.removals(StepDirOf(step)) >= 2; });
  }
};

// Reads tensor "w" of a committed step back from storage.
std::vector<std::byte> StoredTensor(const std::string& step_dir, Shape shape) {
  auto reader = CheckpointReader::Open(PosixFileSystem(), step_dir);
  REQUIRE_OK(reader);
  auto full = ShardGeometry::Full(shape);
  REQUIRE_OK(full);
  std::vector<std::byte> out(full->numel() * 4);
  CheckpointReader::Request req{"w", *full, "float32", out, {}};
  REQUIRE_OK((*reader)->Read(std::span(&req, 1)));
  return out;
}

TEST_CASE("NodeState: a save of two ranks is captured, persisted and committed end to end",
          "[daemon][node_state]") {
  TempDir dir;
  Daemon d(dir / "root");
  RankMemory rank0(d.mappings, 0, 2, 1);
  RankMemory rank1(d.mappings, 1, 2, 1);

  REQUIRE_OK(d.Save(1, 0, 2, rank0, 11));
  REQUIRE_OK(d.Save(1, 1, 2, rank1, 12));
  CHECK_OK(d.WaitCaptured(1, 0));
  CHECK_OK(d.WaitCaptured(1, 1));
  REQUIRE_OK(d.Wait(1, pb::STEP_STATE_COMMITTED));

  auto snap = d.Snapshot(1);
  REQUIRE(snap.has_value());
  CHECK(snap->state == pb::STEP_STATE_COMMITTED);
  CHECK(snap->ranks.size() == 2);
  for (const auto& r : snap->ranks) {
    CHECK(r.captured);
    CHECK(r.persisted);
  }
  CHECK(d.LatestFile() == std::optional<std::string>("1\n"));
  for (const char* name : {"MANIFEST", "rank-00000.data", "rank-00001.data", "node-node-a.nmf"}) {
    INFO(name);
    CHECK(std::filesystem::exists(d.StepDirOf(1) + "/" + name));
  }
  auto manifest = ReadManifest(PosixFileSystem(), d.StepDirOf(1));
  REQUIRE_OK(manifest);
  CHECK(manifest->world_size() == 2);
  REQUIRE(manifest->ranks_size() == 2);
  CHECK(manifest->ranks(0).extra() == "extra 0@1");
  CHECK(manifest->ranks(1).extra() == "extra 1@1");
  CHECK(manifest->ranks(1).node_id() == kNode);
  std::vector<std::byte> expected = rank0.bytes;
  expected.insert(expected.end(), rank1.bytes.begin(), rank1.bytes.end());
  CHECK(StoredTensor(d.StepDirOf(1), {2, kCols}) == expected);

  // A committed step is still known to a late waiter, and so is a step it never heard of.
  CHECK_OK(d.Wait(1, pb::STEP_STATE_PERSISTED));
  Status unknown = d.Wait(7);
  CHECK(unknown.code() == StatusCode::kNotFound);
  CHECK_THAT(unknown.message(), Contains("step 7"));
}

TEST_CASE(
    "NodeState: a rank whose session closes before its capture aborts the step, and the "
    "step's directory is removed",
    "[daemon][node_state]") {
  TempDir dir;
  Daemon d(dir / "root");
  RankMemory rank0(d.mappings, 0, 2, 2);
  RankMemory rank1(d.mappings, 1, 2, 2);
  // Step 1 commits; step 2 is where rank 0's trainer goes away.
  REQUIRE_OK(d.Save(1, 0, 2, rank0, 21));
  REQUIRE_OK(d.Save(1, 1, 2, rank1, 22));
  REQUIRE_OK(d.Wait(1));

  REQUIRE_OK(d.Save(2, 1, 2, rank1, 22));
  REQUIRE_OK(d.WaitCaptured(2, 1));  // rank 1's part is captured (and goes to storage)
  REQUIRE_OK(d.Save(2, 0, 2, rank0, 21));
  // The session ends before the loop ran anything more: rank 0 has not captured.
  d.node->OnSessionClosed(21, kJob, 0, 1000);

  Status st = d.Wait(2);
  CHECK(st.code() == StatusCode::kAborted);
  CHECK_THAT(st.message(),
             Contains("rank 0 (pid 1000) disconnected before its snapshot of step 2"));
  CHECK(d.Snapshot(2)->state == pb::STEP_STATE_ABORTED);
  REQUIRE(d.WaitRemovedTwice(2));
  CHECK_FALSE(std::filesystem::exists(d.StepDirOf(2)));
  // The earlier step is untouched, and LATEST still names it.
  CHECK(*d.commit->List(kJob) == std::vector<uint64_t>{1});
  CHECK(d.LatestFile() == std::optional<std::string>("1\n"));
  CHECK(StoredTensor(d.StepDirOf(1), {2, kCols}).size() == 2 * kCols * 4);

  // A save by the other session of the aborted step is refused; the next step commits.
  auto again = d.Save(2, 1, 2, rank1, 22);
  REQUIRE_FALSE(again.ok());
  CHECK_THAT(again.status().message(), Contains("already ended (aborted"));
  REQUIRE_OK(d.Save(3, 0, 2, rank0, 23));
  REQUIRE_OK(d.Save(3, 1, 2, rank1, 22));
  CHECK_OK(d.Wait(3));
}

TEST_CASE("NodeState: a session that closes after its rank captured does not abort the step",
          "[daemon][node_state]") {
  TempDir dir;
  Daemon d(dir / "root");
  RankMemory rank0(d.mappings, 0, 1, 3);
  d.HoldNextDataWrite();
  REQUIRE_OK(d.Save(1, 0, 1, rank0, 31));
  REQUIRE_OK(d.WaitCaptured(1, 0));
  d.node->OnSessionClosed(31, kJob, 0, 1000);  // the trainer exits after wait_snapshot
  CHECK(d.Snapshot(1)->state != pb::STEP_STATE_ABORTED);
  d.ReleaseHeldWrite();
  CHECK_OK(d.Wait(1));
  CHECK(d.LatestFile() == std::optional<std::string>("1\n"));
}

TEST_CASE("NodeState: Abandon before the capture aborts the step, after it changes nothing",
          "[daemon][node_state]") {
  TempDir dir;
  Daemon d(dir / "root");
  RankMemory rank0(d.mappings, 0, 1, 4);

  SECTION("before the capture") {
    REQUIRE_OK(d.Save(1, 0, 1, rank0, 41));
    CHECK_FALSE(d.node->Abandon(kJob, 1, 0, /*session_id=*/99, "another session"));
    CHECK(d.node->Abandon(kJob, 1, 0, 41, "fence timed out"));
    CHECK_FALSE(d.node->Abandon(kJob, 1, 0, 41, "again"));  // already ended
    Status st = d.Wait(1);
    CHECK(st.code() == StatusCode::kAborted);
    CHECK_THAT(st.message(), Contains("rank 0 abandoned step 1: fence timed out"));
    REQUIRE(d.WaitRemovedTwice(1));
    CHECK_FALSE(std::filesystem::exists(d.StepDirOf(1)));
    CHECK(d.commit->List(kJob)->empty());
    CHECK_FALSE(d.LatestFile().has_value());
  }
  SECTION("after the capture, while the step is still being written") {
    d.HoldNextDataWrite();
    REQUIRE_OK(d.Save(1, 0, 1, rank0, 41));
    REQUIRE_OK(d.WaitCaptured(1, 0));
    CHECK_FALSE(d.node->Abandon(kJob, 1, 0, 41, "fence timed out"));
    CHECK(d.Snapshot(1)->state != pb::STEP_STATE_ABORTED);
    d.ReleaseHeldWrite();
    CHECK_OK(d.Wait(1));
    CHECK(*d.commit->List(kJob) == std::vector<uint64_t>{1});
    CHECK(StoredTensor(d.StepDirOf(1), {1, kCols}) == rank0.bytes);
  }
  SECTION("of a step this node does not know") {
    CHECK_FALSE(d.node->Abandon(kJob, 5, 0, 41, "unknown"));
  }
}

TEST_CASE("NodeState: a save of a step not newer than a committed one is refused",
          "[daemon][node_state]") {
  TempDir dir;
  {
    Daemon d(dir / "root");
    RankMemory rank0(d.mappings, 0, 1, 5);
    REQUIRE_OK(d.Save(3, 0, 1, rank0, 51));
    REQUIRE_OK(d.Wait(3));
    auto same = d.Save(3, 0, 1, rank0, 51);
    REQUIRE_FALSE(same.ok());
    CHECK(same.status().code() == StatusCode::kFailedPrecondition);
    CHECK_THAT(same.status().message(), Contains("already ended (committed)"));
    auto older = d.Save(2, 0, 1, rank0, 51);
    REQUIRE_FALSE(older.ok());
    CHECK(older.status().code() == StatusCode::kFailedPrecondition);
    CHECK_THAT(older.status().message(), Contains("not newer than committed step 3"));
    REQUIRE_OK(d.Save(4, 0, 1, rank0, 51));
    CHECK_OK(d.Wait(4));
  }

  // A restarted daemon learns the committed steps when the job's first session says hello.
  Daemon d(dir / "root");
  RankMemory rank0(d.mappings, 0, 1, 6);
  struct NoSink : EventSink {
    void OnEvent(const pb::Event&) override {}
  };
  auto sink = std::make_shared<NoSink>();
  d.node->AddSink(kJob, sink);
  // Answered from the storage thread, after the hello's lookup of the committed steps.
  CHECK_OK(d.Wait(4));
  auto refused = d.Save(4, 0, 1, rank0, 61);
  REQUIRE_FALSE(refused.ok());
  CHECK_THAT(refused.status().message(), Contains("not newer than committed step 4"));
  REQUIRE_OK(d.Save(5, 0, 1, rank0, 61));
  CHECK_OK(d.Wait(5));
  CHECK(StoredTensor(d.StepDirOf(4), {1, kCols}).size() == kCols * 4);
  CHECK(StoredTensor(d.StepDirOf(5), {1, kCols}) == rank0.bytes);
}

TEST_CASE(
    "NodeState: a save of a step an earlier daemon committed is never reported committed, "
    "even before the job's storage lookup answered",
    "[daemon][node_state]") {
  TempDir dir;
  std::vector<std::byte> committed_bytes;
  {
    Daemon d(dir / "root");
    RankMemory rank0(d.mappings, 0, 1, 9);
    REQUIRE_OK(d.Save(4, 0, 1, rank0, 91));
    REQUIRE_OK(d.Wait(4));
    committed_bytes = rank0.bytes;
  }
  Daemon d(dir / "root");
  RankMemory other(d.mappings, 0, 1, 10);  // a restarted trainer with other bytes
  REQUIRE(other.bytes != committed_bytes);
  struct NoSink : EventSink {
    void OnEvent(const pb::Event&) override {}
  };
  auto sink = std::make_shared<NoSink>();
  d.node->AddSink(kJob, sink);  // hello; its lookup of committed steps has not answered yet
  auto saved = d.Save(4, 0, 1, other, 101);
  if (saved.ok()) {
    // Accepted before the lookup answered: the save must end in failure, never COMMITTED —
    // its bytes are not what step 4 holds.
    Status st = d.Wait(4);
    INFO(st.ToString());
    CHECK_FALSE(st.ok());
  } else {
    CHECK_THAT(saved.status().message(), Contains("step 4"));
  }
  while (d.io.poll() > 0) {
  }
  CHECK(StoredTensor(d.StepDirOf(4), {1, kCols}) == committed_bytes);
}

TEST_CASE(
    "NodeState: beyond max_steps_in_flight a newer step is accepted but captured only "
    "once an older one ended",
    "[daemon][node_state]") {
  TempDir dir;
  Daemon d(dir / "root", /*max_steps_in_flight=*/1);
  RankMemory rank0(d.mappings, 0, 1, 7);
  d.HoldNextDataWrite();
  REQUIRE_OK(d.Save(1, 0, 1, rank0, 71));
  REQUIRE_OK(d.WaitCaptured(1, 0));  // step 1 captured, its write held: still in flight

  bool step1_committed = false;
  std::optional<bool> step1_committed_when_2_captured;
  d.node->WaitState(kJob, 1, pb::STEP_STATE_COMMITTED, [&](Status st) {
    CHECK_OK(st);
    step1_committed = true;
  });
  auto accepted = d.Save(2, 0, 1, rank0, 71);
  REQUIRE_OK(accepted);
  CHECK_FALSE(accepted->skipped);
  d.node->WaitCaptured(kJob, 2, 0, [&](Status st) {
    CHECK_OK(st);
    step1_committed_when_2_captured = step1_committed;
  });
  // Everything the loop can do now, done: step 2 waits without a capture.
  while (d.io.poll() > 0) {
  }
  auto snap2 = d.Snapshot(2);
  REQUIRE(snap2.has_value());
  CHECK(snap2->state == pb::STEP_STATE_PENDING);
  REQUIRE(snap2->ranks.size() == 1);
  CHECK_FALSE(snap2->ranks[0].captured);
  CHECK(snap2->ranks[0].bytes_captured == 0);
  CHECK_FALSE(step1_committed_when_2_captured.has_value());

  d.ReleaseHeldWrite();
  REQUIRE(d.RunUntil([&] { return step1_committed_when_2_captured.has_value(); }));
  CHECK(*step1_committed_when_2_captured);
  CHECK_OK(d.Wait(2));
  CHECK(*d.commit->List(kJob) == std::vector<uint64_t>{1, 2});
  CHECK(d.LatestFile() == std::optional<std::string>("2\n"));
}

TEST_CASE(
    "NodeState: a fenced registration ends the steps in flight as the coordinator decides: "
    "aborted, or committed when every rank had persisted",
    "[daemon][node_state]") {
  TempDir dir;
  Daemon d(dir / "root");
  RankMemory rank0(d.mappings, 0, 2, 3);
  RankMemory rank1(d.mappings, 1, 2, 3);
  // Step 1: both ranks persisted, the commit under way (its MANIFEST write held).
  d.faults.LimitFaultsTo("MANIFEST");
  d.faults.StallWriteNumber(1);
  REQUIRE_OK(d.Save(1, 0, 2, rank0, 31));
  REQUIRE_OK(d.Save(1, 1, 2, rank1, 32));
  REQUIRE(d.RunUntil([&] { return d.faults.stalled_writes() >= 1; }));
  // Step 2: rank 0 only.
  REQUIRE_OK(d.Save(2, 0, 2, rank0, 31));
  REQUIRE_OK(d.WaitCaptured(2, 0));

  // The coordinator declared this node lost meanwhile (frozen or cut off past its lease).
  d.node->OnCoordinatorConnected({.epoch = 0, .fenced = true});
  const Status two = d.Wait(2);
  CHECK(two.code() == StatusCode::kAborted);
  CHECK_THAT(two.message(), Contains("declared lost by the coordinator"));
  // Step 1 was not failed here: it commits, as the coordinator decides.
  d.faults.ReleaseStalls();
  CHECK_OK(d.Wait(1));
  CHECK(d.LatestFile() == std::optional<std::string>("1\n"));
  // The next step commits as usual.
  REQUIRE_OK(d.Save(3, 0, 2, rank0, 31));
  REQUIRE_OK(d.Save(3, 1, 2, rank1, 32));
  CHECK_OK(d.Wait(3));
}

TEST_CASE("NodeState: Drain refuses new saves and runs idle once no step is in flight",
          "[daemon][node_state]") {
  TempDir dir;
  Daemon d(dir / "root");
  RankMemory rank0(d.mappings, 0, 1, 8);

  SECTION("nothing in flight: at once") {
    int idle = 0;
    d.node->Drain([&] { ++idle; });
    CHECK(idle == 1);
    CHECK(d.node->draining());
  }
  SECTION("a step in flight: once it committed") {
    d.HoldNextDataWrite();
    REQUIRE_OK(d.Save(1, 0, 1, rank0, 81));
    REQUIRE_OK(d.WaitCaptured(1, 0));
    int idle = 0;
    bool committed_before_idle = false;
    bool committed = false;
    d.node->WaitState(kJob, 1, pb::STEP_STATE_COMMITTED, [&](Status st) {
      CHECK_OK(st);
      committed = true;
    });
    d.node->Drain([&] {
      ++idle;
      committed_before_idle = committed;
    });
    while (d.io.poll() > 0) {
    }
    CHECK(idle == 0);
    auto refused = d.Save(2, 0, 1, rank0, 81);
    REQUIRE_FALSE(refused.ok());
    CHECK(refused.status().code() == StatusCode::kUnavailable);
    CHECK_THAT(refused.status().message(), Contains("shutting down"));

    d.ReleaseHeldWrite();
    REQUIRE(d.RunUntil([&] { return idle > 0; }));
    CHECK(committed_before_idle);
    CHECK(*d.commit->List(kJob) == std::vector<uint64_t>{1});
    while (d.io.poll() > 0) {
    }
    CHECK(idle == 1);
  }
}

}  // namespace
}  // namespace ckpt
