// DaemonMetrics' per-job series (ckptd_job_*{job=...}): two jobs on one daemon get separate
// series, a hostile job name cannot break the text exposition, and the forgetting rule removes
// an idle job's series (after forget_after, or oldest idle first beyond max_idle_jobs) while
// never touching a job with a session or a step in flight.
#include <catch2/catch.hpp>

#include <sstream>

#include "daemon/admin/daemon_metrics.h"
#include "tests/test_util.h"

namespace ckpt {
namespace {

using std::chrono::minutes;
using std::chrono::steady_clock;

double Sample(const std::string& page, const std::string& series) {
  std::istringstream in(page);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(series + " ", 0) == 0) return std::stod(line.substr(series.size() + 1));
  }
  return -1;
}

// A daemon's metrics with a clock the test moves.
struct Fixture {
  Fixture(size_t max_idle = 16) {
    auto p = HostPool::Create({8ull << 20, 1ull << 20, false});
    REQUIRE_OK(p);
    pool = std::move(p).value();
    hot = std::make_unique<HotCache>(pool.get());
    DaemonMetrics::JobSeriesOptions o;
    o.forget_after = minutes(60);
    o.max_idle_jobs = max_idle;
    o.now = [this] { return now; };
    m = std::make_unique<DaemonMetrics>("1", "node", pool.get(), hot.get(),
                                        DaemonMetrics::StorageProbe{}, o);
  }
  // One committed step of `job` with no session left behind.
  void Commit(const std::string& job, uint64_t step) {
    m->OnStepState(job, step, ckptd::v1::STEP_STATE_CAPTURING, "");
    m->OnRankCaptured(job, step, 0, 100, 0.01);
    m->OnRankPersisted(job, step, 0, 100, 0.01);
    m->OnStepState(job, step, ckptd::v1::STEP_STATE_COMMITTED, "");
  }
  steady_clock::time_point now = steady_clock::now();
  std::unique_ptr<HostPool> pool;
  std::unique_ptr<HotCache> hot;
  std::unique_ptr<DaemonMetrics> m;
};

TEST_CASE("metrics: two jobs on one daemon get separate job-labelled series", "[admin][metrics]") {
  Fixture f;
  f.Commit("alpha", 10);
  f.Commit("alpha", 20);
  f.Commit("beta", 7);
  f.m->OnStepState("beta", 8, ckptd::v1::STEP_STATE_CAPTURING, "");
  f.m->OnStepState("beta", 8, ckptd::v1::STEP_STATE_FAILED, "rank 0 skipped: the pool is full");
  f.m->OnStepState("beta", 9, ckptd::v1::STEP_STATE_CAPTURING, "");

  const std::string page = f.m->Render();
  CHECK(Sample(page, "ckptd_job_steps_committed_total{job=\"alpha\"}") == 2);
  CHECK(Sample(page, "ckptd_job_steps_committed_total{job=\"beta\"}") == 1);
  CHECK(Sample(page, "ckptd_job_last_committed_step{job=\"alpha\"}") == 20);
  CHECK(Sample(page, "ckptd_job_last_committed_step{job=\"beta\"}") == 7);
  CHECK(Sample(page, "ckptd_job_saves_started_total{job=\"alpha\"}") == 2);
  CHECK(Sample(page, "ckptd_job_saves_started_total{job=\"beta\"}") == 3);
  CHECK(Sample(page, "ckptd_job_step_failures_total{job=\"beta\",reason=\"pool_full_skip\"}") == 1);
  CHECK(Sample(page, "ckptd_job_step_failures_total{job=\"alpha\",reason=\"pool_full_skip\"}") ==
        -1);
  CHECK(Sample(page, "ckptd_job_steps_in_flight{job=\"alpha\"}") == 0);
  CHECK(Sample(page, "ckptd_job_steps_in_flight{job=\"beta\"}") == 1);
  CHECK(Sample(page, "ckptd_job_captured_bytes_total{job=\"alpha\"}") == 200);
  CHECK(Sample(page, "ckptd_job_persisted_bytes_total{job=\"beta\"}") == 100);
  CHECK(Sample(page, "ckptd_job_last_commit_timestamp_seconds{job=\"beta\"}") > 1.7e9);
  // The node-wide totals are unchanged: the sum over both jobs, unlabelled.
  CHECK(Sample(page, "ckptd_steps_committed_total") == 3);
  CHECK(Sample(page, "ckptd_captured_bytes_total") == 300);
  CHECK(Sample(page, "ckptd_steps_in_flight") == 1);
  CHECK(Sample(page, "ckptd_step_failures_total{reason=\"pool_full_skip\"}") == 1);
}

