#include "daemon/coordinator/coordinator_metrics.h"

#include <prometheus/collectable.h>
#include <prometheus/text_serializer.h>

#include <set>
#include <vector>

namespace ckpt {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;

// The node and job gauges, read from a core snapshot when scraped, so they are never stale.
class CoordinatorMetrics::CoreCollector final : public prometheus::Collectable {
 public:
  void Set(CoordinatorCore* core) {
    MutexLock lock(mu_);
    core_ = core;
  }
  std::vector<prometheus::MetricFamily> Collect() const override {
    MutexLock lock(mu_);  // held across the snapshot: Set(nullptr) waits for a scrape in progress
    if (core_ == nullptr) return {};
    const CoordinatorCore::Snapshot s = core_->TakeSnapshot();
    size_t alive = 0;
    std::set<std::string> jobs;
    for (const auto& n : s.nodes) {
      alive += n.attached ? 1 : 0;
      jobs.insert(n.jobs.begin(), n.jobs.end());
    }
    for (const auto& st : s.steps) jobs.insert(st.job);
    for (const auto& p : s.plans) jobs.insert(p.job);
    std::vector<prometheus::MetricFamily> out;
    auto gauge = [&](const char* name, const char* help, double value) {
      prometheus::MetricFamily f;
      f.name = name;
      f.help = help;
      f.type = prometheus::MetricType::Gauge;
      prometheus::ClientMetric m;
      m.gauge.value = value;
      f.metric.push_back(std::move(m));
      out.push_back(std::move(f));
    };
    gauge("ckpt_coordinator_nodes_registered", "Nodes (daemons) registered with the coordinator",
          static_cast<double>(s.nodes.size()));
    gauge("ckpt_coordinator_nodes_alive",
          "Registered nodes whose event stream is open (the others are within their lease)",
          static_cast<double>(alive));
    gauge("ckpt_coordinator_jobs",
          "Jobs the coordinator knows of (nodes, steps in flight or writer plans)",
          static_cast<double>(jobs.size()));
    gauge("ckpt_coordinator_layouts",
          "Distinct registered layouts held (one per fingerprint, shared by every rank of it)",
          static_cast<double>(s.layouts_known));
    return out;
  }

