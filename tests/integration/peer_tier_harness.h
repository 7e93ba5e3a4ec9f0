// The peer-memory tier's tests on real processes: one ckpt-coordinator and a few ckptd with a
// data plane (--peer-listen), a peer pool and --replicas, one rank of the coordinator model each
// (tests/integration/coordinator_harness.h), and what the tests ask of them: a daemon's peer
// status and metrics, the coordinator's view of a memory-only step's copies.
#pragma once

#include "tests/integration/coordinator_harness.h"  // first: it configures Catch

#include <algorithm>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "tests/integration/admin_client.h"
#include "tests/integration/http_scrape.h"

namespace ckpt::itest {

inline constexpr uint32_t kTensors = 12;
inline const std::string kJob = "replicas";

inline std::vector<std::string> TierFlags(const std::string& replicas) {
  return {"--peer-listen", "127.0.0.1:0", "--peer-pool", "64MiB",
          "--host-pool",   "96MiB",       "--replicas",  replicas};
}

inline ckptd::v1::GetStatusResponse StatusOf(const DaemonProcess& d) {
  auto admin = ckptd::v1::Admin::NewStub(
      grpc::CreateChannel("unix:" + d.admin_socket(), grpc::InsecureChannelCredentials()));
  return GetStatus(*admin);
}

inline double Metric(const DaemonProcess& d, const std::string& series) {
  const std::string address = ConfigValue(StatusOf(d), "metrics-bound");
  return std::max(0.0, Sample(HttpGet(address, "/metrics"), series));
}

// Until every node heard its holders from the coordinator (they are planned as nodes register).
inline void WaitForHolders(const std::vector<std::unique_ptr<DaemonProcess>>& nodes, int each) {
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

// Every rank saves step 1 to storage (committed), then step 2 memory-only (replicated).
inline void SaveCommittedThenMemoryOnly(std::vector<std::unique_ptr<ModelRank>>& ranks) {
  for (auto& r : ranks) REQUIRE_OK(r->SaveStep(1));
  for (auto& r : ranks) REQUIRE_OK(r->WaitCommitted(1));
  for (auto& r : ranks) REQUIRE_OK(r->SaveStep(2, /*persist=*/false));
  for (auto& r : ranks) {
    REQUIRE_OK(r->client().Wait(2, WaitState::kReplicated, std::chrono::seconds(60)));
  }
}

// The nodes the coordinator counts as holding rank `rank` of a memory-only step in memory now.
inline std::vector<std::string> CopiesOf(const CoordinatorProcess& coordinator, uint64_t step,
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

// What the coordinator's status says of node `id` (empty when it lists no such node).
inline ckptd::v1::NodeStatus NodeOn(const CoordinatorProcess& coordinator, const std::string& id) {
  auto admin = ckptd::v1::Admin::NewStub(
      grpc::CreateChannel(coordinator.address(), grpc::InsecureChannelCredentials()));
  const auto status = GetStatus(*admin);
  for (const auto& n : status.nodes()) {
    if (n.node_id() == id) return n;
  }
  return {};
}

// Whether the coordinator has node `id`'s event stream open.
inline bool Connected(const CoordinatorProcess& coordinator, const std::string& id) {
  return NodeOn(coordinator, id).connected();
}

inline bool Has(const std::vector<std::string>& v, const std::string& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

// Every rank loads `step` at once (a restart of the whole job: one load round) and must get it
// bit-exactly.
inline void LoadEveryRankAndCheck(std::vector<std::unique_ptr<ModelRank>>& ranks, uint64_t step) {
  std::vector<std::future<Result<uint64_t>>> loads;
  for (auto& r : ranks) {
    loads.push_back(std::async(std::launch::async, [&r, step] { return r->LoadAndCheck(step); }));
  }
  for (auto& l : loads) {
    auto mismatches = l.get();
    REQUIRE_OK(mismatches);
    CHECK(*mismatches == 0);
  }
}

// The tier trains on after a failure: once every node has its holder again, a persisted `step` on
// every rank commits, is replicated, and restores bit-exactly on every rank.
inline void TrainsOn(const std::vector<std::unique_ptr<DaemonProcess>>& nodes,
                     std::vector<std::unique_ptr<ModelRank>>& ranks, uint64_t step) {
  WaitForHolders(nodes, 1);
  for (auto& r : ranks) REQUIRE_OK(r->SaveStep(step));
  for (auto& r : ranks) {
    REQUIRE_OK(r->WaitCommitted(step));
    REQUIRE_OK(r->client().Wait(step, WaitState::kReplicated, std::chrono::seconds(60)));
  }
  LoadEveryRankAndCheck(ranks, step);
}

// A fresh daemon (node id `id`, nothing in memory) joining the tier of `t`: a lost node's
// replacement.
inline std::unique_ptr<DaemonProcess> JoinTier(const Tier& t, const std::string& id,
                                               const std::string& replicas = "1",
                                               const std::vector<std::string>& more_flags = {}) {
  DaemonProcess::Options o;
  o.socket = t.dir / (id + ".sock");
  o.storage_root = t.root;
  o.log_path = t.dir / (id + ".log");
  o.flags = {"--node-id", id, "--coordinator", t.coordinator.address()};
  for (const auto& f : TierFlags(replicas)) o.flags.push_back(f);
  for (const auto& f : more_flags) o.flags.push_back(f);
  return std::make_unique<DaemonProcess>(o);
}

}  // namespace ckpt::itest