TEST_CASE("metrics: a hostile job name cannot break the exposition format", "[admin][metrics]") {
  Fixture f;
  const std::string hostile = "evil\"} 1\nckptd_fake_total 99\n\\x{job=\"";
  f.Commit(hostile, 5);
  const std::string page = f.m->Render();
  // Escaped per the text format: \ → \\, " → \", newline → \n.
  const std::string escaped = "evil\\\"} 1\\nckptd_fake_total 99\\n\\\\x{job=\\\"";
  CHECK(Sample(page, "ckptd_job_steps_committed_total{job=\"" + escaped + "\"}") == 1);
  CHECK(Sample(page, "ckptd_job_last_committed_step{job=\"" + escaped + "\"}") == 5);
  // No injected line: every line is a comment or starts with a real metric name.
  std::istringstream in(page);
  for (std::string line; std::getline(in, line);) {
    INFO(line);
    CHECK((line.empty() || line[0] == '#' || line.rfind("ckptd_", 0) == 0));
    CHECK(line.rfind("ckptd_fake_total", 0) != 0);
  }
}

TEST_CASE("metrics: an idle job's series are forgotten after forget_after", "[admin][metrics]") {
  Fixture f;
  f.m->OnClientConnected({1, "live", 0, 1, 100, 1000});
  f.Commit("live", 1);
  f.Commit("done", 1);
  f.m->OnStepState("stuck", 3, ckptd::v1::STEP_STATE_CAPTURING, "");  // no session, in flight
  REQUIRE(f.m->jobs_tracked() == 3);

  f.now += minutes(59);
  CHECK(f.m->jobs_tracked() == 3);
  CHECK(Sample(f.m->Render(), "ckptd_job_steps_committed_total{job=\"done\"}") == 1);

  f.now += minutes(2);  // "done" idle 61 min: gone; "live" has a session, "stuck" a step
  const std::string page = f.m->Render();
  CHECK(f.m->jobs_tracked() == 2);
  CHECK(page.find("job=\"done\"") == std::string::npos);
  CHECK(Sample(page, "ckptd_job_steps_committed_total{job=\"live\"}") == 1);
  CHECK(Sample(page, "ckptd_job_steps_in_flight{job=\"stuck\"}") == 1);
  CHECK(Sample(page, "ckptd_steps_committed_total") == 2);  // node totals never forget

  // The session ends: the idle clock starts then, not at the job's last step.
  f.m->OnClientDisconnected(1);
  f.now += minutes(30);
  CHECK(f.m->Render().find("job=\"live\"") != std::string::npos);
  f.now += minutes(31);
  CHECK(f.m->Render().find("job=\"live\"") == std::string::npos);

  // The stuck step ends: idle from then on.
  f.m->OnStepState("stuck", 3, ckptd::v1::STEP_STATE_ABORTED, "ranks [1] did not save step 3");
  CHECK(Sample(f.m->Render(), "ckptd_job_step_failures_total{job=\"stuck\",reason=\"timeout\"}") ==
        1);
  f.now += minutes(61);
  CHECK(f.m->jobs_tracked() == 1);  // counted until the next event or scrape
  f.m->Render();
  CHECK(f.m->jobs_tracked() == 0);

  // A forgotten job that comes back starts from zero.
  f.Commit("done", 2);
  CHECK(Sample(f.m->Render(), "ckptd_job_steps_committed_total{job=\"done\"}") == 1);
}

TEST_CASE("metrics: beyond max_idle_jobs the longest idle jobs are forgotten first",
          "[admin][metrics]") {
  Fixture f(/*max_idle=*/3);
  f.m->OnClientConnected({9, "busy", 0, 1, 100, 1000});
  for (int i = 0; i < 10; ++i) {
    f.Commit("job" + std::to_string(i), 1);
    f.now += minutes(1);
  }
  // Ten idle jobs seen, three kept: the newest ones; the job with a session is kept too.
  const std::string page = f.m->Render();
  CHECK(f.m->jobs_tracked() == 4);
  for (int i = 0; i < 7; ++i) {
    CHECK(page.find("job=\"job" + std::to_string(i) + "\"") == std::string::npos);
  }
  for (int i = 7; i < 10; ++i) {
    CHECK(Sample(page, "ckptd_job_steps_committed_total{job=\"job" + std::to_string(i) + "\"}") ==
          1);
  }
  CHECK(Sample(page, "ckptd_job_saves_started_total{job=\"busy\"}") == 0);
}

}  // namespace
}  // namespace ckpt
