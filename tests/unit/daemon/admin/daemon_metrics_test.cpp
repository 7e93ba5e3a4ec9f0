// DaemonMetrics as a scrape renders it: counters and histograms move with observer events,
// failure reasons map onto the fixed label set, pool bytes add up to the pool, and no label
// carries a step (the series count stays constant however many steps run). The per-job series
// (ckptd_job_*) are in daemon_metrics_jobs_test.cpp.
#include <catch2/catch.hpp>

#include <sstream>

#include "daemon/admin/daemon_metrics.h"
#include "tests/test_util.h"

namespace ckpt {
namespace {

double Sample(const std::string& page, const std::string& series) {
  std::istringstream in(page);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(series + " ", 0) == 0) return std::stod(line.substr(series.size() + 1));
  }
  return -1;
}

size_t SeriesCount(const std::string& page) {
  std::istringstream in(page);
  size_t n = 0;
  for (std::string line; std::getline(in, line);) n += !line.empty() && line[0] != '#';
  return n;
}

TEST_CASE("metrics: failure reasons map onto a fixed vocabulary", "[admin][metrics]") {
  CHECK(FailureReasonLabel("ranks [1, 3] did not save step 7 within 600000 ms") == "timeout");
  CHECK(FailureReasonLabel("rank 2 (pid 9) disconnected before its snapshot of step 3 was "
                           "captured") == "rank_disconnected");
  CHECK(FailureReasonLabel("rank 0 skipped: the host pool is full") == "pool_full_skip");
  CHECK(FailureReasonLabel("rank 1 write failed: No space left on device") == "write_error");
  CHECK(FailureReasonLabel("rank 1 capture failed: bad address") == "capture_error");
  CHECK(FailureReasonLabel("commit failed: EIO") == "commit_error");
  CHECK(FailureReasonLabel("the daemon shut down before the step was persisted") == "shutdown");
  CHECK(FailureReasonLabel("something new") == "other");
}

TEST_CASE("metrics: observer events move the series, no per-step labels", "[admin][metrics]") {
  auto pool = HostPool::Create({8ull << 20, 1ull << 20, false});
  REQUIRE_OK(pool);
  HotCache hot(pool->get());
  DaemonMetrics m("9.9.9", "node-a", pool->get(), &hot);
  const std::string empty = m.Render();
  CHECK(Sample(empty, "ckptd_build_info{node=\"node-a\",version=\"9.9.9\"}") == 1);
  CHECK(Sample(empty, "ckptd_pool_bytes{state=\"free\"}") == 8 << 20);
  CHECK(Sample(empty, "ckptd_pool_bytes{state=\"in_use\"}") == 0);

  auto slot = (*pool)->Acquire(nullptr);  // a capture holds one slot
  REQUIRE(slot.has_value());
  for (uint64_t step = 1; step <= 50; ++step) {
    m.OnStepState("job", step, ckptd::v1::STEP_STATE_CAPTURING, "");
    m.OnRankCaptured("job", step, 0, 1000, 0.01);
    m.OnRankPersisted("job", step, 0, 1000, 0.2);
    m.OnStepState("job", step, ckptd::v1::STEP_STATE_COMMITTED, "");
  }
  m.OnStepState("job", 51, ckptd::v1::STEP_STATE_CAPTURING, "");
  m.OnStepState("job", 52, ckptd::v1::STEP_STATE_CAPTURING, "");
  m.OnStepState("job", 52, ckptd::v1::STEP_STATE_ABORTED, "ranks [1] did not save step 52");
  // A memory-only step ends replicated: no longer in flight, not committed.
  m.OnStepState("job", 53, ckptd::v1::STEP_STATE_CAPTURING, "");
  m.OnStepState("job", 53, ckptd::v1::STEP_STATE_REPLICATED, "");
  m.OnLoad("job", 50, 300, 700, 0.5);
  m.OnClientConnected({7, "job", 0, 1, 123, 1000});

  const std::string page = m.Render();
  CHECK(Sample(page, "ckptd_captured_bytes_total") == 50000);
  CHECK(Sample(page, "ckptd_persisted_bytes_total") == 50000);
  CHECK(Sample(page, "ckptd_steps_committed_total") == 50);
  CHECK(Sample(page, "ckptd_steps_in_flight") == 1);                   // step 51
  CHECK(Sample(page, "ckptd_steps_replicated_in_memory_total") == 1);  // step 53
  CHECK(Sample(page, "ckptd_step_failures_total{reason=\"timeout\"}") == 1);
  CHECK(Sample(page, "ckptd_capture_duration_seconds_count") == 50);
  CHECK(Sample(page, "ckptd_flush_duration_seconds_sum") == Approx(10.0));
  CHECK(Sample(page, "ckptd_read_bytes_total{source=\"memory\"}") == 300);
  CHECK(Sample(page, "ckptd_read_bytes_total{source=\"storage\"}") == 700);
  CHECK(Sample(page, "ckptd_connected_clients") == 1);
  CHECK(Sample(page, "ckptd_last_commit_timestamp_seconds") > 1.7e9);
  CHECK(Sample(page, "ckptd_pool_bytes{state=\"in_use\"}") == 1 << 20);
  CHECK(Sample(page, "ckptd_pool_bytes{state=\"free\"}") == 7 << 20);
  CHECK(page.find("step=") == std::string::npos);
  // Job labels only on the ckptd_job_* families: the node-wide names stay unlabelled.
  std::istringstream lines(page);
  for (std::string line; std::getline(lines, line);) {
    if (line.find("job=") != std::string::npos) CHECK(line.rfind("ckptd_job_", 0) == 0);
  }

  // Another 50 steps of a job already seen add no series.
  const size_t series = SeriesCount(page);
  for (uint64_t step = 100; step < 150; ++step) {
    m.OnStepState("job", step, ckptd::v1::STEP_STATE_CAPTURING, "");
    m.OnStepState("job", step, ckptd::v1::STEP_STATE_COMMITTED, "");
  }
  CHECK(SeriesCount(m.Render()) == series);
  (*pool)->Release(*slot);
}

}  // namespace
}  // namespace ckpt
