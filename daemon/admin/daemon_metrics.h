// DaemonMetrics: the daemon's Prometheus metrics, served over HTTP on /metrics by the shared
// endpoint (metrics_endpoint.h; `--metrics ADDR`, loopback by default; empty disables it).
//
// Naming follows Prometheus conventions: `ckptd_` prefix, base units (bytes, seconds), `_total`
// for counters, never a per-step label. Node-wide series (unlabelled, or labelled by state or
// source only):
//   ckptd_build_info{version,node}                    1
//   ckptd_captured_bytes_total, ckptd_persisted_bytes_total
//   ckptd_read_bytes_total{source="memory"|"storage"} bytes restored by loads; "storage" also
//                              counts what a load read for other nodes and what the data plane
//                              read from storage to serve them: all of this daemon's reads
//   ckptd_capture_duration_seconds                    histogram, save accepted → rank captured
//   ckptd_flush_duration_seconds                      histogram, rank captured → rank persisted
//   ckptd_load_duration_seconds                       histogram
//   ckptd_pool_bytes{state="free"|"cached"|"in_use"}  sampled at scrape time
//   ckptd_steps_in_flight                             steps neither committed, aborted nor failed
//                                                     (nor, memory-only, replicated)
//   ckptd_steps_committed_total
//   ckptd_steps_replicated_in_memory_total            memory-only steps that ended replicated
//   ckptd_step_failures_total{reason=...}             reasons from FailureReasonLabel
//   ckptd_last_commit_timestamp_seconds               Unix time of the newest commit
//   ckptd_connected_clients
//   ckptd_client_reattach_total                       trainer clients that connected again
//   ckptd_storage_writes_in_flight                    storage calls of the writers in progress
//   ckptd_storage_oldest_write_seconds                age of the oldest of them (0: none): a
//                                                     hung filesystem shows as a growing value
//   ckptd_peer_bytes_total{direction="sent"|"received"}  chunk bytes over the daemon-to-daemon
//                                                     data plane (daemon/peer/), both roles
//   ckptd_peer_requests_failed_total{reason}          data plane requests refused or failed,
//                                                     reasons from peer::PeerObserver
//
// Per-job series, label `job` (the trainer's job name), for per-job alerts on a node that
// several jobs share ("job X has not committed for 30 min", "job X's saves fail"):
//   ckptd_job_saves_started_total{job}                steps of the job this daemon saw begin
//   ckptd_job_steps_committed_total{job}
//   ckptd_job_step_failures_total{job,reason}         aborted or failed (pool_full_skip: skipped)
//   ckptd_job_steps_in_flight{job}
//   ckptd_job_last_committed_step{job}                the step number (absent: none yet)
//   ckptd_job_last_commit_timestamp_seconds{job}
//   ckptd_job_captured_bytes_total{job}, ckptd_job_persisted_bytes_total{job}
//
// Why the per-job series are families of their own, not a `job` label on the node-wide names:
// the node-wide names stay exactly what dashboards and deploy/prometheus/ckptd-alerts.yml
// select, unlabelled. Adding a label to the same names would make every existing expression
// match the per-job series as well (`sum()` would count each step twice; `increase(...) == 0`
// alerts would fire once per idle job), and forgetting a job (below) would make a node total
// that is a sum of job series drop. Durations stay node-wide only: a histogram per job costs
// ~24 series per job for little (slow saves on one node are a node problem far more often than
// a job's), and the per-job bytes and commit times already show a job that is slow.
//
// The label is `job` because that is the word operators and the API use. Prometheus attaches
// its own `job` (the scrape job) to every series: with the default honor_labels: false the
// exposed one is kept as `exported_job` (alert on `exported_job="X"`); with honor_labels: true
// the exposed one wins on these series only.
//
// Job names are user input. The daemon validates them (ckpt::ValidateJobName) before a step
// exists, but the exposition does not lean on that: label values are written by
// prometheus-cpp's TextSerializer, which escapes backslash, double quote and newline as the text
// format requires, and daemon_metrics_test.cpp renders hostile names through it.
//
// Cardinality. The per-job series are bounded by a forgetting rule, so a daemon that lives for
// months across many jobs does not grow without bound. A job is *idle* while it has no trainer
// session and no step in flight; an idle job's series are removed once it has been idle for
// `forget_after` (default 1 h, long enough for a "no commit for 30 min" alert to fire first, and
// a job that restarts within it keeps its counters), or sooner, oldest idle first, while more
// than `max_idle_jobs` (default 16) idle jobs are remembered. A job with a session or a step in
// flight is never forgotten. A forgotten job that comes back starts its counters from zero,
// which rate() and increase() treat as a counter reset. The rule is applied on every event and
// every scrape.
//
// Threads: observer methods run on the loop; scrapes run on the exposer's thread. The per-job
// bookkeeping is shared by both (a scrape may forget jobs) and guarded by mu_; the prometheus
// counters are thread-safe themselves.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <chrono>
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>

#include "common/mutex.h"
#include "common/status.h"
#include "daemon/admin/metrics_endpoint.h"
#include "daemon/daemon_observer.h"
#include "daemon/host_pool.h"
#include "daemon/hot_cache.h"
#include "daemon/peer/peer_observer.h"

