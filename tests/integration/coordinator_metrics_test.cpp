// ckpt-coordinator's `--metrics`: a real coordinator serving Prometheus text on an ephemeral
// port (found the way an operator finds it: the admin status' `metrics-bound`, also logged),
// two real daemons and a job of two in-process ranks, one per node. After a step commits, a
// scrape over HTTP shows the job's committed step and commit count, the registrations the
// coordinator received (count and serialized bytes), the writer plan, the nodes and the commit
// latency. The daemons' own pages show the job under its `job` label.
// coordinator_harness.h includes daemon_harness.h first (it configures Catch).
#include "tests/integration/coordinator_harness.h"

#include <grpcpp/grpcpp.h>

#include "ckptd/v1/admin.grpc.pb.h"
#include "tests/integration/admin_client.h"
#include "tests/integration/http_scrape.h"

namespace {

using ckpt::itest::ConfigValue;
using ckpt::itest::CoordinatorProcess;
using ckpt::itest::GetStatus;
using ckpt::itest::HttpGet;
using ckpt::itest::ModelRank;
using ckpt::itest::PollUntil;
using ckpt::itest::Sample;
using ckpt::itest::StartNodes;
using ckpt::itest::WaitForWriterPlans;
using ckpt::testing::TempDir;

// A coordinator serving /metrics on an ephemeral port, and that port (from its admin status).
struct ScrapedCoordinator {
  explicit ScrapedCoordinator(const TempDir& dir)
      : coordinator(CoordinatorProcess::Options{dir / "coord.sock",
                                                dir / "root",
                                                dir / "coordinator.log",
                                                {"--metrics", "127.0.0.1:0"},
                                                {}}) {
    auto admin = ckptd::v1::Admin::NewStub(
        grpc::CreateChannel(coordinator.address(), grpc::InsecureChannelCredentials()));
    metrics = ConfigValue(GetStatus(*admin), "metrics-bound");
    REQUIRE_THAT(metrics, Catch::StartsWith("127.0.0.1:"));
  }
  CoordinatorProcess coordinator;
  std::string metrics;  // host:port
};

}  // namespace

TEST_CASE("coordinator metrics: a scrape shows the job's commit, registrations and nodes",
          "[coordinator][metrics][ops]") {
  TempDir dir;
  ScrapedCoordinator scraped(dir);
  const CoordinatorProcess& coordinator = scraped.coordinator;
  const std::string& metrics = scraped.metrics;
  CHECK_THAT(coordinator.Log(),
             Catch::Contains("metrics: Prometheus endpoint http://" + metrics + "/metrics"));

  const std::string before = HttpGet(metrics, "/metrics");
  CHECK(Sample(before, "ckpt_coordinator_nodes_registered") == 0);
  CHECK(Sample(before, "ckpt_coordinator_registration_bytes_total") == 0);
  CHECK(Sample(before, "ckpt_coordinator_commits_total{job=\"scraped\"}") == -1);

  auto nodes = StartNodes(dir, dir / "root", coordinator.address(), 2);
  {
    ModelRank r0(nodes[0]->socket(), "scraped", 0, 2, 1, 4);
    ModelRank r1(nodes[1]->socket(), "scraped", 1, 2, 1, 4);
    REQUIRE_OK(r0.SaveStep(3));
    REQUIRE_OK(r1.SaveStep(3));
    REQUIRE_OK(r0.WaitCommitted(3));
    REQUIRE_OK(r1.WaitCommitted(3));

    std::string page;
    // The plan follows the registrations asynchronously (daemon → coordinator): wait for it.
    REQUIRE(PollUntil([&] {
      page = HttpGet(metrics, "/metrics");
      return Sample(page, "ckpt_coordinator_plan_computations_total") >= 1;
    }));
    INFO(page);
    CHECK(Sample(page, "ckpt_coordinator_last_committed_step{job=\"scraped\"}") == 3);
    CHECK(Sample(page, "ckpt_coordinator_commits_total{job=\"scraped\"}") == 1);
    CHECK(Sample(page, "ckpt_coordinator_aborted_steps_total{job=\"scraped\"}") == -1);
    CHECK(Sample(page, "ckpt_coordinator_registration_requests_total") >= 2);
    CHECK(Sample(page, "ckpt_coordinator_registration_bytes_total") > 0);
    CHECK(Sample(page, "ckpt_coordinator_plan_duration_seconds_count") >= 1);
    CHECK(Sample(page, "ckpt_coordinator_commit_latency_seconds_count") == 1);
    CHECK(Sample(page, "ckpt_coordinator_nodes_registered") == 2);
    CHECK(Sample(page, "ckpt_coordinator_nodes_alive") == 2);
    CHECK(Sample(page, "ckpt_coordinator_jobs") == 1);
    CHECK(Sample(page, "ckpt_coordinator_build_info{version=\"0.1.0\"}") == 1);

    // Each daemon counts the commit under the job's label, and still in its node total.
    for (const auto& node : nodes) {
      auto node_admin = ckptd::v1::Admin::NewStub(
          grpc::CreateChannel("unix:" + node->admin_socket(), grpc::InsecureChannelCredentials()));
      const std::string bound = ConfigValue(GetStatus(*node_admin), "metrics-bound");
      REQUIRE_THAT(bound, Catch::StartsWith("127.0.0.1:"));
      const std::string daemon_page = HttpGet(bound, "/metrics");
      CHECK(Sample(daemon_page, "ckptd_job_steps_committed_total{job=\"scraped\"}") == 1);
      CHECK(Sample(daemon_page, "ckptd_job_last_committed_step{job=\"scraped\"}") == 3);
      CHECK(Sample(daemon_page, "ckptd_steps_committed_total") == 1);
    }
  }
}

