#include "daemon/admin/daemon_metrics.h"

#include <prometheus/collectable.h>
#include <prometheus/text_serializer.h>

#include <chrono>
#include <exception>

#include "common/logging.h"

namespace ckpt {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;

std::string FailureReasonLabel(const std::string& reason) {
  auto has = [&](const char* s) { return reason.find(s) != std::string::npos; };
  if (has("did not save step") || has("not every rank persisted within")) return "timeout";
  if (has("abandoned")) return "abandoned";
  if (has("disconnected")) return "rank_disconnected";
  if (has("storage stalled")) return "storage_stalled";
  if (has("skipped")) return "pool_full_skip";
  if (has("capture failed")) return "capture_error";
  if (has("write failed")) return "write_error";
  if (has("commit failed")) return "commit_error";
  if (has("shut down") || has("stopping")) return "shutdown";
  return "other";
}

// ckptd_pool_bytes{state}: read from the pool when scraped, so it is never stale.
class DaemonMetrics::PoolCollector final : public prometheus::Collectable {
 public:
  PoolCollector(const HostPool* pool, const HotCache* hot, StorageProbe storage)
      : pool_(pool), hot_(hot), storage_(std::move(storage)) {}
  std::vector<prometheus::MetricFamily> Collect() const override {
    const uint64_t total = pool_->size_bytes();
    const uint64_t free_bytes =
        std::min<uint64_t>(total, uint64_t{pool_->free_slots()} * pool_->slot_size());
    const uint64_t cached = std::min(hot_->resident_bytes(), total - free_bytes);
    prometheus::MetricFamily f;
    f.name = "ckptd_pool_bytes";
    f.help = "Bytes of the host staging pool by state (free, cached for restores, in use)";
    f.type = prometheus::MetricType::Gauge;
    for (const auto& [state, value] : {std::pair{"free", free_bytes},
                                       {"cached", cached},
                                       {"in_use", total - free_bytes - cached}}) {
      prometheus::ClientMetric m;
      m.label.push_back({"state", state});
      m.gauge.value = static_cast<double>(value);
      f.metric.push_back(std::move(m));
    }
    std::vector<prometheus::MetricFamily> out{std::move(f)};
    if (storage_) {
      const auto [in_flight, oldest] = storage_();
      auto gauge = [&](const char* name, const char* help, double value) {
        prometheus::MetricFamily g;
        g.name = name;
        g.help = help;
        g.type = prometheus::MetricType::Gauge;
        prometheus::ClientMetric m;
        m.gauge.value = value;
        g.metric.push_back(std::move(m));
        out.push_back(std::move(g));
      };
      gauge("ckptd_storage_writes_in_flight",
            "Storage calls (create, write, fdatasync) of the writer threads in progress",
            static_cast<double>(in_flight));
      gauge("ckptd_storage_oldest_write_seconds",
            "How long the oldest storage call in progress has been running (0: none); a hung "
            "filesystem shows as a value that keeps growing",
            oldest);
    }
    return out;
  }