namespace ckpt {

// A small fixed vocabulary for failure reasons: timeout, rank_disconnected, abandoned,
// storage_stalled, pool_full_skip, capture_error, write_error, commit_error, shutdown, other.
std::string FailureReasonLabel(const std::string& reason);

// The forgetting rule of DaemonMetrics' per-job series (see above). Outside the class so that
// it can be a defaulted constructor argument.
struct DaemonJobSeriesOptions {
  std::chrono::steady_clock::duration forget_after = std::chrono::hours(1);
  size_t max_idle_jobs = 16;
  std::function<std::chrono::steady_clock::time_point()> now;  // empty: steady_clock (tests)
};

class DaemonMetrics final : public DaemonObserver, public peer::PeerObserver {
 public:
  // What the writers are doing to storage now: calls in flight, age of the oldest in seconds.
  using StorageProbe = std::function<std::pair<uint32_t, double>()>;
  using JobSeriesOptions = DaemonJobSeriesOptions;

  DaemonMetrics(std::string version, std::string node_id, const HostPool* pool, const HotCache* hot,
                StorageProbe storage = {}, JobSeriesOptions jobs = {});
  ~DaemonMetrics() override;

  // Serves /metrics on `address` ("127.0.0.1:7461"; port 0 picks one). Fails when it cannot bind.
  Status Serve(const std::string& address);
  // "host:port" actually bound, after Serve.
  const std::string& bound_address() const { return endpoint_.bound_address(); }
  // The text exposition (what a scrape returns), for tests.
  std::string Render() const;
  // Jobs whose per-job series exist now (tests).
  size_t jobs_tracked() const;

  void OnStepState(const std::string& job, uint64_t step, ckptd::v1::StepState state,
                   const std::string& reason) override;
  void OnRankCaptured(const std::string& job, uint64_t step, uint32_t rank, uint64_t bytes,
                      double seconds) override;
  void OnRankPersisted(const std::string& job, uint64_t step, uint32_t rank, uint64_t bytes,
                       double seconds) override;
  void OnStorageRead(const std::string& job, uint64_t bytes) override;
  void OnLoad(const std::string& job, uint64_t step, uint64_t bytes_from_memory,
              uint64_t bytes_from_storage, double seconds) override;
  void OnClientConnected(const ClientDescription& client) override;
  void OnClientDisconnected(uint64_t session_id) override;
  // The data plane's counters (peer::PeerObserver; any thread).
  void OnPeerBytes(peer::Direction direction, uint64_t bytes) override;
  void OnPeerFailure(std::string_view reason) override;

 private:
  class PoolCollector;
  // One job's series (children of the ckptd_job_* families) and what decides when it is idle.
  struct JobSeries {
    prometheus::Counter* saves_started = nullptr;
    prometheus::Counter* committed = nullptr;
    prometheus::Counter* captured_bytes = nullptr;
    prometheus::Counter* persisted_bytes = nullptr;
    prometheus::Gauge* in_flight = nullptr;
    prometheus::Gauge* last_commit = nullptr;
    prometheus::Gauge* last_step = nullptr;                // created at the first commit
    std::map<std::string, prometheus::Counter*> failures;  // reason → child
    size_t sessions = 0;
    size_t steps_in_flight = 0;
    std::chrono::steady_clock::time_point idle_since;  // when both last became 0
  };
  struct JobFamilies {
    prometheus::Family<prometheus::Counter>* saves_started;
    prometheus::Family<prometheus::Counter>* committed;
    prometheus::Family<prometheus::Counter>* failures;
    prometheus::Family<prometheus::Counter>* captured_bytes;
    prometheus::Family<prometheus::Counter>* persisted_bytes;
    prometheus::Family<prometheus::Gauge>* in_flight;
    prometheus::Family<prometheus::Gauge>* last_commit;
    prometheus::Family<prometheus::Gauge>* last_step;
  };

  std::chrono::steady_clock::time_point Now() const;
  JobSeries& Job(const std::string& job) REQUIRES(mu_);
  // A job's session or step count changed: (re)start its idle clock when it became idle.
  void Touch(JobSeries& j) REQUIRES(mu_);
  // Applies the forgetting rule.
  void ForgetIdleJobs() const EXCLUDES(mu_);
  void Forget(const std::string& job, JobSeries& j) const REQUIRES(mu_);

  std::shared_ptr<prometheus::Registry> registry_ = std::make_shared<prometheus::Registry>();
  std::shared_ptr<PoolCollector> pool_collector_;
  prometheus::Counter& captured_bytes_;
  prometheus::Counter& persisted_bytes_;
  prometheus::Family<prometheus::Counter>& read_bytes_;
  prometheus::Histogram& capture_seconds_;
  prometheus::Histogram& flush_seconds_;
  prometheus::Histogram& load_seconds_;
  prometheus::Gauge& steps_in_flight_;
  prometheus::Counter& steps_committed_;
  prometheus::Counter& steps_in_memory_;
  prometheus::Family<prometheus::Counter>& failures_;
  prometheus::Gauge& last_commit_;
  prometheus::Gauge& clients_;
  prometheus::Counter& reattaches_;
  prometheus::Family<prometheus::Counter>& peer_bytes_;
  prometheus::Family<prometheus::Counter>& peer_failures_;
  JobFamilies job_families_;
  JobSeriesOptions job_options_;
  mutable Mutex mu_;
  // Forgetting happens on a const path (a scrape), hence mutable.
  mutable std::map<std::string, JobSeries> jobs_ GUARDED_BY(mu_);
  std::set<std::pair<std::string, uint64_t>> in_flight_ GUARDED_BY(mu_);
  std::map<uint64_t, std::string> sessions_ GUARDED_BY(mu_);  // session id → job
  MetricsEndpoint endpoint_;
};

}  // namespace ckpt
