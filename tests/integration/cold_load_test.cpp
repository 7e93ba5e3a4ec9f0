// A whole job restoring from storage on fresh daemons (daemon/coordinator/load_planner.h,
// daemon/load_service.h): one ckpt-coordinator, four ckptd with --peer-listen, one rank each.
// The job saves a step, every daemon is replaced by a fresh one (nothing of the step in memory),
// and the four ranks load it at once. Each stored byte that several nodes need is read from
// storage by one of them and fetched by the others over the data plane: the daemons' storage
// reads together stay within 1.25× the step's unique bytes (data parallel 4, and TP 2 × DP 2),
// and every rank gets its values bit-exact. A serving daemon that stalls (SIGSTOP) and then dies
// mid-load costs its fetchers a storage read, never the load.
#include "tests/integration/coordinator_harness.h"  // first: it configures Catch

#include "tests/integration/admin_client.h"
#include "tests/integration/http_scrape.h"

#include <future>

namespace ckpt::itest {
namespace {

constexpr uint32_t kTensors = 24;  // ~20 MiB of unique state
constexpr int kNodes = 4;
const std::string kJob = "cold";

std::string MetricsAddress(const DaemonProcess& d) {
  auto admin = ckptd::v1::Admin::NewStub(
      grpc::CreateChannel("unix:" + d.admin_socket(), grpc::InsecureChannelCredentials()));
  return ConfigValue(GetStatus(*admin), "metrics-bound");
}

double Metric(const DaemonProcess& d, const std::string& series) {
  return std::max(0.0, Sample(HttpGet(MetricsAddress(d), "/metrics"), series));
}

std::vector<std::string> NodeFlags(std::vector<std::string> more = {}) {
  std::vector<std::string> flags = {"--peer-listen", "127.0.0.1:0", "--host-pool", "128MiB"};
  flags.insert(flags.end(), more.begin(), more.end());
  return flags;
}

// Saves step 1 of a 4-rank job of tensor-parallel degree `tp` on daemons that then stop.
void SaveStepOne(const testing::TempDir& dir, const std::string& root,
                 const std::string& coordinator, uint32_t tp) {
  auto nodes = StartNodes(dir, root, coordinator, kNodes, NodeFlags());
  std::vector<std::unique_ptr<ModelRank>> ranks;
  for (int i = 0; i < kNodes; ++i) {
    ranks.push_back(std::make_unique<ModelRank>(nodes[i]->socket(), kJob, i, kNodes, tp, kTensors));
  }
  for (auto& r : ranks) REQUIRE_OK(r->SaveStep(1));
  for (auto& r : ranks) REQUIRE_OK(r->WaitCommitted(1));
  ranks.clear();
  for (auto& n : nodes) CHECK(n->Terminate() == 0);
}

struct Ranks {
  std::vector<std::unique_ptr<DaemonProcess>> nodes;
  std::vector<std::unique_ptr<ModelRank>> ranks;
};
Ranks FreshRanks(const testing::TempDir& dir, const std::string& root,
                 const std::string& coordinator, uint32_t tp, std::vector<std::string> flags) {
  Ranks out;
  out.nodes = StartNodes(dir, root, coordinator, kNodes, NodeFlags(std::move(flags)));
  for (int i = 0; i < kNodes; ++i) {
    out.ranks.push_back(
        std::make_unique<ModelRank>(out.nodes[i]->socket(), kJob, i, kNodes, tp, kTensors));
  }
  return out;
}

void ColdLoadReadsOnce(uint32_t tp) {
  testing::TempDir dir, fresh_dir;
  const std::string root = dir / "root";
  CoordinatorProcess coordinator({dir / "coordinator.sock", root, dir / "coordinator.log", {}, {}});
  SaveStepOne(dir, root, coordinator.address(), tp);
  const auto unique = static_cast<double>(testing::CoordinatorModel::UniqueBytes(kTensors));

  auto job = FreshRanks(fresh_dir, root, coordinator.address(), tp, {});
  std::vector<std::future<Result<uint64_t>>> loads;
  for (auto& r : job.ranks) {
    loads.push_back(std::async(std::launch::async, [&r] { return r->LoadAndCheck(1); }));
  }
  for (auto& l : loads) {
    auto mismatches = l.get();
    REQUIRE_OK(mismatches);
    CHECK(*mismatches == 0);
  }
  double read = 0, received = 0;
  for (auto& n : job.nodes) {
    read += Metric(*n, "ckptd_read_bytes_total{source=\"storage\"}");
    received += Metric(*n, "ckptd_peer_bytes_total{direction=\"received\"}");
  }
  INFO("storage bytes read by the four daemons " << read << ", unique bytes " << unique
                                                 << ", bytes received from peers " << received);
  CHECK(read >= unique);
  CHECK(read <= 1.25 * unique);
  // Without the plan each node would read what its ranks need: DP 4 reads 4×, TP 2 × DP 2 2×.
  CHECK(received >= (tp == 1 ? 2.5 : 0.8) * unique);
}

TEST_CASE("cold load across nodes: data parallel 4 reads each stored byte once", "[cold_load]") {
  ColdLoadReadsOnce(1);
}

TEST_CASE("cold load across nodes: TP 2 x DP 2 reads each stored byte once", "[cold_load]") {
  ColdLoadReadsOnce(2);
}

TEST_CASE("cold load across nodes: a serving daemon that stalls, then dies, costs a storage read",
          "[cold_load]") {
  testing::TempDir dir, fresh_dir;
  const std::string root = dir / "root";
  CoordinatorProcess coordinator({dir / "coordinator.sock", root, dir / "coordinator.log", {}, {}});
  SaveStepOne(dir, root, coordinator.address(), 1);

  auto job = FreshRanks(fresh_dir, root, coordinator.address(), 1, {"--peer-timeout", "1s"});
  // Rank 3 asks first; its daemon is frozen while the coordinator waits for the others, so the
  // plan names it as the reader of a quarter of the bytes that it will never serve.
  auto last = std::async(std::launch::async, [&] { return job.ranks[3]->LoadAndCheck(1); });
  // Frozen only once the coordinator counted its ask (it answered "wait for the others").
  REQUIRE(PollUntil([&] {
    return job.nodes[3]->Log().find("the coordinator waits for the job's other ranks") !=
           std::string::npos;
  }));
  job.nodes[3]->Kill(SIGSTOP);
  std::vector<std::future<Result<uint64_t>>> loads;
  for (int i = 0; i < 3; ++i) {
    loads.push_back(
        std::async(std::launch::async, [&, i] { return job.ranks[i]->LoadAndCheck(1); }));
  }
  for (auto& l : loads) {
    auto mismatches = l.get();
    REQUIRE_OK(mismatches);
    CHECK(*mismatches == 0);
  }
  for (int i = 0; i < 3; ++i) {
    CHECK_THAT(job.nodes[i]->Log(),
               Catch::Contains("leaving its ranges to their other holders or storage"));
  }
  // Dead for good now: rank 3's load fails with its daemon, and the others still load, from
  // storage, what it was to serve.
  job.nodes[3]->Kill(SIGKILL);
  CHECK_FALSE(last.get().ok());
  for (int i = 0; i < 3; ++i) {
    auto again = job.ranks[i]->LoadAndCheck(1);
    REQUIRE_OK(again);
    CHECK(*again == 0);
  }
}

}  // namespace
}  // namespace ckpt::itest