// Registration by fingerprint on the real path (daemon/rpc/coordinator_link.cc →
// ckpt-coordinator): four data-parallel ranks of one layout on two daemons send that layout
// once; the other three name it by its fingerprint.
TEST_CASE("coordinator metrics: N ranks of one layout send it once",
          "[coordinator][metrics][registration]") {
  TempDir dir;
  ScrapedCoordinator scraped(dir);
  const CoordinatorProcess& coordinator = scraped.coordinator;
  const std::string& metrics = scraped.metrics;

  auto nodes = StartNodes(dir, dir / "root", coordinator.address(), 2);
  constexpr uint32_t kWorld = 4;
  std::vector<std::unique_ptr<ModelRank>> ranks;
  for (uint32_t r = 0; r < kWorld; ++r) {
    ranks.push_back(std::make_unique<ModelRank>(nodes[r % 2]->socket(), "dp", r, kWorld,
                                                /*tp=*/1, /*tensors=*/16));
  }
  for (auto& r : ranks) REQUIRE_OK(r->SaveStep(1));
  for (auto& r : ranks) REQUIRE_OK(r->WaitCommitted(1));
  WaitForWriterPlans({nodes[0].get(), nodes[1].get()}, "dp", {0, 0});
  std::string page;
  REQUIRE(PollUntil([&] {
    page = HttpGet(metrics, "/metrics");
    return Sample(page, "ckpt_coordinator_plan_computations_total") >= 1;
  }));
  INFO(page);
  CHECK(Sample(page, "ckpt_coordinator_layouts_received_total") == 1);
  CHECK(Sample(page, "ckpt_coordinator_layouts") == 1);
  CHECK(Sample(page, "ckpt_coordinator_registration_requests_total") >= kWorld);
  const double layout = Sample(page, "ckpt_coordinator_layout_bytes_total");
  const double all = Sample(page, "ckpt_coordinator_registration_bytes_total");
  CHECK(layout > 16 * 20);  // 16 shard keys
  // Everything else is a few dozen bytes per request: job, rank, ids and the fingerprint.
  CHECK(all - layout < 200 * (Sample(page, "ckpt_coordinator_registration_requests_total")));
  CHECK(all < 2 * layout + 1000);

  // The plan is in force: the next step is written once per replica, and commits.
  for (auto& r : ranks) REQUIRE_OK(r->SaveStep(2));
  for (auto& r : ranks) REQUIRE_OK(r->WaitCommitted(2));
  // What each rank left to another was named by its registration in the reports, not listed
  // shard by shard (NodeManifest.skipped_under): 3 of 4 copies of 16 shards at least once each.
  page = HttpGet(metrics, "/metrics");
  INFO(page);
  CHECK(Sample(page, "ckpt_coordinator_skipped_shards_reported_total{how=\"listed\"}") == 0);
  CHECK(Sample(page, "ckpt_coordinator_skipped_shards_reported_total{how=\"by_registration\"}") >=
        3 * 16);
}
