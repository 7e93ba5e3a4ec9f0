#include "daemon/admin/daemon_metrics.h"

#include <prometheus/collectable.h>
#include <prometheus/text_serializer.h>

#include <algorithm>
#include <chrono>
#include <vector>

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
  // Runs at every scrape first: the forgetting rule of the per-job series, so an idle daemon
  // forgets too (its effect shows from the next scrape on).
  void SetBeforeCollect(std::function<void()> f) { before_collect_ = std::move(f); }
  std::vector<prometheus::MetricFamily> Collect() const override {
    if (before_collect_) before_collect_();
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
  std::function<void()> before_collect_;
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
                             const HotCache* hot, StorageProbe storage, JobSeriesOptions jobs)
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
                           .Help("Steps neither committed, aborted nor failed (nor, memory-only, "
                                 "replicated)")
                           .Register(*registry_)
                           .Add({})),
      steps_committed_(BuildCounter()
                           .Name("ckptd_steps_committed_total")
                           .Help("Steps committed")
                           .Register(*registry_)
                           .Add({})),
      steps_in_memory_(BuildCounter()
                           .Name("ckptd_steps_replicated_in_memory_total")
                           .Help("Memory-only steps that ended replicated (never written)")
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
                      .Add({})),
      peer_bytes_(BuildCounter()
                      .Name("ckptd_peer_bytes_total")
                      .Help("Chunk bytes moved over the daemon-to-daemon data plane, by direction")
                      .Register(*registry_)),
      peer_failures_(BuildCounter()
                         .Name("ckptd_peer_requests_failed_total")
                         .Help("Data plane requests refused or failed, either side, by reason")
                         .Register(*registry_)),
      job_families_{
          &BuildCounter()
               .Name("ckptd_job_saves_started_total")
               .Help("Steps of this job the daemon saw begin (a rank's save accepted)")
               .Register(*registry_),
          &BuildCounter()
               .Name("ckptd_job_steps_committed_total")
               .Help("Steps of this job committed")
               .Register(*registry_),
          &BuildCounter()
               .Name("ckptd_job_step_failures_total")
               .Help("Steps of this job aborted or failed, by reason (pool_full_skip: skipped)")
               .Register(*registry_),
          &BuildCounter()
               .Name("ckptd_job_captured_bytes_total")
               .Help("Bytes of this job copied from trainer memory into the host pool")
               .Register(*registry_),
          &BuildCounter()
               .Name("ckptd_job_persisted_bytes_total")
               .Help("Bytes of this job written and synced to storage")
               .Register(*registry_),
          &BuildGauge()
               .Name("ckptd_job_steps_in_flight")
               .Help("Steps of this job neither committed, aborted nor failed")
               .Register(*registry_),
          &BuildGauge()
               .Name("ckptd_job_last_commit_timestamp_seconds")
               .Help("Unix time of this job's newest commit (0: none since the daemon started)")
               .Register(*registry_),
          &BuildGauge()
               .Name("ckptd_job_last_committed_step")
               .Help("This job's newest committed step (absent: none since the daemon started)")
               .Register(*registry_),
      },
      job_options_(std::move(jobs)) {
  pool_collector_->SetBeforeCollect([this] { ForgetIdleJobs(); });
  BuildGauge()
      .Name("ckptd_build_info")
      .Help("Always 1; labels say which build runs where")
      .Register(*registry_)
      .Add({{"version", std::move(version)}, {"node", std::move(node_id)}})
      .Set(1);
  // Both label values exist from the start, so rate() works before the first load.
  read_bytes_.Add({{"source", "memory"}});
  read_bytes_.Add({{"source", "storage"}});
  peer_bytes_.Add({{"direction", "sent"}});
  peer_bytes_.Add({{"direction", "received"}});
}

void DaemonMetrics::OnPeerBytes(peer::Direction direction, uint64_t bytes) {
  peer_bytes_.Add({{"direction", direction == peer::Direction::kSent ? "sent" : "received"}})
      .Increment(static_cast<double>(bytes));
}

void DaemonMetrics::OnPeerFailure(std::string_view reason) {
  peer_failures_.Add({{"reason", std::string(reason)}}).Increment();
}

DaemonMetrics::~DaemonMetrics() = default;

Status DaemonMetrics::Serve(const std::string& address) {
  return endpoint_.Serve(address, {registry_, pool_collector_});
}

std::string DaemonMetrics::Render() const {
  ForgetIdleJobs();
  auto families = registry_->Collect();
  for (auto& f : pool_collector_->Collect()) families.push_back(std::move(f));
  return prometheus::TextSerializer().Serialize(families);
}

size_t DaemonMetrics::jobs_tracked() const {
  MutexLock lock(mu_);
  return jobs_.size();
}

std::chrono::steady_clock::time_point DaemonMetrics::Now() const {
  return job_options_.now ? job_options_.now() : std::chrono::steady_clock::now();
}

DaemonMetrics::JobSeries& DaemonMetrics::Job(const std::string& job) {
  auto [it, fresh] = jobs_.try_emplace(job);
  JobSeries& j = it->second;
  if (fresh) {
    const prometheus::Labels labels{{"job", job}};
    j.saves_started = &job_families_.saves_started->Add(labels);
    j.committed = &job_families_.committed->Add(labels);
    j.captured_bytes = &job_families_.captured_bytes->Add(labels);
    j.persisted_bytes = &job_families_.persisted_bytes->Add(labels);
    j.in_flight = &job_families_.in_flight->Add(labels);
    j.last_commit = &job_families_.last_commit->Add(labels);
    j.idle_since = Now();
  }
  return j;
}

