// Memory-only steps in the global coordinator (CoordinatorCore, coordinator_core.h): saved with
// persist=False, every report carries memory_only; the step is never written nor committed, its
// manifest is merged and kept in the coordinator, it ends REPLICATED (or FAILED), and Latest /
// RestorePoint name it only while every rank has a live copy in some daemon's memory; once the
// job's trainers ended, its copies are released (ReleaseJob, or --peer-job-ttl) and no longer
// count.
//
// Every test runs world 2: rank 0 on node "a", rank 1 on node "b". The commit thread is waited
// for with WaitIdle (no sleeps); every decision the core sends is then in the sinks.
#include <algorithm>
#include <catch2/catch.hpp>
#include <condition_variable>
#include <filesystem>
#include <mutex>

#include "common/manifest_io.h"
#include "common/step_layout.h"
#include "daemon/coordinator/coordinator_core.h"
#include "tests/test_util.h"
#include "tests/unit/daemon/coordinator/node_manifests.h"

namespace ckpt {
namespace {

namespace pb = ckptd::v1;
using Catch::Matchers::Contains;
using testing::TempDir;

constexpr uint32_t kWorld = 2;

// Records every event; the step decisions of one step, in the order they were sent.
class RecordingSink final : public NodeSink {
 public:
  void Send(const pb::CoordinatorEvent& e) override {
    {
      std::lock_guard lock(mu_);
      events_.push_back(e);
    }
    cv_.notify_all();
  }
  // The JobReleased events of `job` sent so far.
  std::vector<pb::JobReleased> Released(const std::string& job) {
    std::lock_guard lock(mu_);
    std::vector<pb::JobReleased> out;
    for (const auto& e : events_) {
      if (e.has_released() && e.released().job() == job) out.push_back(e.released());
    }
    return out;
  }
  // Until a JobReleased of `job` was sent (false after 60 s: a hang, not a timing bound).
  bool WaitReleased(const std::string& job) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(60), [&] {
      return std::any_of(events_.begin(), events_.end(), [&](const pb::CoordinatorEvent& e) {
        return e.has_released() && e.released().job() == job;
      });
    });
  }
  std::vector<pb::StepDecision> Decisions(uint64_t step) {
    std::lock_guard lock(mu_);
    std::vector<pb::StepDecision> out;
    for (const auto& e : events_) {
      if (e.has_step() && e.step().job() == "j" && e.step().step() == step) {
        out.push_back(e.step());
      }
    }
    return out;
  }
  std::vector<pb::StepState> States(uint64_t step) {
    std::vector<pb::StepState> out;
    for (const auto& d : Decisions(step)) out.push_back(d.state());
    return out;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<pb::CoordinatorEvent> events_;
};

// A valid node manifest of job "j" (node_manifests.h).
pb::NodeManifest NodeManifestFor(uint64_t step, const std::string& node,
                                 const std::vector<uint32_t>& ranks) {
  return testing::NodeManifestFor("j", step, kWorld, node, ranks);
}

// The node that saves `rank` in every test.
std::string NodeOf(uint32_t rank) { return rank == 0 ? "a" : "b"; }

struct Fixture {
  TempDir dir;
  CoordinatorCore::Config config;
  std::unique_ptr<CoordinatorCore> core;
  std::map<std::string, std::shared_ptr<RecordingSink>> sinks;

