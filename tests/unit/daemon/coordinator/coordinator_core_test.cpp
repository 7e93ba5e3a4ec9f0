#include "daemon/coordinator/coordinator_core.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <condition_variable>
#include <filesystem>
#include <functional>
#include <mutex>
#include <thread>

#include "common/atomic_file.h"
#include "common/manifest_io.h"
#include "common/step_layout.h"
#include "tests/test_util.h"
#include "tests/unit/daemon/coordinator/node_manifests.h"

namespace ckpt {
namespace {

namespace pb = ckptd::v1;
using Catch::Matchers::Contains;
using testing::NodeManifestFor;
using testing::TempDir;

// Records step decisions; Wait blocks (with a deadline) until one for (job, step) arrives.
class RecordingSink final : public NodeSink {
 public:
  void Send(const pb::CoordinatorEvent& e) override {
    std::lock_guard lock(mu_);
    events_.push_back(e);
    cv_.notify_all();
  }
  std::optional<pb::StepDecision> WaitTerminal(const std::string& job, uint64_t step) {
    return WaitDecision(job, step, [](pb::StepState s) {
      return s == pb::STEP_STATE_COMMITTED || s == pb::STEP_STATE_ABORTED ||
             s == pb::STEP_STATE_FAILED;
    });
  }
  // Blocks (with a deadline) until a REPLICATED decision for (job, step) arrives.
  std::optional<pb::StepDecision> WaitReplication(const std::string& job, uint64_t step) {
    return WaitDecision(job, step, [](pb::StepState s) { return s == pb::STEP_STATE_REPLICATED; });
  }
  // Blocks (with a deadline) until a decision for (job, step) whose state is `wanted` arrives.
  template <class Wanted>
  std::optional<pb::StepDecision> WaitDecision(const std::string& job, uint64_t step,
                                               Wanted wanted) {
    std::unique_lock lock(mu_);
    std::optional<pb::StepDecision> out;
    cv_.wait_for(lock, std::chrono::seconds(20), [&] {
      for (const auto& e : events_) {
        if (e.has_step() && e.step().job() == job && e.step().step() == step &&
            wanted(e.step().state())) {
          out = e.step();
          return true;
        }
      }
      return false;
    });
    return out;
  }
  // The REPLICATED decisions for (job, step) received so far.
  std::vector<pb::StepDecision> Replications(const std::string& job, uint64_t step) {
    std::lock_guard lock(mu_);
    std::vector<pb::StepDecision> out;
    for (const auto& e : events_) {
      if (e.has_step() && e.step().job() == job && e.step().step() == step &&
          e.step().state() == pb::STEP_STATE_REPLICATED) {
        out.push_back(e.step());
      }
    }
    return out;
  }
  // The newest HolderAssignment received (empty when none).
  pb::HolderAssignment LastHolders() {
    std::lock_guard lock(mu_);
    pb::HolderAssignment out;
    for (const auto& e : events_) {
      if (e.has_holders()) out = e.holders();
    }
    return out;
  }
  // Until the newest assignment lists `count` holders, none of them `not`.
  bool WaitHolders(int count, const std::string& not_this = "") {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(20), [&] {
      const pb::HolderAssignment* last = nullptr;
      for (const auto& e : events_) {
        if (e.has_holders()) last = &e.holders();
      }
      if (last == nullptr || last->holders_size() != count) return false;
      for (const auto& h : last->holders()) {
        if (h.node_id() == not_this) return false;
      }
      return true;
    });
  }
  std::vector<uint64_t> CommittedOrder(const std::string& job) {
    std::lock_guard lock(mu_);
    std::vector<uint64_t> out;
    for (const auto& e : events_) {
      if (e.has_step() && e.step().job() == job && e.step().state() == pb::STEP_STATE_COMMITTED) {
        out.push_back(e.step().step());
      }
    }
    return out;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<pb::CoordinatorEvent> events_;
};

struct Fixture {
  TempDir dir;
  CoordinatorCore::Config config;
  std::unique_ptr<CoordinatorCore> core;
  std::map<std::string, std::shared_ptr<RecordingSink>> sinks;