 private:
  const HostPool* pool_;
  const HotCache* hot_;
  StorageProbe storage_;
};

namespace {

// Seconds, from 1 ms to ~17 min: captures of small test states to flushes of a full pool.
prometheus::Histogram::BucketBoundaries DurationBuckets() {
  prometheus::Histogram::BucketBoundaries b;
  for (double s = 0.001; s < 1100; s *= 2) b.push_back(s);
  return b;
}

}  // namespace

DaemonMetrics::DaemonMetrics(std::string version, std::string node_id, const HostPool* pool,
                             const HotCache* hot, StorageProbe storage)
    : pool_collector_(std::make_shared<PoolCollector>(pool, hot, std::move(storage))),
      captured_bytes_(BuildCounter()
                          .Name("ckptd_captured_bytes_total")
                          .Help("Bytes copied from trainer memory into the host pool")
                          .Register(*registry_)
                          .Add({})),
      persisted_bytes_(BuildCounter()
                           .Name("ckptd_persisted_bytes_total")
                           .Help("Bytes written and synced to storage")
                           .Register(*registry_)
                           .Add({})),
      read_bytes_(BuildCounter()
                      .Name("ckptd_read_bytes_total")
                      .Help("Bytes restored by loads, by where they came from")
                      .Register(*registry_)),
      capture_seconds_(BuildHistogram()
                           .Name("ckptd_capture_duration_seconds")
                           .Help("Time from a rank's save being accepted to its capture")
                           .Register(*registry_)
                           .Add({}, DurationBuckets())),
      flush_seconds_(BuildHistogram()
                         .Name("ckptd_flush_duration_seconds")
                         .Help("Time from a rank's capture to its data being durable")
                         .Register(*registry_)
                         .Add({}, DurationBuckets())),
      load_seconds_(BuildHistogram()
                        .Name("ckptd_load_duration_seconds")
                        .Help("Duration of successful loads")
                        .Register(*registry_)
                        .Add({}, DurationBuckets())),
      steps_in_flight_(BuildGauge()
                           .Name("ckptd_steps_in_flight")
                           .Help("Steps neither committed, aborted nor failed")
                           .Register(*registry_)
                           .Add({})),
      steps_committed_(BuildCounter()
                           .Name("ckptd_steps_committed_total")
                           .Help("Steps committed")
                           .Register(*registry_)
                           .Add({})),
      failures_(BuildCounter()
                    .Name("ckptd_step_failures_total")
                    .Help("Steps aborted or failed, by reason")
                    .Register(*registry_)),
      last_commit_(BuildGauge()
                       .Name("ckptd_last_commit_timestamp_seconds")
                       .Help("Unix time of the newest commit (0: none since start)")
                       .Register(*registry_)
                       .Add({})),
      clients_(BuildGauge()
                   .Name("ckptd_connected_clients")
                   .Help("Trainer connections that said hello")
                   .Register(*registry_)
                   .Add({})),
      reattaches_(BuildCounter()
                      .Name("ckptd_client_reattach_total")
                      .Help("Trainer clients that connected again after losing their connection "
                            "(daemon restart, broken connection)")
                      .Register(*registry_)
                      .Add({})) {
  BuildGauge()
      .Name("ckptd_build_info")
      .Help("Always 1; labels say which build runs where")
      .Register(*registry_)
      .Add({{"version", std::move(version)}, {"node", std::move(node_id)}})
      .Set(1);
  // Both label values exist from the start, so rate() works before the first load.
  read_bytes_.Add({{"source", "memory"}});
  read_bytes_.Add({{"source", "storage"}});
}

DaemonMetrics::~DaemonMetrics() = default;

Status DaemonMetrics::Serve(const std::string& address) {
  try {
    exposer_ = std::make_unique<prometheus::Exposer>(address, 1);
  } catch (const std::exception& e) {
    return Unavailable("metrics: cannot serve HTTP on " + address + ": " + e.what());
  }
  exposer_->RegisterCollectable(registry_);
  exposer_->RegisterCollectable(pool_collector_);
  const auto ports = exposer_->GetListeningPorts();
  bound_address_ = address.substr(0, address.rfind(':') + 1) +
                   (ports.empty() ? std::string("?") : std::to_string(ports.front()));
  spdlog::info("metrics: Prometheus endpoint http://{}/metrics", bound_address_);
  return Status::Ok();
}

std::string DaemonMetrics::Render() const {
  auto families = registry_->Collect();
  for (auto& f : pool_collector_->Collect()) families.push_back(std::move(f));
  return prometheus::TextSerializer().Serialize(families);
}

void DaemonMetrics::OnStepState(const std::string& job, uint64_t step, ckptd::v1::StepState state,
                                const std::string& reason) {
  const auto key = std::make_pair(job, step);
  switch (state) {
    case ckptd::v1::STEP_STATE_COMMITTED:
      steps_committed_.Increment();
      last_commit_.Set(
          std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
              .count());
      in_flight_.erase(key);
      break;
    case ckptd::v1::STEP_STATE_ABORTED:
    case ckptd::v1::STEP_STATE_FAILED:
      failures_.Add({{"reason", FailureReasonLabel(reason)}}).Increment();
      in_flight_.erase(key);
      break;
    default:
      in_flight_.insert(key);
  }
  steps_in_flight_.Set(static_cast<double>(in_flight_.size()));
}

void DaemonMetrics::OnRankCaptured(const std::string&, uint64_t, uint32_t, uint64_t bytes,
                                   double seconds) {
  captured_bytes_.Increment(static_cast<double>(bytes));
  capture_seconds_.Observe(seconds);
}

void DaemonMetrics::OnRankPersisted(const std::string&, uint64_t, uint32_t, uint64_t bytes,
                                    double seconds) {
  persisted_bytes_.Increment(static_cast<double>(bytes));
  flush_seconds_.Observe(seconds);
}

void DaemonMetrics::OnLoad(const std::string&, uint64_t, uint64_t from_memory,
                           uint64_t from_storage, double seconds) {
  read_bytes_.Add({{"source", "memory"}}).Increment(static_cast<double>(from_memory));
  read_bytes_.Add({{"source", "storage"}}).Increment(static_cast<double>(from_storage));
  load_seconds_.Observe(seconds);
}

void DaemonMetrics::OnClientConnected(const ClientDescription& client) {
  sessions_.insert(client.session_id);
  clients_.Set(static_cast<double>(sessions_.size()));
  if (client.reattached) reattaches_.Increment();
}

void DaemonMetrics::OnClientDisconnected(uint64_t session_id) {
  sessions_.erase(session_id);
  clients_.Set(static_cast<double>(sessions_.size()));
}

}  // namespace ckpt
