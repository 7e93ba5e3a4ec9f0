#include "daemon/node_state.h"

#include <cerrno>
#include <random>

#include "common/atomic_file.h"
#include "common/logging.h"
#include "common/manifest_io.h"
#include "common/names.h"
#include "common/step_layout.h"
#include "daemon/node_manifest_builder.h"

namespace ckpt {

using ckptd::v1::StepState;

namespace {

// What every report of a step says: the step, its state, and the epoch it was made in.
ckptd::v1::ReportRanksRequest StepReport(const std::string& job, uint64_t step, uint32_t world_size,
                                         StepState state, bool memory_only, uint64_t epoch) {
  ckptd::v1::ReportRanksRequest req;
  req.set_job(job);
  req.set_step(step);
  req.set_world_size(world_size);
  req.set_state(state);
  req.set_memory_only(memory_only);
  req.set_epoch(epoch);
  return req;
}

// The PERSISTED report of a node manifest: every rank in it, and the manifest as reported.
ckptd::v1::ReportRanksRequest PersistedReport(const ckptd::v1::NodeManifest& m, uint32_t world_size,
                                              bool memory_only, uint64_t epoch,
                                              SkippedShards skips) {
  auto req = StepReport(m.job(), m.step(), world_size, ckptd::v1::STEP_STATE_PERSISTED, memory_only,
                        epoch);
  for (const auto& r : m.ranks()) req.add_ranks(r.rank());
  *req.mutable_node_manifest() = NodeManifestForReport(m, skips);
  return req;
}

}  // namespace

std::string_view StepStateName(StepState s) {
  switch (s) {
    case ckptd::v1::STEP_STATE_PENDING:
      return "pending";
    case ckptd::v1::STEP_STATE_CAPTURING:
      return "capturing";
    case ckptd::v1::STEP_STATE_CAPTURED:
      return "captured";
    case ckptd::v1::STEP_STATE_PERSISTING:
      return "persisting";
    case ckptd::v1::STEP_STATE_PERSISTED:
      return "persisted";
    case ckptd::v1::STEP_STATE_COMMITTED:
      return "committed";
    case ckptd::v1::STEP_STATE_ABORTED:
      return "aborted";
    case ckptd::v1::STEP_STATE_FAILED:
      return "failed";
    case ckptd::v1::STEP_STATE_REPLICATED:
      return "replicated";
    default:
      return "unknown";
  }
}

NodeState::NodeState(boost::asio::io_context& io, Config config, FileSystem* fs, HostPool* pool,
                     HotCache* hot, CaptureEngine* capture, CommitEngine* commit, TaskPool* storage)
    : io_(io),
      config_(std::move(config)),
      fs_(fs),
      pool_(pool),
      hot_(hot),
      capture_(capture),
      commit_(commit),
      tasks_(io, storage) {
  // Registration ids must not repeat across daemon restarts (the coordinator may still hold
  // the previous process's): a random start, 2^63 apart from 0.
  std::random_device rd;
  next_registration_id_ = ((uint64_t{rd()} << 32) | rd()) | (uint64_t{1} << 63);
}

NodeState::~NodeState() = default;

NodeState::Job& NodeState::JobNamed(const std::string& name) {
  return jobs_.try_emplace(name, name, config_.layout, &next_registration_id_).first->second;
}

bool NodeState::Terminal(StepState s) {
  // REPLICATED is a state only for memory-only steps, whose end it is.
  return s == ckptd::v1::STEP_STATE_COMMITTED || s == ckptd::v1::STEP_STATE_ABORTED ||
         s == ckptd::v1::STEP_STATE_FAILED || s == ckptd::v1::STEP_STATE_REPLICATED;
}

NodeState::Step* NodeState::FindStep(const std::string& job, uint64_t step) {
  auto j = jobs_.find(job);
  if (j == jobs_.end()) return nullptr;
  auto s = j->second.steps.find(step);
  return s == j->second.steps.end() ? nullptr : &s->second;
}

size_t NodeState::ActiveSteps(const Job& job) {
  size_t n = 0;
  for (const auto& [step, s] : job.steps) n += !Terminal(s.state) && !s.deferred ? 1 : 0;
  return n;
}

void NodeState::StartDeferred(const std::string& job_name) {
  auto j = jobs_.find(job_name);
  if (j == jobs_.end()) return;
  for (auto& [n, s] : j->second.steps) {
    if (ActiveSteps(j->second) >= config_.max_steps_in_flight) return;
    if (!s.deferred) continue;
    s.deferred = false;
    if (Terminal(s.state)) continue;  // aborted while waiting
    if (!s.deferred_captures.empty() && s.state == ckptd::v1::STEP_STATE_PENDING) {
      SetState(s, ckptd::v1::STEP_STATE_CAPTURING);
    }
    for (auto& c : s.deferred_captures) capture_->Submit(std::move(c));
    s.deferred_captures.clear();
  }
}

Result<NodeState::SaveOutcome> NodeState::StartSave(SaveRequest req) {
  const std::string ctx = "job '" + req.job + "' step " + std::to_string(req.step) + " rank " +
                          std::to_string(req.rank);
  if (draining_) return Unavailable(ctx + ": the daemon is shutting down");
  if (req.plan == nullptr) {
    return FailedPrecondition(ctx + ": save before any tensors were registered");
  }
  Job& job = JobNamed(req.job);
  auto it = job.steps.find(req.step);
  RankSave* replaced = nullptr;  // the held save this one replaces (SaveRequest::replace_held)
  if (req.replace_held) {
    RankSave* rs = nullptr;
    if (it != job.steps.end() && !Terminal(it->second.state)) {
      auto r = it->second.ranks.find(req.rank);
      if (r != it->second.ranks.end()) rs = &r->second;
    }
    if (rs == nullptr || !rs->held || rs->session_id != req.session_id) {
      return FailedPrecondition(ctx +
                                ": this session holds no save of the step to replace (it "
                                "was confirmed, or the step ended)");
    }
    replaced = rs;
  }
  if (it == job.steps.end()) {
    uint64_t newest = job.newest_on_storage.value_or(0);
    for (const auto& [n, s] : job.steps) {
      if (s.state == ckptd::v1::STEP_STATE_COMMITTED) newest = std::max(newest, n);
    }
    if (newest != 0 && req.step <= newest) {
      return FailedPrecondition(ctx + ": step is not newer than committed step " +
                                std::to_string(newest) +
                                " (a committed checkpoint is never overwritten: number steps "
                                "after it, or load it first)");
    }
    if (auto lost = job.lost_saves.find(req.step); lost != job.lost_saves.end()) {
      lost->second.erase(req.rank);  // this rank saves it after all
      if (!lost->second.empty()) {
        return FailedPrecondition(ctx + ": " + LostSaveReason(*lost->second.begin(), req.step) +
                                  "; save the next step");
      }
    }
    size_t deferred = 0;
    for (const auto& [n, s] : job.steps) deferred += s.deferred ? 1 : 0;
    if (deferred >= config_.max_steps_deferred) {
      return ResourceExhausted(ctx + ": " + std::to_string(deferred) +
                               " saves of this job are already waiting for older steps to "
                               "commit; call wait_snapshot before saving again");
    }
    Step fresh;
    fresh.job = req.job;
    fresh.step = req.step;
    fresh.world_size = req.world_size;
    fresh.memory_only = req.memory_only;
    if (req.memory_only) {
      // The node's own copy, kept until a newer step is replicated (OnReplicated).
      hot_->Keep(req.job, req.step);
      fresh.memory_keep = std::shared_ptr<void>(
          hot_, [job = req.job, step = req.step](HotCache* hot) { hot->Unkeep(job, step); });
    }
    // Beyond max_steps_in_flight the step is accepted but its captures wait (the trainer feels
    // it in wait_snapshot, like pool backpressure) until an older step ends.
    fresh.deferred = ActiveSteps(job) >= config_.max_steps_in_flight;
    it = job.steps.emplace(req.step, std::move(fresh)).first;
  }
  Step& s = it->second;
  const std::string stalled = capture_->StorageStalled();
  if (Terminal(s.state) && (req.on_full == ckptd::v1::FULL_POLICY_SKIP || !stalled.empty()) &&
      s.skipped) {
    // Another rank's skip already decided this step: this rank skips it too.
    return SaveOutcome{true, s.reason};
  }
  if (Terminal(s.state)) {
    return FailedPrecondition(ctx + ": the step already ended (" +
                              std::string(StepStateName(s.state)) +
                              (s.reason.empty() ? "" : ": " + s.reason) + ")");
  }
  if (s.world_size != req.world_size) {
    return InvalidArgument(ctx + ": world size " + std::to_string(req.world_size) +
                           " differs from the step's " + std::to_string(s.world_size));
  }
  if (s.memory_only != req.memory_only) {
    // The step can neither commit nor restore from memory alone: it fails for every rank (a
    // refusal alone would leave it waiting for this rank until the step timeout, and every
    // later commit of the job behind it).
    const std::string reason = "rank " + std::to_string(req.rank) + " saved it " +
                               (req.memory_only ? "memory-only (persist=False)" : "to storage") +
                               ", other ranks " +
                               (s.memory_only ? "memory-only (persist=False)" : "to storage") +
                               ": every rank must save a step the same way";
    FailLocally(s, ckptd::v1::STEP_STATE_FAILED, reason);
    return InvalidArgument(ctx + ": " + reason);
  }
  if (replaced == nullptr && s.ranks.count(req.rank) != 0) {
    return FailedPrecondition(ctx + ": this rank already saved it");
  }

  // The writer plan may leave this rank only part of what it registered.
  if (auto report = job.writers.Register(req.rank, req.world_size, req.session_id, req.plan)) {
    ReportRegistration(std::move(*report));
  }
  ASSIGN_OR_RETURN(req.plan, job.writers.Apply(req.rank, req.plan), ctx);
  if (replaced != nullptr) {
    // It read nothing: only the pool slots reserved for it go back.
    ReleaseReserved(*replaced->capture);
    replaced->capture.reset();
  }

  auto capture = std::make_shared<CaptureJob>();
  capture->job = req.job;
  capture->step = req.step;
  capture->rank = req.rank;
  capture->plan = req.plan;
  capture->fs = fs_;
  capture->step_dir = StepDir(config_.storage_root, req.job, req.step);
  capture->data_file = DataFileName(req.rank);
  capture->data_path = JoinPath(capture->step_dir, capture->data_file);
  capture->throttle_bytes_per_second = config_.capture_throttle_bytes_per_second;
  capture->memory_only = req.memory_only;

  // Skip policy — and any save while storage is stalled: nothing waits for space that a hung
  // filesystem may never free. The slots are taken now, or the step is skipped at once.
  if (req.on_full == ckptd::v1::FULL_POLICY_SKIP || !stalled.empty()) {
    const auto needed = static_cast<uint32_t>(req.plan->layout.slots.size());
    auto slots = pool_->TryAcquireMany(needed);
    if (!slots) {
      SaveOutcome out{true, "skipped: " + (stalled.empty() ? std::string() : stalled + "; ") +
                                "the host pool is full (this rank needs " + std::to_string(needed) +
                                " slots, " + std::to_string(pool_->free_slots()) + " are free)"};
      spdlog::warn("{}: {}", ctx, out.reason);
      s.ranks[req.rank] = RankSave{.session_id = req.session_id, .pid = req.pid, .finished = true};
      s.skipped = true;
      FailLocally(s, ckptd::v1::STEP_STATE_FAILED,
                  "rank " + std::to_string(req.rank) + " " + out.reason);
      return out;
    }
    capture->reserved_slots = std::move(*slots);
  }

  capture->on_captured = tasks_.OnLoop(
      [this, j = req.job, n = req.step, r = req.rank](Status st) { OnRankCaptured(j, n, r, st); });
  capture->on_persisted = tasks_.OnLoop(
      [this, j = req.job, n = req.step, r = req.rank](Status st) { OnRankPersisted(j, n, r, st); });
  RankSave* rs = replaced;  // a replacement keeps the rank's place: its report, its keep
  if (rs == nullptr) {
    rs = &(s.ranks[req.rank] = RankSave{.session_id = req.session_id, .pid = req.pid});
    if (replicas_ > 0 && (holders_.size() >= replicas_ || holders_planning_)) {
      // Until its bytes reached the holders, a newer step must not push them out of memory
      // (pool pressure still may: capture wins, and the replication then fails and says so).
      // Without enough holders, and none planned, nothing is sent, and the save costs nothing
      // more. (Holders that arrive before the persist get an unkept send: safe, as each window
      // is copied out under a pin.)
      hot_->Keep(req.job, req.step);
      rs->hot_keep = std::shared_ptr<void>(
          hot_, [job = req.job, step = req.step](HotCache* hot) { hot->Unkeep(job, step); });
    }
    Report(s, ckptd::v1::STEP_STATE_PENDING, {req.rank});
  }
  rs->capture = capture;
  rs->extra = std::move(req.extra);
  rs->sync_input = std::move(req.sync_input);
  rs->held = req.hold;
  if (req.hold) return SaveOutcome{.held = true};
  StartCapture(s, std::move(capture));
  return SaveOutcome{};
}

void NodeState::StartCapture(Step& s, std::shared_ptr<CaptureJob> capture) {
  if (s.deferred) {
    s.deferred_captures.push_back(std::move(capture));
    return;
  }
  if (s.state == ckptd::v1::STEP_STATE_PENDING) SetState(s, ckptd::v1::STEP_STATE_CAPTURING);
  // Start the capture after this handler returns, i.e. after the session has sent the Save
  // reply: waking a CPU-bound capture thread first delays the reply on a busy machine.
  tasks_.Later(
      [this, capture = std::move(capture)]() mutable { capture_->Submit(std::move(capture)); });
}

bool NodeState::ConfirmSave(const std::string& job, uint64_t step, uint32_t rank,
                            uint64_t session_id) {
  Step* s = FindStep(job, step);
  if (s == nullptr || Terminal(s->state)) return false;
  auto it = s->ranks.find(rank);
  if (it == s->ranks.end() || !it->second.held || it->second.session_id != session_id) {
    return false;
  }
  it->second.held = false;
  StartCapture(*s, it->second.capture);
  return true;
}

void NodeState::ReleaseReserved(CaptureJob& capture) {
  for (HostPool::SlotId slot : capture.reserved_slots) pool_->Release(slot);
  capture.reserved_slots.clear();
}

void NodeState::OnRankCaptured(const std::string& job, uint64_t step, uint32_t rank, Status st) {
  Step* s = FindStep(job, step);
  if (s == nullptr) return;
  if (!st.ok()) {
    if (!Terminal(s->state)) {
      FailLocally(*s, ckptd::v1::STEP_STATE_FAILED,
                  "rank " + std::to_string(rank) + " capture failed: " + st.message());
    }
    return;
  }
  if (auto sync = s->ranks[rank].sync_input) {
    // Everything the trainer sent before this moment is read first: an Abandon (or the session's
    // end) among it aborts the step before it can count as captured. The session calls back at
    // once, or later when its input waits behind a registration (session.h).
    // Until then its persist, should it come first, waits too (OnRankPersisted): the step must
    // not commit on a capture an Abandon still unread can void.
    s->ranks[rank].syncing = true;
    sync([this, job, step, rank] {
      Step* synced = FindStep(job, step);
      if (synced == nullptr) return;
      RankSave& rs = synced->ranks[rank];
      rs.syncing = false;
      std::optional<Status> persisted = std::move(rs.persisted_early);
      rs.persisted_early.reset();
      if (!Terminal(synced->state)) CountRankCaptured(*synced, rank);
      if (persisted) OnRankPersisted(job, step, rank, std::move(*persisted));
    });
    return;
  }
  CountRankCaptured(*s, rank);
}

void NodeState::CountRankCaptured(Step& s, uint32_t rank) {
  RankSave& captured_rank = s.ranks[rank];
  captured_rank.captured = true;
  captured_rank.captured_at = std::chrono::steady_clock::now();
  if (observer_ != nullptr && captured_rank.capture) {
    observer_->OnRankCaptured(
        s.job, s.step, rank, captured_rank.capture->plan->total_bytes,
        std::chrono::duration<double>(captured_rank.captured_at - captured_rank.accepted).count());
  }
  // The coordinator decides when the whole step is captured.
  if (!Terminal(s.state)) Report(s, ckptd::v1::STEP_STATE_CAPTURED, {rank});
  ResolveWaiters(s);
}

void NodeState::OnRankPersisted(const std::string& job, uint64_t step, uint32_t rank, Status st) {
  Step* s = FindStep(job, step);
  if (s == nullptr) return;
  RankSave& rs = s->ranks[rank];
  if (rs.syncing) {
    rs.persisted_early = std::move(st);  // handled once the capture counts (OnRankCaptured)
    return;
  }
  rs.finished = true;
  if (!st.ok() || Terminal(s->state)) rs.hot_keep.reset();  // nothing of it is replicated
  if (!st.ok()) {
    if (!Terminal(s->state)) {
      FailLocally(*s, ckptd::v1::STEP_STATE_FAILED,
                  "rank " + std::to_string(rank) + " write failed: " + st.message());
    }
    MaybeCleanup(*s);
    CheckDrained();
    return;
  }
  rs.persisted = true;
  if (observer_ != nullptr && rs.capture && !s->memory_only) {  // memory-only: nothing written
    observer_->OnRankPersisted(
        job, step, rank, rs.capture->plan->total_bytes,
        std::chrono::duration<double>(std::chrono::steady_clock::now() - rs.captured_at).count());
  }
  if (Terminal(s->state)) {
    MaybeCleanup(*s);
    CheckDrained();
    return;
  }
  ReportNodeManifest(*s);
  StartReplication(*s, rank);
}

void NodeState::StartReplication(Step& s, uint32_t rank) {
  RankSave& rs = s.ranks[rank];
  std::shared_ptr<void> keep = std::move(rs.hot_keep);
  if (replicas_ == 0) {  // held here, as asked: nothing to send
    rs.replicated = true;
    ReportReplicated(s, rank, {}, "");
    return;
  }
  if (!replicate_ || !rs.capture) {
    rs.replication_error = "this daemon has no data plane to replicate over";
    ReportReplicated(s, rank, {}, rs.replication_error);
    return;
  }
  ReplicationRequest request;
  request.job = s.job;
  request.step = s.step;
  request.file = rs.capture->data_file;
  for (const Slot& slot : rs.capture->plan->layout.slots) {
    if (slot.length > 0) request.ranges.emplace_back(slot.file_offset, slot.length);
  }
  // The keep travels with the request and is released on the sender's thread: never in a
  // handler on the loop, which may outlive the hot cache at shutdown.
  request.keep = std::move(keep);
  if (holders_.size() < replicas_ && holders_planning_) {
    // This node (new, back or changed) is about to get holders: the rank waits for them, its
    // request ready (a commit meanwhile releases the capture, not the request's keep), rather
    // than be reported not replicated.
    awaiting_holders_.emplace_back(rank, std::move(request));
    return;
  }
  SendReplication(s, rank, std::move(request));
}

void NodeState::SendReplication(Step& s, uint32_t rank, ReplicationRequest request) {
  if (holders_.size() < replicas_) {
    RankSave& rs = s.ranks[rank];
    rs.replication_error = "this node has " + std::to_string(holders_.size()) + " of the " +
                           std::to_string(replicas_) +
                           " holder(s) it asks for (--replicas); the coordinator assigns them "
                           "among other daemons with --peer-listen and a --peer-pool";
    ReportReplicated(s, rank, {}, rs.replication_error);
    return;
  }
  request.holders.assign(holders_.begin(), holders_.begin() + replicas_);
  replicate_(std::move(request), tasks_.OnLoop([this, job = s.job, step = s.step, rank](
                                                   Status st, std::vector<std::string> holders) {
    OnRankReplicated(job, step, rank, std::move(st), std::move(holders));
  }));
}

void NodeState::OnRankReplicated(const std::string& job, uint64_t step, uint32_t rank, Status st,
                                 std::vector<std::string> holders) {
  Step* s = FindStep(job, step);
  if (s == nullptr) return;
  RankSave& rs = s->ranks[rank];
  if (!st.ok()) {
    spdlog::warn("job '{}' step {} rank {}: {}", job, step, rank, st.message());
    rs.replication_error = st.message();
    ReportReplicated(*s, rank, {}, rs.replication_error);
    return;
  }
  rs.replicated = true;
  rs.replica_holders = holders;
  ReportReplicated(*s, rank, holders, "");
}

void NodeState::ReportReplicated(const Step& s, uint32_t rank,
                                 const std::vector<std::string>& holders, std::string reason) {
  if (s.state == ckptd::v1::STEP_STATE_ABORTED || s.state == ckptd::v1::STEP_STATE_FAILED) return;
  if (s.fenced) return;
  // Decided not replicated already: another failure adds nothing (a success still tells where
  // the rank's copies are, for restores).
  if (!reason.empty() && s.not_replicated) return;
  auto req = StepReport(s.job, s.step, s.world_size, ckptd::v1::STEP_STATE_REPLICATED,
                        s.memory_only, epoch_);
  req.add_ranks(rank);
  for (const auto& h : holders) req.add_holders(h);
  req.set_reason(std::move(reason));
  link_->ReportRanks(std::move(req));
}

void NodeState::OnSaveLost(const std::string& job, uint64_t step, uint32_t rank,
                           uint32_t world_size) {
  Step* s = FindStep(job, step);
  if (s == nullptr) {
    // Not saved here yet: another rank's save of it may still come. Remembered, it is refused.
    auto& lost = JobNamed(job).lost_saves;
    lost[step].insert(rank);
    while (lost.size() > config_.finished_steps_kept) lost.erase(lost.begin());
    return;
  }
  if (Terminal(s->state) || s->world_size != world_size || s->ranks.count(rank) != 0) return;
  FailLocally(*s, ckptd::v1::STEP_STATE_ABORTED, LostSaveReason(rank, step));
}

std::string NodeState::LostSaveReason(uint32_t rank, uint64_t step) {
  return "rank " + std::to_string(rank) + " saved step " + std::to_string(step) +
         " on a connection that broke before this daemon heard of it (its daemon was restarted, "
         "or the connection was lost), so step " +
         std::to_string(step) + " can never complete";
}

void NodeState::SetState(Step& s, StepState state) {
  s.state = state;
  spdlog::info("job '{}' step {}: {}{}", s.job, s.step, StepStateName(state),
               s.reason.empty() ? "" : " (" + s.reason + ")");
  if (observer_ != nullptr) observer_->OnStepState(s.job, s.step, state, s.reason);
  Publish(s);
  ResolveWaiters(s);
  if (Terminal(state)) {
    // Deferred and held captures of a failed step never started: they hold no files, nothing to
    // wait for, only the pool slots reserved for them.
    for (auto& c : s.deferred_captures) {
      ReleaseReserved(*c);
      auto it = s.ranks.find(c->rank);
      if (it != s.ranks.end()) it->second.finished = true;
    }
    s.deferred_captures.clear();
    for (auto& [r, rs] : s.ranks) {
      if (!rs.held) continue;
      rs.held = false;
      if (rs.capture) ReleaseReserved(*rs.capture);
      rs.finished = true;
    }
    tasks_.Later([this, job = s.job] { StartDeferred(job); });
  }
}

void NodeState::OnReplicated(Step& s) {
  s.replicated = true;
  const std::string job = s.job;
  const uint64_t step = s.step;
  Job& j = JobNamed(job);
  // Older memory-only steps leave memory now that a newer step is held by its holders too.
  for (auto& [n, older] : j.steps) {
    if (n < step && older.memory_only) older.memory_keep.reset();
  }
  if (!s.memory_only || Terminal(s.state)) {
    ResolveWaiters(s);
    return;
  }
  s.decided_globally = true;
  SetState(s, ckptd::v1::STEP_STATE_REPLICATED);
  ReleaseCaptures(s);
  Prune(j);  // may erase s
  CheckDrained();
}

void NodeState::FailStep(Step& s, StepState state, const std::string& reason) {
  if (Terminal(s.state)) return;
  s.reason = reason;
  for (auto& [r, rs] : s.ranks) {
    if (rs.capture) rs.capture->cancelled.store(true);
  }
  pool_->WakeAll();
  hot_->Drop(s.job, s.step);
  s.memory_keep.reset();
  SetState(s, state);
  MaybeCleanup(s);
  CheckDrained();
}

void NodeState::MaybeCleanup(Step& s) {
  if (s.cleanup_posted || !Terminal(s.state) || s.state == ckptd::v1::STEP_STATE_COMMITTED ||
      s.state == ckptd::v1::STEP_STATE_REPLICATED) {
    return;
  }
  // Only the coordinator's decision makes the step's files garbage (see the essay).
  if (!s.decided_globally) return;
  for (const auto& [r, rs] : s.ranks) {
    if (rs.capture && !rs.finished) return;  // its writer still holds files in the directory
  }
  s.cleanup_posted = true;
  tasks_.Run(
      [commit = commit_, hot = hot_, job = s.job, step = s.step] {
        Status st = commit->RemoveStep(job, step);
        if (!st.ok()) spdlog::warn("job '{}' step {}: cleanup: {}", job, step, st.ToString());
        hot->Drop(job, step);  // anything adopted after the failure
      },
      [this] { CheckDrained(); },
      [job = s.job, step = s.step] {
        spdlog::warn(
            "job '{}' step {}: cleanup: the daemon is stopping; its directory is left "
            "to the next recovery scan",
            job, step);
      });
  for (auto& [r, rs] : s.ranks) rs.capture.reset();  // drop plans and mappings
}

void NodeState::ResolveWaiters(Step& s) {
  std::vector<Waiter> keep;
  std::vector<std::pair<Done, Status>> ready;
  const bool failed =
      s.state == ckptd::v1::STEP_STATE_ABORTED || s.state == ckptd::v1::STEP_STATE_FAILED;
  for (auto& w : s.waiters) {
    if (NeverReached(s, w)) {
      ready.emplace_back(
          std::move(w.done),
          FailedPrecondition("job '" + s.job + "' step " + std::to_string(s.step) +
                             " is memory-only (saved with persist=False): it is never " +
                             std::string(StepStateName(w.state)) + "; wait for \"replicated\""));
    } else if (WaiterReached(s, w)) {
      ready.emplace_back(std::move(w.done), Status::Ok());
    } else if (!w.rank_captured && w.state == ckptd::v1::STEP_STATE_REPLICATED && !failed &&
               s.not_replicated) {
      ready.emplace_back(std::move(w.done),
                         FailedPrecondition("job '" + s.job + "' step " + std::to_string(s.step) +
                                            " is not replicated: " + *s.not_replicated));
    } else if (failed) {
      // ABORTED for a failed step too (the message names which), as the clients report a wait
      // answered with either state: the step will not get there, and nothing in ckptd is broken.
      ready.emplace_back(std::move(w.done),
                         Aborted("job '" + s.job + "' step " + std::to_string(s.step) + " " +
                                 std::string(StepStateName(s.state)) + ": " + s.reason));
    } else {
      keep.push_back(std::move(w));
    }
  }
  s.waiters = std::move(keep);
  for (auto& [done, st] : ready) done(st);
}

bool NodeState::NeverReached(const Step& s, const Waiter& w) {
  return s.memory_only && !w.rank_captured &&
         (w.state == ckptd::v1::STEP_STATE_PERSISTED || w.state == ckptd::v1::STEP_STATE_COMMITTED);
}

bool NodeState::WaiterReached(const Step& s, const Waiter& w) {
  if (w.rank_captured) {
    auto it = s.ranks.find(w.rank);
    return it != s.ranks.end() && it->second.captured;
  }
  if (s.state == ckptd::v1::STEP_STATE_ABORTED || s.state == ckptd::v1::STEP_STATE_FAILED) {
    return false;
  }
  if (w.state == ckptd::v1::STEP_STATE_REPLICATED) return s.replicated;  // beside the state
  return s.state >= w.state;
}

void NodeState::WaitCaptured(const std::string& job, uint64_t step, uint32_t rank, Done done) {
  Step* s = FindStep(job, step);
  if (s == nullptr) {
    WaitState(job, step, ckptd::v1::STEP_STATE_COMMITTED, std::move(done));
    return;
  }
  s->waiters.push_back(Waiter{true, rank, ckptd::v1::STEP_STATE_CAPTURED, std::move(done)});
  ResolveWaiters(*s);
}

void NodeState::WaitState(const std::string& job, uint64_t step, StepState state, Done done) {
  Step* s = FindStep(job, step);
  if (s != nullptr) {
    s->waiters.push_back(Waiter{false, 0, state, std::move(done)});
    ResolveWaiters(*s);
    return;
  }
  if (state == ckptd::v1::STEP_STATE_REPLICATED) {
    done(NotFound("job '" + job + "' step " + std::to_string(step) +
                  " is not known on this node: its replication is followed only while the step "
                  "is among the node's recent steps"));
    return;
  }
  // Not known here: it may be an older committed step (or unknown).
  tasks_.Run(
      [commit = commit_, job, step] {
        auto list = commit->List(job);
        if (!list.ok()) return list.status();
        if (!std::binary_search(list->begin(), list->end(), step)) {
          return NotFound("job '" + job + "' step " + std::to_string(step) +
                          " is neither in flight on this node nor committed");
        }
        return Status::Ok();
      },
      [done = std::move(done)](Status st) { done(st); },
      [job, step] { return DaemonStopping("job '" + job + "' step " + std::to_string(step)); });
}

void NodeState::Latest(const std::string& job,
                       std::function<void(Result<std::optional<uint64_t>>)> done) {
  // The coordinator's answer; if it cannot be reached, the storage root's (same truth).
  link_->Latest(
      job, std::nullopt,
      tasks_.OnLoop([this, job, done = std::move(done)](Result<std::optional<uint64_t>> r) {
        if (r.ok()) {
          done(std::move(r));
          return;
        }
        spdlog::warn("{}; reading LATEST from the storage root instead", r.status().message());
        tasks_.Run([commit = commit_, job] { return commit->Latest(job); }, done,
                   [job]() -> Result<std::optional<uint64_t>> {
                     return DaemonStopping("LATEST of job '" + job + "'");
                   });
      }));
}

void NodeState::RestorePoint(const std::string& job, uint32_t rank, uint32_t world_size,
                             uint64_t session_id,
                             std::function<void(Result<std::optional<uint64_t>>)> done) {
  JobNamed(job).restore_askers[rank] = {session_id, world_size};
  link_->Latest(job, CoordinatorPort::RestoreQuery{rank, world_size, RestoreSession(session_id)},
                tasks_.OnLoop(std::move(done)));
}

std::string NodeState::RestoreSession(uint64_t session_id) const {
  return config_.node_id + "/" + std::to_string(session_id);
}

void NodeState::AddSink(const std::string& job, std::weak_ptr<EventSink> sink) {
  Job& j = JobNamed(job);
  auto& sinks = j.sinks;
  std::erase_if(sinks, [](const auto& w) { return w.expired(); });
  sinks.push_back(std::move(sink));
  if (!j.storage_lookup_posted) {
    // What an earlier incarnation committed, so that a save of such a step number is refused
    // at once (the writers check again before they create a file: this lookup may be late).
    j.storage_lookup_posted = true;
    tasks_.Run(
        [commit = commit_, job] {
          auto steps = commit->List(job);
          return steps.ok() && !steps->empty() ? std::optional<uint64_t>(steps->back())
                                               : std::nullopt;
        },
        [this, job](std::optional<uint64_t> newest) {
          if (!newest) return;
          Job& j = JobNamed(job);
          j.newest_on_storage = std::max(j.newest_on_storage.value_or(0), *newest);
        },
        // Stopping: no saves are taken any more, so nothing needs the answer.
        [] { return std::optional<uint64_t>(); });
  }
}

void NodeState::Publish(const Step& s) {
  auto j = jobs_.find(s.job);
  if (j == jobs_.end()) return;
  ckptd::v1::Event e;
  e.set_job(s.job);
  e.set_step(s.step);
  e.set_state(s.state);
  e.set_reason(s.reason);
  for (const auto& w : j->second.sinks) {
    if (auto sink = w.lock()) sink->OnEvent(e);
  }
}

bool NodeState::Abandon(const std::string& job, uint64_t step, uint32_t rank, uint64_t session_id,
                        const std::string& reason) {
  Step* s = FindStep(job, step);
  if (s == nullptr || Terminal(s->state)) return false;
  auto it = s->ranks.find(rank);
  if (it == s->ranks.end() || it->second.session_id != session_id) return false;
  // An abandoned step is never committed — unless this rank's capture already completed: the
  // coordinator's commit may be under way at any time after the rank reported it, and a capture
  // counts as complete only once the session's input was read (session.h), so the trainer had
  // not touched the memory yet, the bytes are intact, and the commit stands.
  if (it->second.captured) return false;
  FailLocally(*s, ckptd::v1::STEP_STATE_ABORTED,
              "rank " + std::to_string(rank) + " abandoned step " + std::to_string(step) +
                  (reason.empty() ? std::string() : ": " + reason));
  return true;
}

void NodeState::OnSessionClosed(uint64_t session_id, const std::string& job, uint32_t rank,
                                int32_t pid) {
  auto j = jobs_.find(job);
  if (j == jobs_.end()) return;
  {
    // The trainer is gone, and with it its layout (no rank may skip a replica on its account)
    // and its part in a restore that did not reach training (restore_points.h).
    Job& jr = j->second;
    ckptd::v1::ReportRegistrationRequest req;
    req.set_job(job);
    req.set_rank(rank);
    req.set_withdrawn(true);
    jr.writers.Withdraw(rank, session_id, &req);
    if (auto asked = jr.restore_askers.find(rank);
        asked != jr.restore_askers.end() && asked->second.first == session_id) {
      req.set_world_size(asked->second.second);
      req.set_restore_session(RestoreSession(session_id));
      jr.restore_askers.erase(asked);
    }
    if (req.world_size() != 0) {
      jr.writers.RememberWithdrawal(rank, req);
      ReportRegistration(std::move(req));
    }
  }
  for (auto& [n, s] : j->second.steps) {
    if (Terminal(s.state)) continue;
    auto it = s.ranks.find(rank);
    if (it == s.ranks.end() || it->second.session_id != session_id || it->second.captured) continue;
    FailLocally(s, ckptd::v1::STEP_STATE_ABORTED,
                "rank " + std::to_string(rank) + " (pid " + std::to_string(pid) +
                    ") disconnected before its snapshot of step " + std::to_string(n) +
                    " was captured");
  }
}

void NodeState::ReleaseCaptures(Step& s) {
  // Called right after the step's waiters were answered, when a trainer's next Save may already
  // be queued behind this handler: the captures (per-tensor checksum lists, the data file's
  // writer — O(tensors) to free) are dropped on the storage thread, not here on the loop.
  std::vector<std::shared_ptr<CaptureJob>> done;
  for (auto& [r, rs] : s.ranks) {
    if (rs.capture) done.push_back(std::move(rs.capture));
    rs.hot_keep.reset();  // a replication under way holds its own share
  }
  if (!done.empty()) tasks_.FreeInBackground(std::move(done));
}

void NodeState::Prune(Job& j) {
  size_t finished = 0;
  for (const auto& [n, s] : j.steps) finished += Terminal(s.state) ? 1 : 0;
  // Like ReleaseCaptures, called right after a step's waiters were answered: a pruned step's
  // node manifest and extras (O(tensors) protobuf entries) are freed on the storage thread.
  std::vector<Step> pruned;
  for (auto it = j.steps.begin(); it != j.steps.end() && finished > config_.finished_steps_kept;) {
    const Step& s = it->second;
    // A failed step's files are removed by MaybeCleanup, or by the coordinator that decided it.
    const bool removable = Terminal(s.state) && s.waiters.empty();
    if (removable) {
      for (auto& [r, rs] : it->second.ranks) rs.hot_keep.reset();  // here, while the cache lives
      it->second.memory_keep.reset();
      pruned.push_back(std::move(it->second));
      it = j.steps.erase(it);
      --finished;
    } else {
      ++it;
    }
  }
  if (!pruned.empty()) tasks_.FreeInBackground(std::move(pruned));
}

void NodeState::Drain(std::function<void()> idle) {
  draining_ = true;
  on_idle_ = std::move(idle);
  CheckDrained();
}

void NodeState::CancelAll(const std::string& reason) {
  for (auto& [name, j] : jobs_) {
    for (auto& [n, s] : j.steps) {
      if (!Terminal(s.state)) FailLocally(s, ckptd::v1::STEP_STATE_ABORTED, reason);
    }
  }
}

std::vector<StepSnapshot> NodeState::Snapshot() const {
  std::vector<StepSnapshot> out;
  for (const auto& [name, j] : jobs_) {
    for (const auto& [n, s] : j.steps) {
      StepSnapshot& snap = out.emplace_back();
      snap.job = s.job;
      snap.step = s.step;
      snap.state = s.state;
      snap.reason = s.reason;
      snap.world_size = s.world_size;
      snap.accepted = s.accepted;
      for (const auto& [r, rs] : s.ranks) {
        StepSnapshot::Rank& rank = snap.ranks.emplace_back();
        rank.rank = r;
        rank.pid = rs.pid;
        rank.captured = rs.captured;
        rank.persisted = rs.persisted;
        if (rs.capture) {  // dropped once the step ended
          rank.bytes_total = rs.capture->plan->total_bytes;
          rank.bytes_captured = std::min(rs.capture->bytes_captured.load(), rank.bytes_total);
          rank.bytes_persisted = std::min(rs.capture->bytes_written.load(), rank.bytes_total);
        }
        if (rs.persisted) rank.bytes_persisted = rank.bytes_total;
      }
    }
  }
  return out;
}

void NodeState::CheckDrained() {
  if (!draining_ || !on_idle_) return;
  for (const auto& [name, j] : jobs_) {
    for (const auto& [n, s] : j.steps) {
      if (!Terminal(s.state)) return;
      for (const auto& [r, rs] : s.ranks) {
        if (rs.capture && !rs.finished) return;
      }
    }
  }
  auto idle = std::move(on_idle_);
  on_idle_ = nullptr;
  idle();
}

// ---------------------------------------------------------------- reports to the coordinator, and
// its decisions

void NodeState::FailLocally(Step& s, StepState state, const std::string& reason) {
  if (Terminal(s.state)) return;
  Report(s, state, RanksOf(s), reason);
  FailStep(s, state, reason);
}

std::vector<uint32_t> NodeState::RanksOf(const Step& s) {
  std::vector<uint32_t> ranks;
  for (const auto& [r, rs] : s.ranks) ranks.push_back(r);
  return ranks;
}

void NodeState::Report(const Step& s, StepState state, std::vector<uint32_t> ranks,
                       std::string reason) {
  // A fenced step's progress is from the epoch that ended: only its end is reported.
  if (s.fenced && state != ckptd::v1::STEP_STATE_ABORTED && state != ckptd::v1::STEP_STATE_FAILED) {
    return;
  }
  auto req = StepReport(s.job, s.step, s.world_size, state, s.memory_only, epoch_);
  for (uint32_t r : ranks) req.add_ranks(r);
  req.set_reason(std::move(reason));
  req.set_skipped(s.skipped);
  link_->ReportRanks(std::move(req));
}

void NodeState::ReportNodeManifest(Step& s) {
  std::vector<PersistedRank> ranks;
  for (const auto& [rank, rs] : s.ranks) {
    if (rs.persisted && rs.capture) ranks.push_back({rank, rs.capture, rs.extra});
  }
  // The storage thread runs these in order, so each file written holds a superset of the last.
  // The report goes from there too: the coordinator hears of the manifest once it is durable.
  using Written = std::pair<Status, std::shared_ptr<const ckptd::v1::NodeManifest>>;
  tasks_.Run(
      [fs = fs_, link = link_, root = config_.storage_root, node_id = config_.node_id, job = s.job,
       step = s.step, world_size = s.world_size, memory_only = s.memory_only, epoch = epoch_,
       skips = s.skipped_shards(), report = !s.fenced, ranks = std::move(ranks)]() -> Written {
        auto node = BuildNodeManifest(job, step, world_size, node_id, ranks);
        if (!node.ok()) return {node.status(), nullptr};
        if (!memory_only) {  // a memory-only step's manifest lives in the coordinator's memory
          Status st = WriteFileAtomically(
              fs, JoinPath(StepDir(root, job, step), NodeManifestFileName(node_id)),
              EncodeNodeManifest(*node));
          if (!st.ok()) return {st, nullptr};
        }
        auto manifest = std::make_shared<const ckptd::v1::NodeManifest>(std::move(node).value());
        if (report) {
          link->ReportRanks(PersistedReport(*manifest, world_size, memory_only, epoch, skips));
        }
        return {Status::Ok(), manifest};
      },
      [this, job = s.job, step = s.step, connection = connections_](Written written) {
        auto& [st, manifest] = written;
        Step* s = FindStep(job, step);
        if (s == nullptr || Terminal(s->state)) return;
        if (!st.ok()) {
          // Only the coordinator removes step directories (after its abort decision, or its
          // recovery scan after a restart): a directory gone from under us means the step was
          // aborted globally, and that is what the trainers are told.
          const bool removed_globally = st.sys_errno() == ENOENT;
          FailLocally(
              *s, removed_globally ? ckptd::v1::STEP_STATE_ABORTED : ckptd::v1::STEP_STATE_FAILED,
              removed_globally ? "the coordinator removed the step's directory (it aborted the "
                                 "step) while this node wrote its manifest: " +
                                     st.message()
                               : "node manifest: " + st.message());
          return;
        }
        if (!s->node_manifest || s->node_manifest->ranks_size() < manifest->ranks_size()) {
          s->node_manifest = manifest;
        }
        // The link reconnected while this manifest was written: the report sent from the
        // storage thread may have gone to the old connection, and the re-report on reconnect
        // may have run before the manifest was here. Sent again (reports are idempotent).
        if (connection != connections_) ReportPersisted(*s);
      },
      // Stopping: the manifest is never written, so the step fails here (the handler above).
      [job = s.job, step = s.step]() -> Written {
        return {DaemonStopping("job '" + job + "' step " + std::to_string(step)), nullptr};
      });
}

void NodeState::ReportReplicationAgain(const Step& s) {
  if (s.replicated || s.not_replicated) return;  // decided already
  for (const auto& [r, rs] : s.ranks) {
    if (rs.replicated || !rs.replication_error.empty()) {
      ReportReplicated(s, r, rs.replica_holders, rs.replication_error);
    }
  }
}

void NodeState::ReportMemoryStepsAgain(const Job& j) {
  // A restarted coordinator knows nothing of memory-only steps (their manifests lived in its
  // memory): the newest two this node still holds are reported again, whole — saved, captured,
  // in memory with the node manifest, replicated with the holders — so that once every node of
  // such a step has reported it, the coordinator ends it replicated again and restores can use
  // it. A coordinator that still knows the step answers with its decision; one whose nodes did
  // not all come back never ends it (not restorable: the safe side).
  int reported = 0;
  for (auto it = j.steps.rbegin(); it != j.steps.rend() && reported < 2; ++it) {
    const Step& s = it->second;
    if (!s.memory_only || s.state != ckptd::v1::STEP_STATE_REPLICATED || !s.memory_keep) continue;
    ++reported;
    Report(s, ckptd::v1::STEP_STATE_PENDING, RanksOf(s));
    Report(s, ckptd::v1::STEP_STATE_CAPTURED, RanksOf(s));
    ReportPersisted(s);
    for (const auto& [r, rs] : s.ranks) {
      if (rs.replicated) ReportReplicated(s, r, rs.replica_holders, "");
    }
  }
}

void NodeState::OnJobReleased(const ckptd::v1::JobReleased& released) {
  size_t kept = 0;
  if (auto j = jobs_.find(released.job()); j != jobs_.end()) {
    for (auto& [n, s] : j->second.steps) {
      if (n > released.through_step()) break;
      if (s.memory_keep) ++kept;
      s.memory_keep.reset();  // the hot cache may reuse its slots now
    }
  }
  spdlog::info(
      "job '{}' released by the coordinator through step {} ({}){}", EscapeForLog(released.job()),
      released.through_step(), EscapeForLog(released.reason()),
      kept > 0 ? ": " + std::to_string(kept) + " memory-only step(s) kept here no longer" : "");
  if (job_released_) job_released_(released.job(), released.through_step());
}

void NodeState::ReplicateAwaiting() {
  auto awaiting = std::move(awaiting_holders_);
  awaiting_holders_.clear();
  for (auto& [rank, request] : awaiting) {
    // Gone, fenced or failed meanwhile: the request and its keep are dropped.
    if (Step* s = StillAwaiting(request)) SendReplication(*s, rank, std::move(request));
  }
}

NodeState::Step* NodeState::StillAwaiting(const ReplicationRequest& request) {
  Step* s = FindStep(request.job, request.step);
  if (s == nullptr || s->fenced || s->state == ckptd::v1::STEP_STATE_ABORTED ||
      s->state == ckptd::v1::STEP_STATE_FAILED) {
    return nullptr;
  }
  return s;
}

void NodeState::ReportRegistration(ckptd::v1::ReportRegistrationRequest req) {
  req.set_epoch(epoch_);
  link_->ReportRegistration(std::move(req));
}

void NodeState::ReportPersisted(const Step& s) {
  if (!s.node_manifest || s.fenced) return;
  link_->ReportRanks(
      PersistedReport(*s.node_manifest, s.world_size, s.memory_only, epoch_, s.skipped_shards()));
}

void NodeState::FenceSteps() {
  for (auto& [name, j] : jobs_) {
    for (auto& [n, s] : j.steps) {
      // Its memory-only steps no longer count as copies there: not reported again, not kept.
      s.memory_keep.reset();
      if (!Terminal(s.state)) s.fenced = true;
    }
  }
  std::erase_if(awaiting_holders_,
                [this](const auto& waiting) { return StillAwaiting(waiting.second) == nullptr; });
}

void NodeState::ReportFenced(const Step& s) {
  // Not failed here: a step every rank of which was persisted before the node was lost still
  // commits there, and the coordinator answers with its decision either way.
  Report(s, ckptd::v1::STEP_STATE_ABORTED, RanksOf(s),
         "this node was declared lost by the coordinator while it held the step (frozen or cut "
         "off for longer than its lease): what it had in flight then is fenced; save a later "
         "step");
}

void NodeState::OnCoordinatorConnected(const CoordinatorPort::Registration& registration) {
  ++connections_;
  epoch_ = registration.epoch;
  if (registration.fenced) {
    spdlog::warn(
        "the coordinator declared this node lost while it was unreachable: its steps "
        "in flight are reported aborted, its memory-only steps no longer count (epoch now {})",
        epoch_);
    FenceSteps();  // reported below
  }
  for (auto& [name, j] : jobs_) {
    // Until the coordinator's plan arrives (at once, on attach, when it has one), every rank
    // writes everything. The memory-only steps saved so far skipped under the plan before: the
    // coordinator may hear them before it resolves those registrations again (they wait for
    // layouts after a restart), and they have no node manifest file it could read instead.
    for (auto& [n, s] : j.steps) {
      if (s.memory_only) s.list_skips = true;
    }
    for (auto& report : j.writers.OnReconnect()) ReportRegistration(std::move(report));
    if (!registration.fenced) ReportMemoryStepsAgain(j);
    for (auto& [n, s] : j.steps) {
      if (s.state == ckptd::v1::STEP_STATE_COMMITTED && !registration.fenced) {
        ReportReplicationAgain(s);
      }
      if (Terminal(s.state)) {
        // Failed here, but the report may have died with the previous coordinator: without its
        // decision the step's files are never cleaned up (MaybeCleanup waits for it). Report
        // the failure again; the answer carries the decision.
        if (s.state != ckptd::v1::STEP_STATE_COMMITTED && !s.decided_globally) {
          Report(s, s.state, RanksOf(s), s.reason);
        }
        continue;
      }
      if (s.fenced) {
        ReportFenced(s);  // again after every reconnect, until the decision comes
        continue;
      }
      std::vector<uint32_t> saved, captured;
      for (const auto& [r, rs] : s.ranks) {
        saved.push_back(r);
        if (rs.captured) captured.push_back(r);
      }
      Report(s, ckptd::v1::STEP_STATE_PENDING, saved);
      if (!captured.empty()) Report(s, ckptd::v1::STEP_STATE_CAPTURED, captured);
      ReportPersisted(s);
      ReportReplicationAgain(s);  // after the step's other reports: they make it known there
    }
  }
}

void NodeState::OnCoordinatorEvent(const ckptd::v1::CoordinatorEvent& event) {
  if (event.has_plan()) {
    JobNamed(event.plan().job()).writers.OnPlan(event.plan());
    return;
  }
  if (event.has_holders()) {
    std::vector<ReplicaHolder> holders;
    std::string names;
    for (const auto& h : event.holders().holders()) {
      holders.push_back({h.node_id(), h.peer_address()});
      names += (names.empty() ? "" : ", ") + h.node_id() + " (" + h.peer_address() + ")";
    }
    if (replicas_ > 0) {
      spdlog::info("holders of this node's steps in memory: {}{}", names.empty() ? "none" : names,
                   event.holders().same_domain_size() > 0
                       ? " (" + std::to_string(event.holders().same_domain_size()) +
                             " in this node's failure domain: no other domain had room)"
                       : "");
    }
    holders_ = std::move(holders);
    holders_planning_ = event.holders().planning();
    if (!holders_planning_ || holders_.size() >= replicas_) ReplicateAwaiting();
    return;
  }
  if (event.has_released()) {
    OnJobReleased(event.released());
    return;
  }
  if (!event.has_step()) return;
  const auto& d = event.step();
  Step* s = FindStep(d.job(), d.step());
  if (s == nullptr) return;
  switch (d.state()) {
    case ckptd::v1::STEP_STATE_CAPTURED:
      if (!Terminal(s->state) && s->state < ckptd::v1::STEP_STATE_CAPTURED) {
        SetState(*s, ckptd::v1::STEP_STATE_CAPTURED);
        SetState(*s, ckptd::v1::STEP_STATE_PERSISTING);
      }
      break;
    case ckptd::v1::STEP_STATE_PERSISTED:
      if (!Terminal(s->state) && s->state < ckptd::v1::STEP_STATE_PERSISTED) {
        SetState(*s, ckptd::v1::STEP_STATE_PERSISTED);
      }
      break;
    case ckptd::v1::STEP_STATE_COMMITTED: {
      if (Terminal(s->state)) break;
      // The coordinator commits a step only after every rank reported it persisted, so a rank
      // saved here that has not persisted is not in this commit: the coordinator found the step
      // number already committed on storage (by an earlier daemon or trainer incarnation; the
      // save was accepted before this node's own lookup of committed steps answered). That
      // save's bytes are not what the step holds (its writer refuses the committed directory):
      // it fails, and nothing is removed — the directory is the committed step's.
      bool all_persisted = true;
      for (const auto& [r, rs] : s->ranks) all_persisted = all_persisted && rs.persisted;
      if (!all_persisted) {
        FailStep(*s, ckptd::v1::STEP_STATE_FAILED,
                 "step " + std::to_string(d.step()) +
                     " is already committed (by an earlier run of the job); a committed "
                     "checkpoint is never overwritten: save later step numbers");
        break;
      }
      s->decided_globally = true;
      SetState(*s, ckptd::v1::STEP_STATE_COMMITTED);
      ReleaseCaptures(*s);
      Prune(JobNamed(d.job()));  // may erase *s
      CheckDrained();
      break;
    }
    case ckptd::v1::STEP_STATE_REPLICATED:
      if (d.not_replicated()) {
        s->not_replicated = d.reason();
        ResolveWaiters(*s);
      } else {
        OnReplicated(*s);  // may erase *s
      }
      break;
    case ckptd::v1::STEP_STATE_ABORTED:
    case ckptd::v1::STEP_STATE_FAILED:
      s->decided_globally = true;
      if (!Terminal(s->state)) {
        s->skipped = d.skipped();
        FailStep(*s, d.state(), d.reason());
      } else {
        MaybeCleanup(*s);
      }
      break;
    default:
      break;
  }
}

}  // namespace ckpt
