// CoordinatorMetrics: ckpt-coordinator's Prometheus metrics, served on /metrics by the same
// HTTP endpoint as the daemon's (daemon/admin/metrics_endpoint.h) when `--metrics HOST:PORT` is
// set. Names follow the daemon's conventions with the `ckpt_coordinator_` prefix:
//
//   ckpt_coordinator_build_info{version}                 1
//   ckpt_coordinator_nodes_registered                    nodes the core knows (scrape time)
//   ckpt_coordinator_nodes_alive                         of them, those whose event stream is open
//   ckpt_coordinator_jobs                                jobs the core knows of (scrape time)
//   ckpt_coordinator_commits_total{job}                  steps committed
//   ckpt_coordinator_aborted_steps_total{job}            steps aborted or failed (never committed)
//   ckpt_coordinator_last_committed_step{job}            newest committed step (absent: none yet)
//   ckpt_coordinator_commit_latency_seconds              histogram: a step's last rank report →
//                                                        committed (MANIFEST, LATEST, retention)
//   ckpt_coordinator_registration_requests_total         ReportRegistration requests handled
//   ckpt_coordinator_registration_bytes_total            their serialized size, summed
//   ckpt_coordinator_layout_bytes_total                  of which layouts (shard lists): a rank
//                                                        naming a known layout adds nothing
//   ckpt_coordinator_layouts_received_total              registrations that carried a layout
//   ckpt_coordinator_layouts                             distinct layouts held (gauge)
//   ckpt_coordinator_skipped_shards_reported_total{how}  shards ranks left to others under the
//                                                        writer plan, as PERSISTED reports gave
//                                                        them: how="listed" one entry each
//                                                        (older daemons), how="by_registration"
//                                                        named by registration (a few bytes a rank)
//   ckpt_coordinator_plan_computations_total             writer plans computed
//   ckpt_coordinator_plan_duration_seconds               histogram: time PlanWriters took
//
// The `job` label is escaped by prometheus-cpp's serializer like the daemon's (and job names
// are validated by the core before a step exists). Its cardinality follows the core's own
// memory of jobs, which a coordinator restart clears; unlike a daemon, a coordinator serves a
// cluster's jobs for their lifetime, and a committed step count per job is what operators
// page on, so no forgetting rule here. The histograms are cluster-wide, unlabelled.
// As on the daemon, Prometheus keeps the exposed `job` as `exported_job` unless the scrape
// sets honor_labels: true.
//
// Threads: the counting hooks run on gRPC and commit threads with the core's mutex held
// (prometheus counters are thread-safe; the per-job maps take mu_, which nothing else holds
// while calling into the core); scrapes run on the endpoint's thread and take a core snapshot
// for the node and job gauges.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <map>
#include <memory>
#include <string>

#include "common/mutex.h"
#include "common/status.h"
#include "daemon/admin/metrics_endpoint.h"
#include "daemon/coordinator/coordinator_core.h"

namespace ckpt {

class CoordinatorMetrics {
 public:
  explicit CoordinatorMetrics(const std::string& version);
  ~CoordinatorMetrics();

  // Points the counting hooks of `config` at these metrics.
  void Hook(CoordinatorCore::Config& config);
  // Scrapes read node and job gauges from `core` until the returned guard is destroyed:
  // declare it right after the core, so the core outlives every scrape that reads it.
  [[nodiscard]] std::shared_ptr<void> Attach(CoordinatorCore* core);

  // Serves /metrics on `address` (port 0 picks one). Fails when it cannot bind.
  Status Serve(const std::string& address);
  const std::string& bound_address() const { return endpoint_.bound_address(); }
  std::string Render() const;

  void OnStepState(const std::string& job, uint64_t step, ckptd::v1::StepState state);
  void OnCommit(double seconds);
  void OnRegistration(size_t bytes, size_t layout_bytes);
  void OnSkips(size_t listed, size_t named);
  void OnPlan(double seconds);

 private:
  class CoreCollector;

  std::shared_ptr<prometheus::Registry> registry_ = std::make_shared<prometheus::Registry>();
  std::shared_ptr<CoreCollector> core_collector_;
  prometheus::Family<prometheus::Counter>& commits_;
  prometheus::Family<prometheus::Counter>& aborted_;
  prometheus::Family<prometheus::Gauge>& last_committed_;
  prometheus::Histogram& commit_latency_;
  prometheus::Counter& registrations_;
  prometheus::Counter& registration_bytes_;
  prometheus::Counter& layout_bytes_;
  prometheus::Counter& layouts_received_;
  prometheus::Family<prometheus::Counter>& skipped_shards_;
  prometheus::Counter& skips_listed_;
  prometheus::Counter& skips_named_;
  prometheus::Counter& plans_;
  prometheus::Histogram& plan_seconds_;
  Mutex mu_;
  std::map<std::string, prometheus::Gauge*> last_step_ GUARDED_BY(mu_);  // job → child
  MetricsEndpoint endpoint_;
};

}  // namespace ckpt