 private:
  mutable Mutex mu_;
  CoordinatorCore* core_ GUARDED_BY(mu_) = nullptr;
};

namespace {

// Seconds, from 1 ms to ~17 min, as the daemon's durations.
prometheus::Histogram::BucketBoundaries DurationBuckets() {
  prometheus::Histogram::BucketBoundaries b;
  for (double s = 0.001; s < 1100; s *= 2) b.push_back(s);
  return b;
}

}  // namespace

CoordinatorMetrics::CoordinatorMetrics(const std::string& version)
    : core_collector_(std::make_shared<CoreCollector>()),
      commits_(BuildCounter()
                   .Name("ckpt_coordinator_commits_total")
                   .Help("Steps committed, by job")
                   .Register(*registry_)),
      aborted_(BuildCounter()
                   .Name("ckpt_coordinator_aborted_steps_total")
                   .Help("Steps aborted or failed (never committed), by job")
                   .Register(*registry_)),
      last_committed_(BuildGauge()
                          .Name("ckpt_coordinator_last_committed_step")
                          .Help("Newest step committed since the coordinator started, by job")
                          .Register(*registry_)),
      commit_latency_(BuildHistogram()
                          .Name("ckpt_coordinator_commit_latency_seconds")
                          .Help("Time from a step's last rank report to its commit")
                          .Register(*registry_)
                          .Add({}, DurationBuckets())),
      registrations_(BuildCounter()
                         .Name("ckpt_coordinator_registration_requests_total")
                         .Help("Registration requests (ReportRegistration) handled")
                         .Register(*registry_)
                         .Add({})),
      registration_bytes_(BuildCounter()
                              .Name("ckpt_coordinator_registration_bytes_total")
                              .Help("Serialized bytes of every registration request handled")
                              .Register(*registry_)
                              .Add({})),
      layout_bytes_(BuildCounter()
                        .Name("ckpt_coordinator_layout_bytes_total")
                        .Help("Serialized bytes of the layouts (shard lists) registrations carried")
                        .Register(*registry_)
                        .Add({})),
      layouts_received_(BuildCounter()
                            .Name("ckpt_coordinator_layouts_received_total")
                            .Help("Registrations that carried a layout (the others named one by "
                                  "fingerprint)")
                            .Register(*registry_)
                            .Add({})),
      skipped_shards_(BuildCounter()
                          .Name("ckpt_coordinator_skipped_shards_reported_total")
                          .Help("Shards ranks left to others under the writer plan, as PERSISTED "
                                "reports gave them: listed one by one, or named by registration")
                          .Register(*registry_)),
      skips_listed_(skipped_shards_.Add({{"how", "listed"}})),
      skips_named_(skipped_shards_.Add({{"how", "by_registration"}})),
      plans_(BuildCounter()
                 .Name("ckpt_coordinator_plan_computations_total")
                 .Help("Writer plans computed")
                 .Register(*registry_)
                 .Add({})),
      plan_seconds_(BuildHistogram()
                        .Name("ckpt_coordinator_plan_duration_seconds")
                        .Help("Time one writer plan computation took")
                        .Register(*registry_)
                        .Add({}, DurationBuckets())) {
  BuildGauge()
      .Name("ckpt_coordinator_build_info")
      .Help("Always 1; the label says which build runs")
      .Register(*registry_)
      .Add({{"version", version}})
      .Set(1);
}

CoordinatorMetrics::~CoordinatorMetrics() = default;

void CoordinatorMetrics::Hook(CoordinatorCore::Config& config) {
  config.on_registration = [this](size_t bytes, size_t layout_bytes) {
    OnRegistration(bytes, layout_bytes);
  };
  config.on_plan = [this](const std::string&, double seconds) { OnPlan(seconds); };
  config.on_skips = [this](size_t listed, size_t named) { OnSkips(listed, named); };
  config.on_commit = [this](const std::string&, uint64_t, double seconds) { OnCommit(seconds); };
}

std::shared_ptr<void> CoordinatorMetrics::Attach(CoordinatorCore* core) {
  core_collector_->Set(core);
  // A shared_ptr holding no object still runs its deleter: the guard detaches on destruction.
  return std::shared_ptr<void>(nullptr, [c = core_collector_](void*) { c->Set(nullptr); });
}

Status CoordinatorMetrics::Serve(const std::string& address) {
  return endpoint_.Serve(address, {registry_, core_collector_});
}

std::string CoordinatorMetrics::Render() const {
  auto families = registry_->Collect();
  for (auto& f : core_collector_->Collect()) families.push_back(std::move(f));
  return prometheus::TextSerializer().Serialize(families);
}

void CoordinatorMetrics::OnStepState(const std::string& job, uint64_t step,
                                     ckptd::v1::StepState state) {
  switch (state) {
    case ckptd::v1::STEP_STATE_COMMITTED: {
      commits_.Add({{"job", job}}).Increment();
      MutexLock lock(mu_);
      auto& g = last_step_[job];
      if (g == nullptr) g = &last_committed_.Add({{"job", job}});
      g->Set(std::max(g->Value(), static_cast<double>(step)));
      break;
    }
    case ckptd::v1::STEP_STATE_ABORTED:
    case ckptd::v1::STEP_STATE_FAILED:
      aborted_.Add({{"job", job}}).Increment();
      break;
    default:
      break;
  }
}

void CoordinatorMetrics::OnCommit(double seconds) { commit_latency_.Observe(seconds); }

void CoordinatorMetrics::OnRegistration(size_t bytes, size_t layout_bytes) {
  registrations_.Increment();
  registration_bytes_.Increment(static_cast<double>(bytes));
  layout_bytes_.Increment(static_cast<double>(layout_bytes));
  if (layout_bytes > 0) layouts_received_.Increment();
}

void CoordinatorMetrics::OnSkips(size_t listed, size_t named) {
  skips_listed_.Increment(static_cast<double>(listed));
  skips_named_.Increment(static_cast<double>(named));
}

void CoordinatorMetrics::OnPlan(double seconds) {
  plans_.Increment();
  plan_seconds_.Observe(seconds);
}

}  // namespace ckpt