  Fixture() {
    config.storage_root = dir / "root";
    config.step_timeout = std::chrono::minutes(1);
    config.lease = std::chrono::minutes(1);  // a detached node stays known (not lost) meanwhile
  }
  void Start(const std::vector<std::string>& nodes = {"a", "b"}) {
    core = std::make_unique<CoordinatorCore>(config, PosixFileSystem());
    REQUIRE(core->Start().ok());
    for (const auto& n : nodes) Register(n, "i-" + n);
  }
  // Registers `node` as process `instance` (another instance: its daemon restarted) and opens
  // its event stream.
  // `held_jobs`: its peer pool holds steps of these jobs (up to step 5).
  void Register(const std::string& node, const std::string& instance,
                const std::vector<std::string>& held_jobs = {}) {
    pb::RegisterNodeRequest req;
    req.set_node_id(node);
    req.set_instance(instance);
    for (const auto& job : held_jobs) {
      auto* held = req.add_held_jobs();
      held->set_job(job);
      held->set_newest_step(5);
    }
    REQUIRE(core->RegisterNode(req, "test").ok());
    sinks[node] = std::make_shared<RecordingSink>();
    REQUIRE(core->AttachNode(node, sinks[node]).ok());
  }
  void Detach(const std::string& node) { core->DetachNode(node, sinks[node].get()); }
  // `rank`'s trainer registers its tensors on its node (or, `withdrawn`, its session ended;
  // `restore_session`: the session that asked a restore point).
  void RegisterRank(uint32_t rank, bool withdrawn = false,
                    const std::string& restore_session = "") {
    pb::ReportRegistrationRequest req;
    req.set_node_id(NodeOf(rank));
    req.set_job("j");
    req.set_rank(rank);
    req.set_world_size(kWorld);
    req.set_registration_id(100 + rank);
    req.set_withdrawn(withdrawn);
    req.set_restore_session(restore_session);
    if (!withdrawn) {
      auto* shard = req.add_shards();
      shard->set_name("w" + std::to_string(rank));
      shard->set_dtype("float32");
      shard->add_global_shape(256);
      shard->mutable_geometry()->mutable_box()->add_offsets(0);
      shard->mutable_geometry()->mutable_box()->add_lengths(256);
      shard->set_bytes(1024);
    }
    auto resp = core->ReportRegistration(req);
    INFO(resp.status().ToString());
    REQUIRE(resp.ok());
  }
  // The node's stream opens again (the same process: what it held in memory it still holds).
  void Reattach(const std::string& node) {
    sinks[node] = std::make_shared<RecordingSink>();
    REQUIRE(core->AttachNode(node, sinks[node]).ok());
  }