  explicit Fixture(std::chrono::milliseconds timeout = std::chrono::minutes(1),
                   std::chrono::milliseconds lease = std::chrono::minutes(1)) {
    config.storage_root = dir / "root";
    config.step_timeout = timeout;
    config.lease = lease;
  }
  std::vector<std::string> Start(std::vector<std::string> nodes) {
    core = std::make_unique<CoordinatorCore>(config, PosixFileSystem());
    auto report = core->Start();
    REQUIRE(report.ok());
    for (const auto& n : nodes) {
      pb::RegisterNodeRequest req;
      req.set_node_id(n);
      req.set_instance("i-" + n);
      REQUIRE(core->RegisterNode(req, "test").ok());
      sinks[n] = std::make_shared<RecordingSink>();
      REQUIRE(core->AttachNode(n, sinks[n]).ok());
    }
    return *report;
  }
  // `edit` changes the node manifest before it is sent.
  pb::ReportRanksResponse Persisted(const std::string& node, uint64_t step, uint32_t world,
                                    std::vector<uint32_t> ranks, const std::string& job = "j",
                                    const std::function<void(pb::NodeManifest&)>& edit = {}) {
    std::filesystem::create_directories(StepDir(config.storage_root, job, step));
    pb::ReportRanksRequest req;
    req.set_node_id(node);
    req.set_job(job);
    req.set_step(step);
    req.set_world_size(world);
    req.set_state(pb::STEP_STATE_PERSISTED);
    for (uint32_t r : ranks) req.add_ranks(r);
    *req.mutable_node_manifest() = NodeManifestFor(job, step, world, node, ranks);
    if (edit) edit(*req.mutable_node_manifest());
    auto resp = core->ReportRanks(req);
    REQUIRE(resp.ok());
    return *resp;
  }
  pb::ReportRanksResponse Report(const std::string& node, uint64_t step, uint32_t world,
                                 std::vector<uint32_t> ranks, pb::StepState state,
                                 const std::string& reason = "") {
    pb::ReportRanksRequest req;
    req.set_node_id(node);
    req.set_job("j");
    req.set_step(step);
    req.set_world_size(world);
    req.set_state(state);
    req.set_reason(reason);
    for (uint32_t r : ranks) req.add_ranks(r);
    auto resp = core->ReportRanks(req);
    REQUIRE(resp.ok());
    return *resp;
  }
  void Saved(const std::string& node, uint64_t step, uint32_t world, std::vector<uint32_t> ranks) {
    Report(node, step, world, std::move(ranks), pb::STEP_STATE_PENDING);
  }
  // Waits for job "j"'s `step` to end (as `node` hears it), checks that it committed, and
  // returns its MANIFEST.
  pb::Manifest CommittedManifest(uint64_t step, const std::string& node = "a") {
    auto d = sinks[node]->WaitTerminal("j", step);
    REQUIRE(d);
    CHECK(d->state() == pb::STEP_STATE_COMMITTED);
    auto m = ReadManifest(PosixFileSystem(), StepDir(config.storage_root, "j", step));
    REQUIRE(m.ok());
    return *m;
  }
};

TEST_CASE("CoordinatorCore commits a step once every node persisted its ranks, in step order",
          "[coordinator_core]") {
  Fixture f;
  f.Start({"a", "b"});
  f.Saved("a", 1, 4, {0, 1});
  f.Persisted("a", 2, 4, {0, 1});
  f.Persisted("b", 2, 4, {2, 3});  // step 2 complete, but step 1 is still in flight
  f.Persisted("a", 1, 4, {0, 1});
  f.Persisted("b", 1, 4, {2, 3});
  const pb::Manifest m = f.CommittedManifest(2, "b");  // the sink whose order is checked next
  CHECK(f.sinks["b"]->CommittedOrder("j") == std::vector<uint64_t>{1, 2});
  CHECK(m.ranks_size() == 4);
  CHECK(*f.core->Latest("j") == std::optional<uint64_t>(2));
}

TEST_CASE("CoordinatorCore aborts a step past its timeout naming missing ranks and nodes",
          "[coordinator_core]") {
  Fixture f(std::chrono::milliseconds(500));  // not over before node a's report below
  f.Start({"a", "b"});
  f.Saved("b", 7, 4, {2, 3});
  f.Persisted("a", 7, 4, {0, 1});
  auto d = f.sinks["a"]->WaitTerminal("j", 7);
  REQUIRE(d);
  CHECK(d->state() == pb::STEP_STATE_ABORTED);
  CHECK_THAT(d->reason(), Contains("[2, 3] on node 'b'"));
  f.core->WaitIdle();
  CHECK_FALSE(std::filesystem::exists(StepDir(f.config.storage_root, "j", 7)));
  // A late report hears the decision.
  auto late = f.Persisted("b", 7, 4, {2, 3});
  CHECK(late.decision().state() == pb::STEP_STATE_ABORTED);
}

TEST_CASE("CoordinatorCore aborts the steps of a node whose lease expired", "[coordinator_core]") {
  Fixture f(std::chrono::minutes(1), std::chrono::milliseconds(20));
  f.Start({"a", "b"});
  f.Saved("b", 3, 4, {2, 3});
  f.Persisted("a", 3, 4, {0, 1});
  f.core->DetachNode("b", f.sinks["b"].get());
  auto d = f.sinks["a"]->WaitTerminal("j", 3);
  REQUIRE(d);
  CHECK(d->state() == pb::STEP_STATE_ABORTED);
  CHECK_THAT(d->reason(), Contains("node 'b' was lost"));
  CHECK_THAT(d->reason(), Contains("[2, 3]"));
}

TEST_CASE(
    "CoordinatorCore fences a node declared lost: reports and registrations from its earlier "
    "epoch are refused, and it registers into a new one",
    "[coordinator_core]") {
  // A lease far above a loaded machine's scheduling delays: between a detach and the next call
  // it must not run out unless the test waits for it.
  Fixture f(std::chrono::minutes(1), std::chrono::milliseconds(500));
  f.Start({"a", "b"});
  auto register_b = [&](const std::string& instance) {
    pb::RegisterNodeRequest req;
    req.set_node_id("b");
    req.set_instance(instance);
    auto resp = f.core->RegisterNode(req, "test");
    REQUIRE(resp.ok());
    return *resp;
  };
  auto report_b = [&](uint64_t step, uint64_t epoch) {
    pb::ReportRanksRequest req;
    req.set_node_id("b");
    req.set_job("j");
    req.set_step(step);
    req.set_world_size(4);
    req.set_state(pb::STEP_STATE_PENDING);
    req.add_ranks(2);
    req.set_epoch(epoch);
    return f.core->ReportRanks(req);
  };
  auto known = [&](uint64_t step) {
    for (const auto& s : f.core->TakeSnapshot().steps) {
      if (s.step == step) return true;
    }
    return false;
  };
  // A registration of rank `rank` on node b (or its withdrawal), stamped with `epoch`.
  auto register_rank_b = [&](uint32_t rank, uint64_t epoch, bool withdrawn = false) {
    pb::ReportRegistrationRequest req;
    req.set_node_id("b");
    req.set_job("j");
    req.set_rank(rank);
    req.set_world_size(4);
    req.set_registration_id(500 + rank);
    req.set_epoch(epoch);
    req.set_withdrawn(withdrawn);
    if (!withdrawn) {
      auto* shard = req.add_shards();
      shard->set_name("w");
      shard->set_dtype("float32");
      shard->add_global_shape(256);
      shard->mutable_geometry()->mutable_box()->add_offsets(0);
      shard->mutable_geometry()->mutable_box()->add_lengths(256);
      shard->set_bytes(1024);
    }
    return f.core->ReportRegistration(req);
  };
  auto ranks_registered = [&] {
    for (const auto& p : f.core->TakeSnapshot().plans) {
      if (p.job == "j") return p.ranks_registered;
    }
    return 0u;
  };
  // Reconnecting within the lease keeps the epoch: its reports in flight stand.
  const auto first = register_b("i-b");
  const uint64_t e1 = first.epoch();
  CHECK(e1 > 0);
  CHECK_FALSE(first.fenced());
  CHECK(register_b("i-b").epoch() == e1);
  REQUIRE(report_b(3, e1).ok());
  REQUIRE(register_rank_b(2, e1).ok());
  CHECK(ranks_registered() == 1);
  f.Saved("a", 3, 4, {0, 1});

  // Its stream ends and stays down past the lease: lost, its step 3 aborted.
  f.core->DetachNode("b", f.sinks["b"].get());
  auto d = f.sinks["a"]->WaitTerminal("j", 3);
  REQUIRE(d);
  CHECK(d->state() == pb::STEP_STATE_ABORTED);

  // Woken up, its queued reports from epoch e1 are refused and start nothing.
  auto stale = report_b(4, e1);
  REQUIRE_FALSE(stale.ok());
  CHECK(stale.status().code() == StatusCode::kFailedPrecondition);
  CHECK_THAT(stale.status().message(), Contains("declared the node lost"));
  CHECK_FALSE(known(4));
  // Its registrations ended with it; one it queued in epoch e1 does not bring a rank back (the
  // rank may have registered on another node since), nor does a withdrawal.
  CHECK(ranks_registered() == 0);
  auto stale_registration = register_rank_b(3, e1);
  REQUIRE_FALSE(stale_registration.ok());
  CHECK(stale_registration.status().code() == StatusCode::kFailedPrecondition);
  CHECK_THAT(stale_registration.status().message(), Contains("declared the node lost"));
  CHECK(register_rank_b(2, e1, /*withdrawn=*/true).status().code() ==
        StatusCode::kFailedPrecondition);
  CHECK(ranks_registered() == 0);

  // It registers again (the same process): told it was fenced, in a new epoch whose reports
  // count; the old epoch's stay refused.
  const auto again = register_b("i-b");
  CHECK(again.fenced());
  const uint64_t e2 = again.epoch();
  CHECK(e2 > e1);
  REQUIRE(report_b(5, e2).ok());
  CHECK(known(5));
  REQUIRE(register_rank_b(3, e2).ok());
  CHECK(ranks_registered() == 1);
  CHECK_FALSE(register_rank_b(2, e1).ok());
  CHECK(ranks_registered() == 1);
  CHECK_FALSE(report_b(6, e1).ok());
  // Until it attaches, every registration says so (the first answer may have been lost); once
  // it attached, no more.
  const auto repeated = register_b("i-b");
  CHECK(repeated.fenced());
  CHECK(repeated.epoch() == e2);
  auto sink = std::make_shared<RecordingSink>();
  REQUIRE(f.core->AttachNode("b", sink).ok());
  CHECK_FALSE(register_b("i-b").fenced());

  // Its lease runs out between a registration and its attach: the attach is refused, and the
  // next registration is fenced into a new epoch.
  f.core->DetachNode("b", sink.get());
  const auto late = register_b("i-b");
  CHECK_FALSE(late.fenced());
  CHECK(late.epoch() == e2);
  auto lost_now = [&] {
    for (const auto& n : f.core->TakeSnapshot().nodes) {
      if (n.node_id == "b") return n.lost;
    }
    return false;
  };
  for (int i = 0; i < 10000 && !lost_now(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));  // the 500 ms lease's timer
  }
  REQUIRE(lost_now());
  const Status attach = f.core->AttachNode("b", std::make_shared<RecordingSink>());
  CHECK(attach.code() == StatusCode::kFailedPrecondition);
  const auto e3 = register_b("i-b");
  CHECK(e3.fenced());
  CHECK(e3.epoch() > e2);
  CHECK_FALSE(report_b(8, e2).ok());