void DaemonMetrics::Touch(JobSeries& j) {
  j.in_flight->Set(static_cast<double>(j.steps_in_flight));
  if (j.sessions == 0 && j.steps_in_flight == 0) j.idle_since = Now();
}

void DaemonMetrics::Forget(const std::string& job, JobSeries& j) const {
  spdlog::debug("metrics: forgetting the series of idle job '{}'", job);
  job_families_.saves_started->Remove(j.saves_started);
  job_families_.committed->Remove(j.committed);
  job_families_.captured_bytes->Remove(j.captured_bytes);
  job_families_.persisted_bytes->Remove(j.persisted_bytes);
  job_families_.in_flight->Remove(j.in_flight);
  job_families_.last_commit->Remove(j.last_commit);
  if (j.last_step != nullptr) job_families_.last_step->Remove(j.last_step);
  for (auto& [reason, c] : j.failures) job_families_.failures->Remove(c);
}

void DaemonMetrics::ForgetIdleJobs() const {
  const auto now = Now();
  MutexLock lock(mu_);
  std::vector<std::pair<std::chrono::steady_clock::time_point, std::string>> idle;
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    JobSeries& j = it->second;
    if (j.sessions != 0 || j.steps_in_flight != 0) {
      ++it;
    } else if (now - j.idle_since >= job_options_.forget_after) {
      Forget(it->first, j);
      it = jobs_.erase(it);
    } else {
      idle.emplace_back(j.idle_since, it->first);
      ++it;
    }
  }
  if (idle.size() <= job_options_.max_idle_jobs) return;
  std::sort(idle.begin(), idle.end());  // longest idle first
  for (size_t i = 0; i < idle.size() - job_options_.max_idle_jobs; ++i) {
    auto it = jobs_.find(idle[i].second);
    Forget(it->first, it->second);
    jobs_.erase(it);
  }
}

void DaemonMetrics::OnStepState(const std::string& job, uint64_t step, ckptd::v1::StepState state,
                                const std::string& reason) {
  {
    MutexLock lock(mu_);
    const auto key = std::make_pair(job, step);
    JobSeries& j = Job(job);
    switch (state) {
      case ckptd::v1::STEP_STATE_COMMITTED: {
        const double now_s =
            std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
                .count();
        steps_committed_.Increment();
        last_commit_.Set(now_s);
        j.committed->Increment();
        j.last_commit->Set(now_s);
        if (j.last_step == nullptr) j.last_step = &job_families_.last_step->Add({{"job", job}});
        j.last_step->Set(std::max(j.last_step->Value(), static_cast<double>(step)));
        j.steps_in_flight -= in_flight_.erase(key);
        break;
      }
      case ckptd::v1::STEP_STATE_REPLICATED:  // a memory-only step's end
        steps_in_memory_.Increment();
        j.steps_in_flight -= in_flight_.erase(key);
        break;
      case ckptd::v1::STEP_STATE_ABORTED:
      case ckptd::v1::STEP_STATE_FAILED: {
        const std::string label = FailureReasonLabel(reason);
        failures_.Add({{"reason", label}}).Increment();
        auto& c = j.failures[label];
        if (c == nullptr) c = &job_families_.failures->Add({{"job", job}, {"reason", label}});
        c->Increment();
        j.steps_in_flight -= in_flight_.erase(key);
        break;
      }
      default:
        if (in_flight_.insert(key).second) {
          j.saves_started->Increment();
          ++j.steps_in_flight;
        }
    }
    Touch(j);
    steps_in_flight_.Set(static_cast<double>(in_flight_.size()));
  }
  ForgetIdleJobs();
}

void DaemonMetrics::OnRankCaptured(const std::string& job, uint64_t, uint32_t, uint64_t bytes,
                                   double seconds) {
  captured_bytes_.Increment(static_cast<double>(bytes));
  capture_seconds_.Observe(seconds);
  MutexLock lock(mu_);
  Job(job).captured_bytes->Increment(static_cast<double>(bytes));
}

void DaemonMetrics::OnRankPersisted(const std::string& job, uint64_t, uint32_t, uint64_t bytes,
                                    double seconds) {
  persisted_bytes_.Increment(static_cast<double>(bytes));
  flush_seconds_.Observe(seconds);
  MutexLock lock(mu_);
  Job(job).persisted_bytes->Increment(static_cast<double>(bytes));
}

void DaemonMetrics::OnLoad(const std::string&, uint64_t, uint64_t from_memory,
                           uint64_t from_storage, double seconds) {
  read_bytes_.Add({{"source", "memory"}}).Increment(static_cast<double>(from_memory));
  read_bytes_.Add({{"source", "storage"}}).Increment(static_cast<double>(from_storage));
  load_seconds_.Observe(seconds);
}

void DaemonMetrics::OnStorageRead(const std::string&, uint64_t bytes) {
  read_bytes_.Add({{"source", "storage"}}).Increment(static_cast<double>(bytes));
}

void DaemonMetrics::OnClientConnected(const ClientDescription& client) {
  {
    MutexLock lock(mu_);
    if (sessions_.emplace(client.session_id, client.job).second) {
      JobSeries& j = Job(client.job);
      ++j.sessions;
      Touch(j);
    }
    clients_.Set(static_cast<double>(sessions_.size()));
  }
  if (client.reattached) reattaches_.Increment();
  ForgetIdleJobs();
}

void DaemonMetrics::OnClientDisconnected(uint64_t session_id) {
  MutexLock lock(mu_);
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) return;
  auto j = jobs_.find(it->second);
  if (j != jobs_.end() && j->second.sessions > 0) {
    --j->second.sessions;
    Touch(j->second);
  }
  sessions_.erase(it);
  clients_.Set(static_cast<double>(sessions_.size()));
}

}  // namespace ckpt