  static pb::ReportRanksRequest Request(uint64_t step, uint32_t rank, pb::StepState state,
                                        bool memory_only) {
    pb::ReportRanksRequest req;
    req.set_node_id(NodeOf(rank));
    req.set_job("j");
    req.set_step(step);
    req.set_world_size(kWorld);
    req.set_state(state);
    req.set_memory_only(memory_only);
    req.add_ranks(rank);
    if (state == pb::STEP_STATE_PERSISTED) {
      *req.mutable_node_manifest() = NodeManifestFor(step, NodeOf(rank), {rank});
    }
    return req;
  }
  pb::ReportRanksResponse Send(const pb::ReportRanksRequest& req) {
    auto resp = core->ReportRanks(req);
    INFO(resp.status().ToString());
    REQUIRE(resp.ok());
    return *resp;
  }
  pb::ReportRanksResponse Report(uint64_t step, uint32_t rank, pb::StepState state,
                                 bool memory_only = true) {
    return Send(Request(step, rank, state, memory_only));
  }
  // `rank` is in memory on its node and on `holders` (a REPLICATED report without a reason).
  pb::ReportRanksResponse Replicated(uint64_t step, uint32_t rank,
                                     const std::vector<std::string>& holders) {
    auto req = Request(step, rank, pb::STEP_STATE_REPLICATED, /*memory_only=*/true);
    for (const auto& h : holders) req.add_holders(h);
    return Send(req);
  }
  pb::ReportRanksResponse NotReplicated(uint64_t step, uint32_t rank, const std::string& reason) {
    auto req = Request(step, rank, pb::STEP_STATE_REPLICATED, /*memory_only=*/true);
    req.set_reason(reason);
    return Send(req);
  }
  // Every rank of memory-only `step` saved, captured and in its node's memory (PERSISTED with
  // its node manifest); the manifest finished on the commit thread.
  void InMemory(uint64_t step) {
    for (uint32_t r = 0; r < kWorld; ++r) Report(step, r, pb::STEP_STATE_PENDING);
    for (uint32_t r = 0; r < kWorld; ++r) Report(step, r, pb::STEP_STATE_CAPTURED);
    for (uint32_t r = 0; r < kWorld; ++r) Report(step, r, pb::STEP_STATE_PERSISTED);
    core->WaitIdle();
  }
  // A memory-only step saved and replicated: rank r's copies on its node and holders[r].
  void SaveReplicated(uint64_t step, const std::vector<std::vector<std::string>>& holders) {
    InMemory(step);
    for (uint32_t r = 0; r < kWorld; ++r) Replicated(step, r, holders[r]);
    core->WaitIdle();
    REQUIRE(sinks["a"]->States(step).back() == pb::STEP_STATE_REPLICATED);
  }
  // A step saved to storage by every rank and committed.
  void SaveCommitted(uint64_t step) {
    std::filesystem::create_directories(StepDir(config.storage_root, "j", step));
    for (uint32_t r = 0; r < kWorld; ++r) Report(step, r, pb::STEP_STATE_PERSISTED, false);
    core->WaitIdle();
    REQUIRE(sinks["a"]->States(step).back() == pb::STEP_STATE_COMMITTED);
  }
  // The step Latest names, -1 for none (printable in a failed CHECK).
  int64_t Latest() {
    auto latest = core->Latest("j");
    REQUIRE(latest.ok());
    return latest->has_value() ? static_cast<int64_t>(**latest) : -1;
  }
  // The step RestorePoint pins for `rank` of the trainer session `session`, -1 for none.
  int64_t RestorePoint(uint32_t rank, const std::string& session) {
    auto point = core->RestorePoint("j", rank, kWorld, session);
    REQUIRE(point.ok());
    return point->has_value() ? static_cast<int64_t>(**point) : -1;
  }
  bool Exists(uint64_t step, const std::string& file = "") {
    const std::string d = StepDir(config.storage_root, "j", step);
    return std::filesystem::exists(file.empty() ? d : d + "/" + file);
  }
};

bool HasState(const std::vector<pb::StepState>& states, pb::StepState s) {
  return std::find(states.begin(), states.end(), s) != states.end();
}

TEST_CASE(
    "CoordinatorCore: a memory-only step is replicated, never written, and restorable while "
    "its copies live",
    "[coordinator_core][memory_only]") {
  Fixture f;
  f.Start();
  f.SaveCommitted(1);
  f.InMemory(2);
  // In memory on every node: no PERSISTED decision (nothing is durable), nothing to restore yet.
  for (const char* node : {"a", "b"}) {
    CHECK(f.sinks[node]->States(2) == std::vector<pb::StepState>{pb::STEP_STATE_CAPTURED});
  }
  CHECK(f.core->StepManifest("j", 2).status().code() == StatusCode::kNotFound);
  CHECK(f.Latest() == 1);

  f.Replicated(2, 0, {"b"});
  CHECK(f.sinks["a"]->States(2).size() == 1);  // rank 1 is not replicated yet
  f.Replicated(2, 1, {"a"});
  f.core->WaitIdle();
  for (const char* node : {"a", "b"}) {
    INFO("node " << node);
    // CAPTURED, then REPLICATED: never PERSISTED nor COMMITTED.
    const auto decisions = f.sinks[node]->Decisions(2);
    REQUIRE(decisions.size() == 2);
    CHECK(decisions[0].state() == pb::STEP_STATE_CAPTURED);
    CHECK(decisions[1].state() == pb::STEP_STATE_REPLICATED);
    CHECK_FALSE(decisions[1].not_replicated());
  }
  // Nothing on storage: no step directory, no MANIFEST, LATEST and the committed list unchanged.
  CHECK_FALSE(f.Exists(2));
  auto listed = f.core->List("j");
  REQUIRE(listed.ok());
  CHECK(*listed == std::vector<uint64_t>{1});
  CHECK(*PosixFileSystem()->ReadFile(f.config.storage_root + "/j/LATEST") == "1\n");
  // The step ended (terminal): the Admin view no longer shows it in flight.
  for (const auto& s : f.core->TakeSnapshot().steps) CHECK(s.step != 2);

  // Its manifest, merged from both nodes' reports, lives in the coordinator.
  auto m = f.core->StepManifest("j", 2);
  REQUIRE(m.ok());
  REQUIRE(*m != nullptr);
  CHECK((*m)->job() == "j");
  CHECK((*m)->step() == 2);
  CHECK((*m)->world_size() == kWorld);
  REQUIRE((*m)->ranks_size() == 2);
  CHECK((*m)->ranks(0).rank() == 0);
  CHECK((*m)->ranks(0).node_id() == "a");
  CHECK((*m)->ranks(1).rank() == 1);
  CHECK((*m)->ranks(1).node_id() == "b");
  REQUIRE((*m)->tensors_size() == 1);
  CHECK((*m)->tensors(0).shards_size() == 2);
  CHECK(f.core->StepManifest("j", 1).status().code() == StatusCode::kNotFound);  // on storage
  CHECK(f.core->StepManifest("j", 3).status().code() == StatusCode::kNotFound);  // unknown

  // It is the newest step that restores.
  CHECK(f.Latest() == 2);
  CHECK(f.RestorePoint(0, "session-1") == 2);

  // A late report hears how the step ended.
  const auto late = f.Report(2, 1, pb::STEP_STATE_PERSISTED);
  CHECK(late.decision().state() == pb::STEP_STATE_REPLICATED);

  // One node's stream down: every rank still has a copy on b (rank 0 as its holder, rank 1 as the
  // node that saved it). Both down: no copy of the step is reachable, the committed step restores.
  f.Detach("a");
  CHECK(f.Latest() == 2);
  f.Detach("b");
  CHECK(f.Latest() == 1);
  // b's stream back (the same process: its memory kept): the step restores again.
  f.Reattach("b");
  CHECK(f.Latest() == 2);
}

TEST_CASE("CoordinatorCore: a memory-only step restores with no committed step at all",
          "[coordinator_core][memory_only]") {
  Fixture f;
  f.Start();
  CHECK(f.Latest() == -1);
  f.SaveReplicated(5, {{"b"}, {"a"}});
  CHECK(f.Latest() == 5);
  CHECK_FALSE(std::filesystem::exists(f.config.storage_root + "/j/LATEST"));
  f.Detach("a");
  f.Detach("b");
  CHECK(f.Latest() == -1);
}

TEST_CASE("CoordinatorCore: a memory-only step in flight does not hold back a later commit",
          "[coordinator_core][memory_only]") {
  Fixture f;
  f.Start();
  bool in_memory = false;
  SECTION("in memory everywhere, waiting for its REPLICATED reports") {
    f.InMemory(2);
    in_memory = true;
  }
  SECTION("still being saved") {
    f.Report(2, 0, pb::STEP_STATE_PENDING);
    f.Report(2, 1, pb::STEP_STATE_CAPTURED);
  }
  f.SaveCommitted(3);  // REQUIREs the COMMITTED decision
  CHECK(f.Exists(3, "MANIFEST"));
  CHECK_FALSE(f.Exists(2));
  CHECK(f.Latest() == 3);
  for (const char* node : {"a", "b"}) {
    INFO("node " << node);
    CHECK(HasState(f.sinks[node]->States(3), pb::STEP_STATE_PERSISTED));
    CHECK(HasState(f.sinks[node]->States(3), pb::STEP_STATE_COMMITTED));
  }
  // Step 2 is still in flight, untouched by the commit after it.
  const auto snapshot = f.core->TakeSnapshot();
  CHECK(std::any_of(snapshot.steps.begin(), snapshot.steps.end(),
                    [](const auto& s) { return s.job == "j" && s.step == 2; }));
  for (const char* node : {"a", "b"}) {
    const auto states = f.sinks[node]->States(2);
    CHECK_FALSE(HasState(states, pb::STEP_STATE_FAILED));
    CHECK_FALSE(HasState(states, pb::STEP_STATE_ABORTED));
  }

  // It still ends REPLICATED; older than the committed step, it is not what restores.
  if (!in_memory) f.InMemory(2);
  f.Replicated(2, 0, {"b"});
  f.Replicated(2, 1, {"a"});
  f.core->WaitIdle();
  CHECK(f.sinks["a"]->States(2).back() == pb::STEP_STATE_REPLICATED);
  CHECK(f.core->StepManifest("j", 2).ok());
  CHECK(f.Latest() == 3);
  CHECK_FALSE(f.Exists(2));
}

TEST_CASE("CoordinatorCore: a memory-only rank not replicated fails the step",
          "[coordinator_core][memory_only]") {
  Fixture f;
  f.Start();
  f.SaveCommitted(1);
  SECTION("after its manifest was finished") { f.InMemory(2); }
  SECTION("while its manifest may still be finishing") {
    for (uint32_t r = 0; r < kWorld; ++r) f.Report(2, r, pb::STEP_STATE_PERSISTED);
  }
  f.Replicated(2, 1, {"a"});
  f.NotReplicated(2, 0, "node 'b' (10.0.0.2:1): peer pool full");
  f.core->WaitIdle();
  for (const char* node : {"a", "b"}) {
    INFO("node " << node);
    // The not-replicated decision first (its waiters hear why), then FAILED.
    const auto decisions = f.sinks[node]->Decisions(2);
    REQUIRE(decisions.size() == 3);
    CHECK(decisions[0].state() == pb::STEP_STATE_CAPTURED);
    CHECK(decisions[1].state() == pb::STEP_STATE_REPLICATED);
    CHECK(decisions[1].not_replicated());
    CHECK_THAT(decisions[1].reason(), Contains("[0] on node 'a'") && Contains("peer pool full"));
    CHECK(decisions[2].state() == pb::STEP_STATE_FAILED);
    CHECK_THAT(decisions[2].reason(),
               Contains("memory-only step not replicated") && Contains("peer pool full"));
  }
  CHECK(f.core->StepManifest("j", 2).status().code() == StatusCode::kNotFound);
  CHECK(f.Latest() == 1);
  CHECK_FALSE(f.Exists(2));
  // A late report hears FAILED; nothing it says revives the step.
  const auto late = f.Replicated(2, 0, {"b"});
  CHECK(late.decision().state() == pb::STEP_STATE_FAILED);
  f.core->WaitIdle();
  CHECK(f.Latest() == 1);
  CHECK(f.sinks["a"]->Decisions(2).size() == 3);
}

TEST_CASE(
    "CoordinatorCore: a node lost before its memory-only ranks were replicated fails the step",
    "[coordinator_core][memory_only]") {
  Fixture f;
  f.Start();
  f.SaveCommitted(1);
  f.InMemory(2);
  f.Replicated(2, 0, {"b"});  // rank 0 has a copy on b; rank 1 lives only in b's memory
  f.Register("b", "i-b-2");   // b's daemon restarted: it is lost, and rank 1's only copy with it
  f.core->WaitIdle();
  const auto decisions = f.sinks["a"]->Decisions(2);
  REQUIRE(decisions.size() == 3);
  CHECK(decisions[1].state() == pb::STEP_STATE_REPLICATED);
  CHECK(decisions[1].not_replicated());
  CHECK_THAT(decisions[1].reason(), Contains("[1] on node 'b'") && Contains("lost"));
  CHECK(decisions[2].state() == pb::STEP_STATE_FAILED);
  CHECK(f.core->StepManifest("j", 2).status().code() == StatusCode::kNotFound);
  CHECK(f.Latest() == 1);
}

TEST_CASE("CoordinatorCore: every rank must save a step the same way",
          "[coordinator_core][memory_only]") {
  Fixture f;
  f.Start();
  f.SaveCommitted(1);
  bool first_memory_only = true;
  SECTION("memory-only first, then a report to storage") { first_memory_only = true; }
  SECTION("to storage first, then a memory-only report") { first_memory_only = false; }
  if (!first_memory_only) {
    std::filesystem::create_directories(StepDir(f.config.storage_root, "j", 2));
  }
  f.Report(2, 0, pb::STEP_STATE_PENDING, first_memory_only);
  f.Report(2, 0, pb::STEP_STATE_PERSISTED, first_memory_only);
  const auto resp = f.Report(2, 1, pb::STEP_STATE_PERSISTED, !first_memory_only);
  CHECK(resp.decision().state() == pb::STEP_STATE_FAILED);
  CHECK_THAT(resp.decision().reason(), Contains("every rank must save a step the same way"));
  CHECK_THAT(resp.decision().reason(), Contains("[1] on node 'b'"));
  f.core->WaitIdle();
  for (const char* node : {"a", "b"}) {
    INFO("node " << node);
    const auto decisions = f.sinks[node]->Decisions(2);
    REQUIRE_FALSE(decisions.empty());
    CHECK(decisions.back().state() == pb::STEP_STATE_FAILED);
    CHECK_THAT(decisions.back().reason(), Contains("every rank must save a step the same way"));
    CHECK_FALSE(HasState(f.sinks[node]->States(2), pb::STEP_STATE_COMMITTED));
    CHECK_FALSE(HasState(f.sinks[node]->States(2), pb::STEP_STATE_REPLICATED));
  }
  // Nothing of it stays: no MANIFEST, no manifest in memory, the committed step restores; a report
  // the same way as the first hears FAILED too.
  CHECK_FALSE(f.Exists(2, "MANIFEST"));
  CHECK(f.core->StepManifest("j", 2).status().code() == StatusCode::kNotFound);
  CHECK(f.Latest() == 1);
  CHECK(f.Report(2, 1, pb::STEP_STATE_PERSISTED, first_memory_only).decision().state() ==
        pb::STEP_STATE_FAILED);
}

// Which copies of a replicated memory-only step count (RestorableNow): a holder its REPLICATED
// report named while the holder's stream is up; the node that saved the rank only while no newer
// step of the job was decided replicated (the daemon keeps its step in memory until then); and
// only the newest two replicated steps (holders drop older copies).
TEST_CASE("CoordinatorCore: a memory-only step restores while every rank has a live copy",
          "[coordinator_core][memory_only]") {
  Fixture f;
  f.Start({"a", "b", "c", "d"});
  f.SaveCommitted(1);
  // Rank 0 (saved on a) is held by b, rank 1 (saved on b) by a.
  f.SaveReplicated(2, {{"b"}, {"a"}});
  REQUIRE(f.Latest() == 2);

  SECTION("the newest replicated step: the node that saved a rank counts") {
    // a down: rank 0 from its holder b, rank 1 from b, which saved it.
    f.Detach("a");
    CHECK(f.Latest() == 2);
    f.Detach("b");
    CHECK(f.Latest() == 1);
  }
  SECTION("a newer step failed to replicate: the node that saved a rank still counts") {
    f.InMemory(3);
    f.NotReplicated(3, 0, "peer pool full");
    f.core->WaitIdle();
    REQUIRE(f.sinks["a"]->States(3).back() == pb::STEP_STATE_FAILED);
    f.Detach("a");
    CHECK(f.Latest() == 2);
  }
  SECTION("a newer step replicated: only the holders of the older one count") {
    // Step 3: both ranks held by c.
    f.SaveReplicated(3, {{"c"}, {"c"}});
    CHECK(f.Latest() == 3);
    f.Detach("c");  // step 3 still restores from the nodes that saved it (its newest)
    CHECK(f.Latest() == 3);
    // a down too: step 3's rank 0 has no live copy (a saved it, c held it). Step 2's rank 1 is
    // held by a only: b saved it, but b dropped it when step 3 was replicated. Neither restores.
    f.Detach("a");
    CHECK(f.Latest() == 1);
    CHECK(f.RestorePoint(1, "session-1") == 1);
    // c's stream back: step 3 restores again.
    f.Reattach("c");
    CHECK(f.Latest() == 3);
  }
}

TEST_CASE("CoordinatorCore: only the newest two replicated steps restore from memory",
          "[coordinator_core][memory_only]") {
  Fixture f;
  f.Start({"a", "b", "c", "d"});
  f.SaveCommitted(1);
  f.SaveReplicated(2, {{"c"}, {"c"}});  // held by c
  f.SaveReplicated(3, {{"d"}, {"d"}});  // held by d
  // a and d down: step 3's rank 0 has no live copy (a saved it, d held it); step 2, the other of
  // the newest two replicated steps, restores from c.
  f.Detach("a");
  f.Detach("d");
  CHECK(f.Latest() == 2);
  f.Reattach("a");
  f.Reattach("d");
  f.SaveReplicated(4, {{"d"}, {"d"}});  // held by d
  CHECK(f.Latest() == 4);
  // The same nodes down: neither step 4 nor step 3 restores, and step 2 is no longer among the
  // newest two replicated steps (c dropped its copies when steps 3 and 4 reached it).
  f.Detach("a");
  f.Detach("d");
  CHECK(f.Latest() == 1);
}

// A daemon that restarted holds nothing it held before (LoseNode: "a restarted daemon holds
// nothing"), even once its new process is attached: it is no copy of a memory-only step.
TEST_CASE("CoordinatorCore: a memory-only step does not restore from daemons that restarted",
          "[coordinator_core][memory_only]") {
  Fixture f;
  f.Start();
  f.SaveCommitted(1);
  f.SaveReplicated(2, {{"b"}, {"a"}});
  REQUIRE(f.Latest() == 2);
  f.Register("a", "i-a-2");  // a restarted: rank 0 still on its holder b, rank 1 on b
  CHECK(f.Latest() == 2);
  f.Register("b", "i-b-2");  // b restarted too: no process holds either rank any more
  CHECK(f.Latest() == 1);
  CHECK(f.RestorePoint(0, "session-1") == 1);
}

TEST_CASE(
    "CoordinatorCore: a finished job's copies in memory are released, count no more, and a rank "
    "registering makes the job live again",
    "[coordinator_core][memory_only]") {
  Fixture f;
  f.Start({"a", "b", "c"});
  f.RegisterRank(0);
  f.RegisterRank(1);
  f.SaveCommitted(1);
  f.SaveReplicated(2, {{"c"}, {"c"}});
  REQUIRE(f.Latest() == 2);

  // Its trainers run: refused, nothing released.
  auto refused = f.core->ReleaseJob("j");
  CHECK(refused.status().code() == StatusCode::kFailedPrecondition);
  CHECK_THAT(refused.status().message(), Contains("2 rank(s) registered"));
  CHECK(f.core->ReleaseJob("nobody").status().code() == StatusCode::kNotFound);
  CHECK(f.sinks["c"]->Released("j").empty());
  CHECK(f.Latest() == 2);

  // Its trainers ended: every node hears the release, through the newest step.
  f.RegisterRank(0, /*withdrawn=*/true);
  f.RegisterRank(1, /*withdrawn=*/true);
  auto released = f.core->ReleaseJob("j");
  REQUIRE(released.ok());
  CHECK(released->through_step() == 2);
  for (const std::string node : {"a", "b", "c"}) {
    INFO(node);
    const auto heard = f.sinks[node]->Released("j");
    REQUIRE(heard.size() == 1);
    CHECK(heard[0].through_step() == 2);
    CHECK_THAT(heard[0].reason(), Contains("operator"));
  }
  // No copy of step 2 counts any more, whatever a node reports of it.
  CHECK(f.Latest() == 1);
  CHECK(f.core->StepManifest("j", 2).status().code() == StatusCode::kNotFound);
  f.Replicated(2, 0, {"c"});
  CHECK(f.Latest() == 1);
  CHECK(f.RestorePoint(0, "session-1") == 1);
  // A memory-only step saved again at or below the release fails at once (a rolled-back job).
  const auto again = f.Report(2, 0, pb::STEP_STATE_PENDING);
  CHECK(again.decision().state() == pb::STEP_STATE_FAILED);
  CHECK_THAT(again.decision().reason(), Contains("released through step 2"));

  // A node away meanwhile hears it when it attaches, if its peer pool holds the job.
  f.Register("d", "i-d", {"j"});
  CHECK(f.sinks["d"]->Released("j").size() == 1);
  f.Register("e", "i-e", {"other"});
  CHECK(f.sinks["e"]->Released("j").empty());

  // The job runs again: what it saves from now on counts (d's word that it held step 5 widened
  // nothing the coordinator counts).
  f.RegisterRank(0);
  f.RegisterRank(1);
  f.SaveReplicated(3, {{"c"}, {"c"}});
  CHECK(f.Latest() == 3);
  // A holder attaching now hears the old release only: step 3 is a live copy.
  f.Register("g", "i-g", {"j"});
  const auto told = f.sinks["g"]->Released("j");
  REQUIRE(told.size() == 1);
  CHECK(told[0].through_step() == 2);
}

TEST_CASE(
    "CoordinatorCore: a job without a registered rank for --peer-job-ttl is released, a job "
    "whose ranks are registered never is",
    "[coordinator_core][memory_only]") {
  Fixture f;
  f.config.peer_job_ttl = std::chrono::milliseconds(300);
  f.Start({"a", "b"});
  f.RegisterRank(0);
  f.RegisterRank(1);
  f.SaveReplicated(1, {{"b"}, {"a"}});
  REQUIRE(f.Latest() == 1);
  // A node whose peer pool holds job "k", which the coordinator knows nothing of (it restarted
  // since): k is released after the same time.
  const auto idle_from = std::chrono::steady_clock::now();
  f.Register("c", "i-c", {"k"});
  REQUIRE(f.sinks["c"]->WaitReleased("k"));
  CHECK(std::chrono::steady_clock::now() - idle_from >= f.config.peer_job_ttl);
  CHECK(f.sinks["c"]->Released("k")[0].through_step() == 5);  // all the node said it holds
  // Job j's ranks stayed registered all along (since before k's clock started): not released.
  CHECK(f.sinks["c"]->Released("j").empty());
  CHECK(f.Latest() == 1);

  // j's trainers end, and a new incarnation asks for its restore point: restoring, it is live
  // though nothing of it is registered. Job m, which a holder names now, is released after
  // the TTL; j is not, and an operator cannot release it either.
  f.RegisterRank(0, /*withdrawn=*/true);
  f.RegisterRank(1, /*withdrawn=*/true);
  REQUIRE(f.RestorePoint(0, "restore-1") == 1);
  f.Register("d", "i-d", {"m"});
  REQUIRE(f.sinks["d"]->WaitReleased("m"));
  CHECK(f.sinks["d"]->Released("j").empty());
  const auto restoring = f.core->ReleaseJob("j");
  CHECK(restoring.status().code() == StatusCode::kFailedPrecondition);
  CHECK_THAT(restoring.status().message(), Contains("restoring"));
  CHECK(f.Latest() == 1);

  // That restart dies (its session ends before it saved): released once the TTL has run.
  const auto ended = std::chrono::steady_clock::now();
  f.RegisterRank(0, /*withdrawn=*/true, "restore-1");
  REQUIRE(f.sinks["a"]->WaitReleased("j"));
  CHECK(std::chrono::steady_clock::now() - ended >= f.config.peer_job_ttl);
  // The timer thread tells the nodes one after the other: b may hear it a moment after a.
  REQUIRE(f.sinks["b"]->WaitReleased("j"));
  const auto heard = f.sinks["b"]->Released("j");
  REQUIRE(heard.size() == 1);
  CHECK(heard[0].through_step() == 1);
  CHECK_THAT(heard[0].reason(), Contains("--peer-job-ttl"));
  CHECK(f.Latest() == -1);
}

}  // namespace
}  // namespace ckpt