  // A restarted daemon (a new instance) starts a new epoch too, but was not fenced: the
  // process that held e3 is gone, and its reports are refused.
  const auto restarted = register_b("i-b2");
  CHECK_FALSE(restarted.fenced());
  CHECK(restarted.epoch() > e3.epoch());
  CHECK_FALSE(report_b(7, e3.epoch()).ok());
  CHECK(report_b(7, restarted.epoch()).ok());

  // A restarted coordinator's epochs are above its predecessor's.
  CoordinatorCore::Config other_config = f.config;
  other_config.storage_root = f.dir / "other-root";
  CoordinatorCore other(other_config, PosixFileSystem());
  REQUIRE(other.Start().ok());
  pb::RegisterNodeRequest req;
  req.set_node_id("b");
  req.set_instance("i-b2");
  auto fresh = other.RegisterNode(req, "test");
  REQUIRE(fresh.ok());
  CHECK(fresh->epoch() > restarted.epoch());
  CHECK_FALSE(fresh->fenced());
}

TEST_CASE("CoordinatorCore recovery commits fully persisted steps and removes the rest",
          "[coordinator_core]") {
  Fixture f;
  const std::string root = f.config.storage_root;
  auto write = [&](uint64_t step, const std::string& node, std::vector<uint32_t> ranks) {
    const std::string dir = StepDir(root, "j", step);
    std::filesystem::create_directories(dir);
    REQUIRE(WriteFileAtomically(PosixFileSystem(), JoinPath(dir, NodeManifestFileName(node)),
                                EncodeNodeManifest(NodeManifestFor("j", step, 4, node, ranks)))
                .ok());
  };
  write(5, "a", {0, 1});
  write(5, "b", {2, 3});  // complete
  write(6, "a", {0, 1});  // b never persisted
  const auto report = f.Start({"a", "b"});
  REQUIRE(report.size() == 2);
  CHECK_THAT(report[0], Contains("step 5: committed"));
  CHECK_THAT(report[1], Contains("step 6: removed"));
  CHECK(std::filesystem::exists(StepDir(root, "j", 5) + "/MANIFEST"));
  CHECK_FALSE(std::filesystem::exists(StepDir(root, "j", 6)));
  CHECK(*PosixFileSystem()->ReadFile(root + "/j/LATEST") == "5\n");
  // Daemons re-reporting after the restart hear what happened.
  CHECK(f.Persisted("b", 6, 4, {2, 3}).decision().state() == pb::STEP_STATE_ABORTED);
  CHECK(f.Persisted("b", 5, 4, {2, 3}).decision().state() == pb::STEP_STATE_COMMITTED);
}

TEST_CASE("CoordinatorCore removes unreported step directories below a committed step",
          "[coordinator_core]") {
  // A daemon killed after creating step 4's files, before its first report left: the
  // coordinator never heard of step 4, and no restart scan of its own is coming.
  Fixture f;
  f.Start({"a", "b"});
  const std::string root = f.config.storage_root;
  std::filesystem::create_directories(StepDir(root, "j", 4));
  REQUIRE(WriteFileAtomically(PosixFileSystem(), JoinPath(StepDir(root, "j", 4), DataFileName(0)),
                              "torn")
              .ok());
  std::filesystem::create_directories(StepDir(root, "j", 9));  // above: may still be reported
  f.Saved("b", 3, 4, {2, 3});  // known and in flight below step 5 while it is reported
  f.Persisted("a", 3, 4, {0, 1});
  f.Persisted("b", 3, 4, {2, 3});
  f.Persisted("a", 5, 4, {0, 1});
  f.Persisted("b", 5, 4, {2, 3});
  auto d = f.sinks["a"]->WaitTerminal("j", 5);
  REQUIRE(d);
  REQUIRE(d->state() == pb::STEP_STATE_COMMITTED);
  f.core->WaitIdle();
  CHECK_FALSE(std::filesystem::exists(StepDir(root, "j", 4)));
  CHECK(std::filesystem::exists(StepDir(root, "j", 3) + "/MANIFEST"));
  CHECK(std::filesystem::exists(StepDir(root, "j", 5) + "/MANIFEST"));
  CHECK(std::filesystem::exists(StepDir(root, "j", 9)));
  // The killed daemon's successor reporting step 4 after all hears it is gone.
  auto late = f.Persisted("a", 4, 4, {0, 1});
  CHECK(late.decision().state() == pb::STEP_STATE_ABORTED);
}

TEST_CASE("CoordinatorCore rejects reports naming ranks outside the world", "[coordinator_core]") {
  Fixture f;
  f.Start({"a"});
  pb::ReportRanksRequest req;
  req.set_node_id("a");
  req.set_job("j");
  req.set_step(1);
  req.set_world_size(2);
  req.set_state(pb::STEP_STATE_PENDING);
  req.add_ranks(5);
  auto r = f.core->ReportRanks(req);
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(r.status().message(), Contains("rank 5"));
  req.set_job("../etc");
  CHECK_FALSE(f.core->ReportRanks(req).ok());
}

// Each node's report is merged as it arrives; these are the cases where that merge is not the
// one committed as is.
TEST_CASE("CoordinatorCore commits a node's growing reports, each rank once",
          "[coordinator_core]") {
  Fixture f;
  f.Start({"a", "b"});
  // A daemon reports again each time another of its ranks persists, and again after a
  // reconnect; only what is new is merged.
  f.Persisted("a", 1, 4, {0});
  f.Persisted("a", 1, 4, {0, 1});
  f.Persisted("a", 1, 4, {0, 1});
  f.Persisted("b", 1, 4, {3});
  SECTION("superset reports") { f.Persisted("b", 1, 4, {2, 3}); }
  SECTION("a stale report, a strict subset of the node's last, arriving late: ignored") {
    // A report retried after its answer was lost, or re-sent on a reconnect, can arrive after
    // a newer one. Ranks once persisted stay persisted: the older, smaller manifest describes
    // nothing new, and taking it as the node's last would commit a MANIFEST without rank 1.
    f.Persisted("a", 1, 4, {1});
    f.Persisted("b", 1, 4, {2, 3});
  }
  const pb::Manifest m = f.CommittedManifest(1);
  REQUIRE(m.ranks_size() == 4);
  for (int r = 0; r < 4; ++r) CHECK(m.ranks(r).rank() == static_cast<uint32_t>(r));
  REQUIRE(m.tensors_size() == 1);
  REQUIRE(m.tensors(0).shards_size() == 4);
  std::vector<uint32_t> writers;
  for (const auto& s : m.tensors(0).shards()) writers.push_back(s.writer_rank());
  std::sort(writers.begin(), writers.end());
  CHECK(writers == std::vector<uint32_t>{0, 1, 2, 3});
  CHECK(f.core->CommitsMergedAfresh() == 0);
}

TEST_CASE("CoordinatorCore fails the step when a smaller report's entries differ from the last",
          "[coordinator_core]") {
  Fixture f;
  f.Start({"a", "b"});
  f.Persisted("a", 1, 4, {0});
  f.Persisted("a", 1, 4, {0, 1});
  // Rank 0's file written anew (other checksums): not an older report, whatever its size.
  f.Persisted("a", 1, 4, {0}, "j", [](pb::NodeManifest& m) {
    m.mutable_tensors(0)->mutable_shards(0)->set_chunk_xxh3(0, 99);
  });
  f.Persisted("b", 1, 4, {2, 3});
  auto d = f.sinks["a"]->WaitTerminal("j", 1);
  REQUIRE(d);
  CHECK(d->state() == pb::STEP_STATE_FAILED);
  CHECK_FALSE(ReadManifest(PosixFileSystem(), StepDir(f.config.storage_root, "j", 1)).ok());
}

TEST_CASE("CoordinatorCore merges afresh a node whose report drops a rank and adds another",
          "[coordinator_core]") {
  Fixture f;
  f.Start({"a", "b"});
  f.Persisted("a", 1, 5, {0});
  f.Persisted("a", 1, 5, {0, 1});
  f.Persisted("a", 1, 5, {1, 2});  // rank 0 is persisted, but this manifest no longer has it
  f.Persisted("a", 1, 5, {0, 1, 2});
  f.Persisted("b", 1, 5, {3, 4});
  CHECK(f.CommittedManifest(1).ranks_size() == 5);
  CHECK(f.core->CommitsMergedAfresh() == 1);
}

TEST_CASE("CoordinatorCore fails a step whose node manifests do not merge, naming both nodes",
          "[coordinator_core]") {
  Fixture f;
  f.Start({"a", "b"});
  f.Persisted("a", 1, 4, {0, 1});
  pb::ReportRanksRequest req;
  req.set_node_id("b");
  req.set_job("j");
  req.set_step(1);
  req.set_world_size(4);
  req.set_state(pb::STEP_STATE_PERSISTED);
  req.add_ranks(2);
  req.add_ranks(3);
  *req.mutable_node_manifest() = NodeManifestFor("j", 1, 4, "b", {2, 3});
  SECTION("another dtype") {
    req.mutable_node_manifest()->mutable_tensors(0)->set_dtype("float32");
  }
  SECTION("a skipped shard nobody wrote") {
    auto* k = req.mutable_node_manifest()->add_skipped();
    k->set_name("w");
    k->set_dtype("int32");
    k->add_global_shape(4);
    k->add_global_shape(1024);
    auto* box = k->mutable_geometry()->mutable_box();
    box->add_offsets(0);
    box->add_offsets(0);
    box->add_lengths(2);  // two rows: no rank wrote that box
    box->add_lengths(1024);
    k->set_rank(3);
  }
  REQUIRE(f.core->ReportRanks(req).ok());
  auto d = f.sinks["a"]->WaitTerminal("j", 1);
  REQUIRE(d);
  CHECK(d->state() == pb::STEP_STATE_FAILED);
  CHECK_THAT(d->reason(), Contains("node 'b'"));
  CHECK_FALSE(std::filesystem::exists(StepDir(f.config.storage_root, "j", 1) + "/MANIFEST"));
  // The next step commits.
  f.Persisted("a", 2, 4, {0, 1});
  f.Persisted("b", 2, 4, {2, 3});
  auto next = f.sinks["a"]->WaitTerminal("j", 2);
  REQUIRE(next);
  CHECK(next->state() == pb::STEP_STATE_COMMITTED);
}

TEST_CASE("CoordinatorCore counts nothing of a refused PERSISTED report", "[coordinator_core]") {
  Fixture f;
  f.Start({"a", "b"});
  pb::ReportRanksRequest bad;
  bad.set_node_id("a");
  bad.set_job("j");
  bad.set_step(1);
  bad.set_world_size(4);
  bad.set_state(pb::STEP_STATE_PERSISTED);
  bad.add_ranks(0);
  *bad.mutable_node_manifest() = NodeManifestFor("j", 1, 4, "a", {0, 9});  // 9: outside the world
  auto refused = f.core->ReportRanks(bad);
  REQUIRE_FALSE(refused.ok());
  CHECK_THAT(refused.status().message(), Contains("rank 9"));
  // Rank 0 is not persisted by the refused report: the step waits for it, then commits whole.
  auto b = f.Persisted("b", 1, 4, {1, 2, 3});
  CHECK_FALSE(b.has_decision());
  f.Persisted("a", 1, 4, {0});
  auto d = f.sinks["a"]->WaitTerminal("j", 1);
  REQUIRE(d);
  CHECK(d->state() == pb::STEP_STATE_COMMITTED);
}

TEST_CASE("CoordinatorCore decides a step replicated once every rank is, beside its commit",
          "[coordinator_core]") {
  Fixture f;
  f.Start({"a", "b"});
  f.Persisted("a", 1, 4, {0, 1});
  f.Persisted("b", 1, 4, {2, 3});
  REQUIRE(f.sinks["a"]->WaitTerminal("j", 1)->state() == pb::STEP_STATE_COMMITTED);
  f.Report("a", 1, 4, {0, 1}, pb::STEP_STATE_REPLICATED);
  CHECK(f.sinks["a"]->Replications("j", 1).empty());  // ranks 2 and 3 are not yet
  f.Report("b", 1, 4, {2}, pb::STEP_STATE_REPLICATED);
  f.Report("b", 1, 4, {3}, pb::STEP_STATE_REPLICATED);
  for (const char* node : {"a", "b"}) {
    const auto r = f.sinks[node]->Replications("j", 1);
    REQUIRE(r.size() == 1);
    CHECK_FALSE(r[0].not_replicated());
  }
  CHECK(*f.core->Latest("j") == std::optional<uint64_t>(1));  // the commit is untouched
}

TEST_CASE(
    "CoordinatorCore decides a step not replicated with the reason, and tells a node "
    "that reports later",
    "[coordinator_core]") {
  Fixture f;
  f.Start({"a", "b"});
  f.Saved("a", 2, 4, {0, 1});
  f.Report("a", 2, 4, {0}, pb::STEP_STATE_REPLICATED, "node 'b' (10.0.0.2:1): peer pool full");
  const auto told_a = f.sinks["a"]->Replications("j", 2);
  REQUIRE(told_a.size() == 1);
  CHECK(told_a[0].not_replicated());
  CHECK_THAT(told_a[0].reason(), Contains("[0] on node 'a'") && Contains("peer pool full"));
  // Node b had not reported the step: its first report's answer carries the decision, once.
  const auto first = f.Report("b", 2, 4, {2, 3}, pb::STEP_STATE_PENDING);
  CHECK(first.decision().state() == pb::STEP_STATE_REPLICATED);
  CHECK(first.decision().not_replicated());
  CHECK_FALSE(f.Report("b", 2, 4, {2, 3}, pb::STEP_STATE_CAPTURED).has_decision());
  // Later reports change nothing: the step still commits.
  f.Report("a", 2, 4, {1}, pb::STEP_STATE_REPLICATED);
  f.Persisted("a", 2, 4, {0, 1});
  f.Persisted("b", 2, 4, {2, 3});
  CHECK(f.sinks["a"]->WaitTerminal("j", 2)->state() == pb::STEP_STATE_COMMITTED);
  CHECK(f.sinks["a"]->Replications("j", 2).size() == 1);
}

TEST_CASE("CoordinatorCore never leaves a replication unanswered: unknown steps and the deadline",
          "[coordinator_core]") {
  Fixture f(std::chrono::milliseconds(1000));  // the step timeout is the replication deadline too
  f.Start({"a", "b"});
  // A step it has no record of (e.g. it restarted): answered not replicated at once.
  const auto unknown = f.Report("a", 9, 2, {0}, pb::STEP_STATE_REPLICATED);
  CHECK(unknown.decision().state() == pb::STEP_STATE_REPLICATED);
  CHECK(unknown.decision().not_replicated());
  CHECK_THAT(unknown.decision().reason(), Contains("no record of the step"));
  // A committed step one of whose ranks never reports its replication: decided at the deadline.
  // Rank 0's report goes at once: the deadline runs from the last report, and the commit's
  // fsyncs may take longer than it on a loaded machine.
  f.Persisted("a", 1, 2, {0});
  f.Persisted("b", 1, 2, {1});
  f.Report("a", 1, 2, {0}, pb::STEP_STATE_REPLICATED);
  REQUIRE(f.sinks["a"]->WaitTerminal("j", 1)->state() == pb::STEP_STATE_COMMITTED);
  const auto decided = f.sinks["b"]->WaitReplication("j", 1);
  REQUIRE(decided);
  CHECK(decided->not_replicated());
  CHECK_THAT(decided->reason(), Contains("[1] not replicated within 1000 ms"));
  // Its late report hears the decision in the answer.
  const auto late = f.Report("b", 1, 2, {1}, pb::STEP_STATE_REPLICATED);
  CHECK(late.decision().not_replicated());
}

TEST_CASE("CoordinatorCore sends each node its holders as nodes register and are lost",
          "[coordinator_core]") {
  Fixture f(std::chrono::minutes(1), std::chrono::milliseconds(20));
  f.config.holder_replan_delay = std::chrono::milliseconds(1);
  f.core = std::make_unique<CoordinatorCore>(f.config, PosixFileSystem());
  REQUIRE(f.core->Start().ok());
  for (const std::string n : {"a", "b", "c"}) {
    pb::RegisterNodeRequest req;
    req.set_node_id(n);
    req.set_instance("i-" + n);
    req.set_peer_address("10.0.0." + n + ":7470");
    req.set_peer_pool_bytes(1 << 30);
    req.set_replicas(1);
    REQUIRE(f.core->RegisterNode(req, "test").ok());
    f.sinks[n] = std::make_shared<RecordingSink>();
    REQUIRE(f.core->AttachNode(n, f.sinks[n]).ok());
  }
  auto holder_of = [&](const std::string& n) { return f.sinks[n]->LastHolders(); };
  REQUIRE(f.sinks["a"]->WaitHolders(1));
  const std::string first = holder_of("a").holders(0).node_id();
  CHECK(first != "a");
  // a's holder is lost (its lease ends): a hears of another.
  f.core->DetachNode(first, f.sinks[first].get());
  REQUIRE(f.sinks["a"]->WaitHolders(1, first));
  CHECK(holder_of("a").holders(0).node_id() != first);
  CHECK(holder_of("a").holders(0).node_id() != "a");
}

}  // namespace
}  // namespace ckpt
