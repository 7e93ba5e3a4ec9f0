#include "daemon/coordinator/coordinator_admin_provider.h"

#include "daemon/admin/checkpoint_catalog.h"

namespace ckpt {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

ckptd::v1::StepStatus ToStepStatus(const CoordinatorCore::StepView& s, Clock::time_point now) {
  ckptd::v1::StepStatus out;
  out.set_job(s.job);
  out.set_step(s.step);
  out.set_state(s.state);
  out.set_world_size(s.world_size);
  out.set_ranks_saved(static_cast<uint32_t>(s.saved.size()));
  out.set_age_seconds(Seconds(now - s.first_report));
  for (const auto& [rank, node] : s.saved) {
    auto* r = out.add_ranks();
    r->set_rank(rank);
    r->set_node_id(node);
    r->set_captured(s.captured.count(rank) != 0);
    r->set_persisted(s.persisted.count(rank) != 0);
  }
  return out;
}

Status ShuttingDown() { return Unavailable("the coordinator is shutting down"); }

}  // namespace

CoordinatorAdminProvider::CoordinatorAdminProvider(Sources sources)
    : sources_(std::move(sources)) {}

void CoordinatorAdminProvider::Start(CoordinatorCore* core) {
  core_ = core;
  worker_.Start();
  sampler_ = std::thread([this] { SampleLoop(); });
}

CoordinatorAdminProvider::~CoordinatorAdminProvider() {
  Close();
  worker_.Stop();
}

void CoordinatorAdminProvider::Close() {
  {
    MutexLock lock(mu_);
    closed_ = true;
  }
  cv_.NotifyAll();
  if (sampler_.joinable()) sampler_.join();
  hub_.CloseAll();
}

bool CoordinatorAdminProvider::Post(std::function<void()> f) {
  MutexLock lock(mu_);
  if (closed_) return false;
  return worker_.Post(std::move(f));
}

void CoordinatorAdminProvider::OnStepState(const std::string& job, uint64_t step,
                                           ckptd::v1::StepState state, const std::string& reason) {
  if (state == ckptd::v1::STEP_STATE_ABORTED || state == ckptd::v1::STEP_STATE_FAILED) {
    MutexLock lock(mu_);
    failures_.push_back(MakeFailure(job, step, state, reason));
    while (failures_.size() > kFailuresKept) failures_.pop_front();
  }
  hub_.Publish(job, StateChangeEvent(job, step, state, reason));
}

void CoordinatorAdminProvider::GetStatus(Reply<ckptd::v1::GetStatusResponse> reply) {
  auto shared = std::make_shared<decltype(reply)>(std::move(reply));
  if (!Post([this, shared] { (*shared)(CollectStatus()); })) (*shared)(ShuttingDown());
}

ckptd::v1::GetStatusResponse CoordinatorAdminProvider::CollectStatus() {
  // The core's mutex first and alone: OnStepState takes ours while the core holds its own.
  CoordinatorCore::Snapshot snap = core_->TakeSnapshot();
  const auto now = Clock::now();
  ckptd::v1::GetStatusResponse out;
  out.set_node_id(sources_.node_id);
  out.set_version(sources_.version);
  out.set_role("coordinator");
  out.set_uptime_seconds(Seconds(now - started_));
  out.set_serving(serving_);
  for (const auto& [k, v] : sources_.config) {
    auto* e = out.add_config();
    e->set_key(k);
    e->set_value(v);
  }
  for (const auto& s : snap.steps) *out.add_steps() = ToStepStatus(s, now);
  for (const auto& n : snap.nodes) {
    auto* ns = out.add_nodes();
    ns->set_node_id(n.node_id);
    ns->set_connected(n.attached);
    ns->set_epoch(n.epoch);
    ns->set_lost(n.lost);
    if (!n.attached && n.lease_expires) {
      ns->set_lease_left_seconds(std::max(0.0, Seconds(*n.lease_expires - now)));
    }
    for (const auto& j : n.jobs) ns->add_jobs(j);
  }
  for (const auto& p : snap.plans) {
    auto* ps = out.add_writer_plans();
    ps->set_job(p.job);
    ps->set_world_size(p.world_size);
    ps->set_ranks_registered(p.ranks_registered);
    ps->set_version(p.version);
    ps->set_in_force(p.in_force);
    ps->set_unique_bytes(p.unique_bytes);
    ps->set_registered_bytes(p.registered_bytes);
  }
  {
    MutexLock lock(mu_);
    for (const auto& f : failures_) *out.add_recent_failures() = f;
  }
  out.set_watch_streams(static_cast<uint32_t>(hub_.subscribers()));
  return out;
}

