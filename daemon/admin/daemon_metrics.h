// DaemonMetrics: the daemon's Prometheus metrics, served over HTTP by prometheus-cpp's pull
// exposer (`--metrics ADDR`, loopback by default; empty disables it).
//
// Naming follows Prometheus conventions: `ckptd_` prefix, base units (bytes, seconds), `_total`
// for counters, and no per-step or per-job labels (cardinality stays constant however long a
// job runs). What is exported:
//   ckptd_build_info{version,node}                    1
//   ckptd_captured_bytes_total, ckptd_persisted_bytes_total
//   ckptd_read_bytes_total{source="memory"|"storage"} bytes restored by loads
//   ckptd_capture_duration_seconds                    histogram, save accepted → rank captured
//   ckptd_flush_duration_seconds                      histogram, rank captured → rank persisted
//   ckptd_load_duration_seconds                       histogram
//   ckptd_pool_bytes{state="free"|"cached"|"in_use"}  sampled at scrape time
//   ckptd_steps_in_flight                             steps neither committed, aborted nor failed
//   ckptd_steps_committed_total
//   ckptd_step_failures_total{reason=...}             reasons from FailureReasonLabel
//   ckptd_last_commit_timestamp_seconds               Unix time of the newest commit
//   ckptd_connected_clients
//   ckptd_client_reattach_total                       trainer clients that connected again
//   ckptd_storage_writes_in_flight                    storage calls of the writers in progress
//   ckptd_storage_oldest_write_seconds                age of the oldest of them (0: none): a
//                                                     hung filesystem shows as a growing value
//
// Threads: observer methods run on the loop; scrapes run on the exposer's threads and read only
// thread-safe counters and the pool's thread-safe accessors.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <functional>
#include <memory>
#include <set>
#include <string>
#include <utility>

#include "common/status.h"
#include "daemon/daemon_observer.h"
#include "daemon/host_pool.h"
#include "daemon/hot_cache.h"

namespace ckpt {

// A small fixed vocabulary for failure reasons: timeout, rank_disconnected, abandoned,
// storage_stalled, pool_full_skip, capture_error, write_error, commit_error, shutdown, other.
std::string FailureReasonLabel(const std::string& reason);

class DaemonMetrics final : public DaemonObserver {
 public:
  // What the writers are doing to storage now: calls in flight, age of the oldest in seconds.
  using StorageProbe = std::function<std::pair<uint32_t, double>()>;
  DaemonMetrics(std::string version, std::string node_id, const HostPool* pool, const HotCache* hot,
                StorageProbe storage = {});
  ~DaemonMetrics() override;

  // Serves /metrics on `address` ("127.0.0.1:7461"; port 0 picks one). Fails when it cannot bind.
  Status Serve(const std::string& address);
  // "host:port" actually bound, after Serve.
  const std::string& bound_address() const { return bound_address_; }
  // The text exposition (what a scrape returns), for tests.
  std::string Render() const;

  void OnStepState(const std::string& job, uint64_t step, ckptd::v1::StepState state,
                   const std::string& reason) override;
  void OnRankCaptured(const std::string& job, uint64_t step, uint32_t rank, uint64_t bytes,
                      double seconds) override;
  void OnRankPersisted(const std::string& job, uint64_t step, uint32_t rank, uint64_t bytes,
                       double seconds) override;
  void OnLoad(const std::string& job, uint64_t step, uint64_t bytes_from_memory,
              uint64_t bytes_from_storage, double seconds) override;
  void OnClientConnected(const ClientDescription& client) override;
  void OnClientDisconnected(uint64_t session_id) override;

 private:
  class PoolCollector;

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
  prometheus::Family<prometheus::Counter>& failures_;
  prometheus::Gauge& last_commit_;
  prometheus::Gauge& clients_;
  prometheus::Counter& reattaches_;
  std::set<std::pair<std::string, uint64_t>> in_flight_;  // loop-owned
  std::set<uint64_t> sessions_;                           // loop-owned
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::string bound_address_;
};

}  // namespace ckpt
