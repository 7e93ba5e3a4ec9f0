#include "daemon/admin/node_admin_provider.h"

#include <boost/asio/post.hpp>

#include "daemon/admin/checkpoint_catalog.h"

namespace ckpt {

using ckptd::v1::StepState;

bool IsTerminalState(StepState s) {
  return s == ckptd::v1::STEP_STATE_COMMITTED || s == ckptd::v1::STEP_STATE_ABORTED ||
         s == ckptd::v1::STEP_STATE_FAILED;
}

ckptd::v1::StepStatus ToStepStatus(const StepSnapshot& s,
                                   std::chrono::steady_clock::time_point now) {
  ckptd::v1::StepStatus out;
  out.set_job(s.job);
  out.set_step(s.step);
  out.set_state(s.state);
  out.set_reason(s.reason);
  out.set_world_size(s.world_size);
  out.set_ranks_saved(static_cast<uint32_t>(s.ranks.size()));
  out.set_age_seconds(std::chrono::duration<double>(now - s.accepted).count());
  uint64_t total = 0, captured = 0, persisted = 0;
  for (const auto& r : s.ranks) {
    auto* rp = out.add_ranks();
    rp->set_rank(r.rank);
    rp->set_pid(r.pid);
    rp->set_bytes_total(r.bytes_total);
    rp->set_bytes_captured(r.bytes_captured);
    rp->set_bytes_persisted(r.bytes_persisted);
    rp->set_captured(r.captured);
    rp->set_persisted(r.persisted);
    total += r.bytes_total;
    captured += r.bytes_captured;
    persisted += r.bytes_persisted;
  }
  out.set_bytes_total(total);
  out.set_bytes_captured(captured);
  out.set_bytes_persisted(persisted);
  return out;
}

NodeAdminProvider::NodeAdminProvider(boost::asio::io_context& io, Sources sources)
    : io_(io), sources_(std::move(sources)), tick_(io) {}

NodeAdminProvider::~NodeAdminProvider() { *alive_ = false; }

void NodeAdminProvider::Start() {
  operations_.Start();
  ArmTick();
}

void NodeAdminProvider::Close() {
  std::map<uint64_t, Reply<ckptd::v1::GetStatusResponse>> pending;
  {
    MutexLock lock(mu_);
    closed_ = true;
    pending.swap(pending_status_);
  }
  for (auto& [id, reply] : pending)
    reply(Unavailable("node " + sources_.node_id + " is shutting down"));
  hub_.CloseAll();
  operations_.Stop();  // an operation under way finishes and answers
}

bool NodeAdminProvider::PostToStorage(std::function<void()> f) {
  MutexLock lock(mu_);
  if (closed_) return false;
  return sources_.storage->Post(std::move(f));
}

void NodeAdminProvider::GetStatus(Reply<ckptd::v1::GetStatusResponse> reply) {
  uint64_t id = 0;
  {
    MutexLock lock(mu_);
    if (!closed_) {
      id = next_status_id_++;
      pending_status_.emplace(id, std::move(reply));
    }
  }
  if (id == 0) {
    reply(Unavailable("node " + sources_.node_id + " is shutting down"));
    return;
  }
  // The reply stays in pending_status_ until the loop takes it, so Close() can answer it if
  // the loop never runs again.
  boost::asio::post(io_, [this, alive = alive_, id] {
    if (!*alive) return;
    Reply<ckptd::v1::GetStatusResponse> r;
    {
      MutexLock lock(mu_);
      auto it = pending_status_.find(id);
      if (it == pending_status_.end()) return;  // answered by Close()
      r = std::move(it->second);
      pending_status_.erase(it);
    }
    r(CollectStatus());
  });
}

ckptd::v1::GetStatusResponse NodeAdminProvider::CollectStatus() const {
  const auto now = std::chrono::steady_clock::now();
  ckptd::v1::GetStatusResponse out;
  out.set_node_id(sources_.node_id);
  out.set_version(sources_.version);
  out.set_role("daemon");
  out.set_uptime_seconds(std::chrono::duration<double>(now - started_).count());
  out.set_serving(serving_);
  out.set_draining(sources_.node->draining());
  for (const auto& [k, v] : sources_.config) {
    auto* e = out.add_config();
    e->set_key(k);
    e->set_value(v);
  }
  auto* pool = out.mutable_pool();
  const uint64_t total = sources_.pool->size_bytes();
  const uint64_t free_bytes = uint64_t{sources_.pool->free_slots()} * sources_.pool->slot_size();
  const uint64_t cached =
      std::min(sources_.hot->resident_bytes(), total - std::min(total, free_bytes));
  pool->set_total_bytes(total);
  pool->set_slot_bytes(sources_.pool->slot_size());
  pool->set_free_bytes(free_bytes);
  pool->set_cached_bytes(cached);
  pool->set_in_use_bytes(total - std::min(total, free_bytes + cached));
  pool->set_pinned(sources_.pool->locked());
  if (sources_.storage_activity) {
    const auto [in_flight, oldest] = sources_.storage_activity();
    auto* storage = out.mutable_storage();
    storage->set_calls_in_flight(in_flight);
    storage->set_oldest_call_seconds(oldest);
    storage->set_stall_timeout_seconds(sources_.storage_stall_timeout_seconds);
    storage->set_stalled(sources_.storage_stall_timeout_seconds > 0 && in_flight > 0 &&
                         oldest >= sources_.storage_stall_timeout_seconds);
  }
  auto* peer = out.mutable_peer();
  if (sources_.peer_store != nullptr) {
    peer->set_pool_bytes(sources_.peer_store->budget());
    peer->set_held_bytes(sources_.peer_store->used());
  }
  peer->set_replicas(sources_.replicas);
  peer->set_failure_domain(sources_.failure_domain);
  for (const ReplicaHolder& h : sources_.node->holders()) {
    peer->add_holders(h.node_id);
    peer->add_holder_addresses(h.address);
  }
  for (const auto& [id, c] : clients_) {
    auto* ci = out.add_clients();
    ci->set_session_id(id);
    ci->set_job(c.description.job);
    ci->set_rank(c.description.rank);
    ci->set_world_size(c.description.world_size);
    ci->set_pid(c.description.pid);
    ci->set_uid(c.description.uid);
    ci->set_connected_seconds(std::chrono::duration<double>(now - c.since).count());
  }
  for (const StepSnapshot& s : sources_.node->Snapshot()) {
    if (!IsTerminalState(s.state)) *out.add_steps() = ToStepStatus(s, now);
  }
  for (const auto& f : failures_) *out.add_recent_failures() = f;
  out.set_watch_streams(static_cast<uint32_t>(hub_.subscribers()));
  return out;
}

void NodeAdminProvider::ListCheckpoints(const std::string& job,
                                        Reply<ckptd::v1::ListCheckpointsResponse> reply) {
  auto shared = std::make_shared<decltype(reply)>(std::move(reply));
  if (!PostToStorage([this, job, shared] {
        (*shared)(ListCommittedCheckpoints(sources_.fs, sources_.storage_root, job));
      })) {
    (*shared)(Unavailable("node " + sources_.node_id + " is shutting down"));
  }
}

void NodeAdminProvider::DescribeCheckpoint(const std::string& job, uint64_t step,
                                           Reply<ckptd::v1::DescribeCheckpointResponse> reply) {
  auto shared = std::make_shared<decltype(reply)>(std::move(reply));
  if (!PostToStorage([this, job, step, shared] {
        (*shared)(DescribeCommittedCheckpoint(sources_.fs, sources_.storage_root, job, step));
      })) {
    (*shared)(Unavailable("node " + sources_.node_id + " is shutting down"));
  }
}

template <typename T>
void NodeAdminProvider::RunOperation(const std::string& what,
                                     std::function<Result<T>(CommitEngine*)> op, Reply<T> reply) {
  if (sources_.commit == nullptr) {
    reply(FailedPrecondition(what + ": node " + sources_.node_id +
                             " commits through the global coordinator at " + sources_.coordinator +
                             ", which owns the job's checkpoints; ask it "
                             "(ckptctl --admin " +
                             sources_.coordinator + ")"));
    return;
  }
  auto shared = std::make_shared<Reply<T>>(std::move(reply));
  bool posted = false;
  {
    MutexLock lock(mu_);
    posted = !closed_ && operations_.Post([this, op = std::move(op), shared] {
      (*shared)(op(sources_.commit));
    });
  }
  if (!posted) {
    (*shared)(Unavailable(what + ": node " + sources_.node_id + " is shutting down"));
  }
}

void NodeAdminProvider::PinCheckpoint(const std::string& job, uint64_t step,
                                      Reply<ckptd::v1::PinCheckpointResponse> reply) {
  RunOperation<ckptd::v1::PinCheckpointResponse>(
      "pin of job '" + job + "' step " + std::to_string(step),
      [job, step](CommitEngine* c) { return ckpt::PinCheckpoint(c, job, step); }, std::move(reply));
}

void NodeAdminProvider::UnpinCheckpoint(const std::string& job, uint64_t step,
                                        Reply<ckptd::v1::UnpinCheckpointResponse> reply) {
  RunOperation<ckptd::v1::UnpinCheckpointResponse>(
      "unpin of job '" + job + "' step " + std::to_string(step),
      [job, step](CommitEngine* c) { return ckpt::UnpinCheckpoint(c, job, step); },
      std::move(reply));
}

void NodeAdminProvider::DeleteCheckpoint(const std::string& job, uint64_t step,
                                         Reply<ckptd::v1::DeleteCheckpointResponse> reply) {
  RunOperation<ckptd::v1::DeleteCheckpointResponse>(
      "delete of job '" + job + "' step " + std::to_string(step),
      [job, step](CommitEngine* c) { return ckpt::DeleteCheckpoint(c, job, step); },
      std::move(reply));
}

void NodeAdminProvider::OnStepState(const std::string& job, uint64_t step, StepState state,
                                    const std::string& reason) {
  if (state == ckptd::v1::STEP_STATE_ABORTED || state == ckptd::v1::STEP_STATE_FAILED) {
    failures_.push_back(MakeFailure(job, step, state, reason));
    while (failures_.size() > kFailuresKept) failures_.pop_front();
  }
  hub_.Publish(job, StateChangeEvent(job, step, state, reason));
}

void NodeAdminProvider::OnClientConnected(const ClientDescription& client) {
  clients_[client.session_id] = Client{client, std::chrono::steady_clock::now()};
}

void NodeAdminProvider::OnClientDisconnected(uint64_t session_id) { clients_.erase(session_id); }

void NodeAdminProvider::ArmTick() {
  tick_.expires_after(kProgressTick);
  tick_.async_wait([this, alive = alive_](const boost::system::error_code& ec) {
    if (ec || !*alive) return;
    Tick();
    ArmTick();
  });
}

void NodeAdminProvider::Tick() {
  if (hub_.subscribers() == 0) return;
  {
    MutexLock lock(mu_);
    if (closed_) return;
  }
  const auto now = std::chrono::steady_clock::now();
  for (const StepSnapshot& s : sources_.node->Snapshot()) {
    if (IsTerminalState(s.state)) continue;
    ckptd::v1::WatchEventsResponse e;
    *e.mutable_progress() = ToStepStatus(s, now);
    hub_.Publish(s.job, std::move(e));
  }
}

}  // namespace ckpt