void CoordinatorAdminProvider::ListCheckpoints(const std::string& job,
                                               Reply<ckptd::v1::ListCheckpointsResponse> reply) {
  auto shared = std::make_shared<decltype(reply)>(std::move(reply));
  if (!Post([this, job, shared] {
        (*shared)(ListCommittedCheckpoints(sources_.fs, sources_.storage_root, job));
      })) {
    (*shared)(ShuttingDown());
  }
}

void CoordinatorAdminProvider::DescribeCheckpoint(
    const std::string& job, uint64_t step, Reply<ckptd::v1::DescribeCheckpointResponse> reply) {
  auto shared = std::make_shared<decltype(reply)>(std::move(reply));
  if (!Post([this, job, step, shared] {
        auto committed = DescribeCommittedCheckpoint(sources_.fs, sources_.storage_root, job, step);
        if (!committed.ok() && committed.status().code() == StatusCode::kNotFound) {
          // Perhaps a memory-only step: only this coordinator knows it.
          if (auto in_memory = core_->DescribeMemoryOnly(job, step); in_memory.ok()) {
            ckptd::v1::DescribeCheckpointResponse out;
            *out.mutable_manifest() = *in_memory->manifest;
            out.set_memory_only(true);
            for (size_t r = 0; r < in_memory->copies.size(); ++r) {
              auto* copies = out.add_copies();
              copies->set_rank(static_cast<uint32_t>(r));
              for (const auto& node : in_memory->copies[r]) copies->add_nodes(node);
            }
            committed = std::move(out);
          }
        }
        (*shared)(std::move(committed));
      })) {
    (*shared)(ShuttingDown());
  }
}

namespace {

// Runs an operator operation on `commit` from the provider's worker thread.
template <typename T>
std::function<void()> Operation(CommitEngine* commit, std::function<Result<T>(CommitEngine*)> op,
                                std::shared_ptr<AdminProvider::Reply<T>> reply) {
  return [commit, op = std::move(op), reply] {
    if (commit == nullptr) {
      (*reply)(Unimplemented("this coordinator has no commit engine to operate on"));
      return;
    }
    (*reply)(op(commit));
  };
}

}  // namespace

void CoordinatorAdminProvider::PinCheckpoint(const std::string& job, uint64_t step,
                                             Reply<ckptd::v1::PinCheckpointResponse> reply) {
  auto shared = std::make_shared<decltype(reply)>(std::move(reply));
  if (!Post(Operation<ckptd::v1::PinCheckpointResponse>(
          sources_.commit,
          [job, step](CommitEngine* c) { return ckpt::PinCheckpoint(c, job, step); }, shared))) {
    (*shared)(ShuttingDown());
  }
}

void CoordinatorAdminProvider::UnpinCheckpoint(const std::string& job, uint64_t step,
                                               Reply<ckptd::v1::UnpinCheckpointResponse> reply) {
  auto shared = std::make_shared<decltype(reply)>(std::move(reply));
  if (!Post(Operation<ckptd::v1::UnpinCheckpointResponse>(
          sources_.commit,
          [job, step](CommitEngine* c) { return ckpt::UnpinCheckpoint(c, job, step); }, shared))) {
    (*shared)(ShuttingDown());
  }
}

void CoordinatorAdminProvider::DeleteCheckpoint(const std::string& job, uint64_t step,
                                                Reply<ckptd::v1::DeleteCheckpointResponse> reply) {
  auto shared = std::make_shared<decltype(reply)>(std::move(reply));
  if (!Post(Operation<ckptd::v1::DeleteCheckpointResponse>(
          sources_.commit,
          [job, step](CommitEngine* c) { return ckpt::DeleteCheckpoint(c, job, step); }, shared))) {
    (*shared)(ShuttingDown());
  }
}

void CoordinatorAdminProvider::ReleaseJob(const std::string& job,
                                          Reply<ckptd::v1::ReleaseJobResponse> reply) {
  auto released = core_->ReleaseJob(job);
  if (!released.ok()) {
    reply(released.status());
    return;
  }
  ckptd::v1::ReleaseJobResponse out;
  out.set_through_step(released->through_step());
  reply(std::move(out));
}

void CoordinatorAdminProvider::SampleLoop() {
  MutexLock lock(mu_);
  while (!cv_.WaitFor(mu_, kProgressTick, [this]() REQUIRES(mu_) { return closed_; })) {
    if (hub_.subscribers() == 0) continue;
    lock.Unlock();
    const CoordinatorCore::Snapshot snap = core_->TakeSnapshot();
    const auto now = Clock::now();
    for (const auto& s : snap.steps) {
      ckptd::v1::WatchEventsResponse e;
      *e.mutable_progress() = ToStepStatus(s, now);
      hub_.Publish(s.job, std::move(e));
    }
    lock.Lock();
  }
}

}  // namespace ckpt
