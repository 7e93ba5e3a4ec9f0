// NodeState: every step this daemon knows of, its ranks' part in it, and the decisions of the
// coordinator applied to it (docs/design.md §2: PENDING → CAPTURING → CAPTURED → PERSISTING →
// PERSISTED → COMMITTED, or ABORTED / FAILED with a reason).
//
// Ownership: NodeState lives on the daemon's Asio loop and is only touched from it — no locks.
// Engine threads report through callbacks that post back onto the loop; storage work (node
// manifests, cleanup, LATEST lookups) runs on the storage thread and its outcome comes back
// onto the loop (loop_tasks.h).
//
// Its parts, each in its own file: the node manifest of a step (node_manifest_builder.h, a pure
// function), the writer plan's cut of each rank's registration (writer_plan_filter.h), and the
// off-loop work (loop_tasks.h). What stays here is the step table and its transitions.
//
// The step-wide rules — step order of commits, step timeouts and missing ranks, the writer
// plan, the commit itself, restore points — belong to the coordinator (coordinator_core.h),
// reached through a CoordinatorPort: in process on a single node (in_process_coordinator.h), or
// ckpt-coordinator over gRPC. There is one implementation of each. What this node does:
//   * reports each rank's save, capture and persist; on persist it writes the node manifest of
//     every rank it persisted so far to node-<id>.nmf (atomically) and reports it;
//   * takes the step's CAPTURED, PERSISTED, COMMITTED, ABORTED and FAILED states from the
//     coordinator's decisions;
//   * rules that need this node's knowledge, decided here and reported: a rank whose session
//     ends before its capture completed aborts the step, naming the rank (a rank that already
//     captured is persisted and committed without its trainer); a rank that abandons a step
//     (its trainer's fence gave up) aborts it, unless its capture completed — a capture counts
//     only after the session read everything its trainer sent until then
//     (SaveRequest::sync_input, which may call back later: a session's input can wait behind
//     a registration being built; the rank's persist is held back until then), so a late
//     Abandon is never missed; a rank that re-attaches saying its save of a step went out on
//     a connection that broke (Hello.lost_step) aborts that step, which can never complete; a
//     failed capture or write fails the step;
//   * a held save (SaveRequest::hold, proto/README.md) is accepted and reported like any other
//     but its capture is only built: it starts on ConfirmSave, or is replaced, unread, by the
//     session's next save of the step (replace_held); a step that ends first gives its reserved
//     pool slots back;
//   * at most max_steps_in_flight steps per job capture or persist at once; a newer save is
//     accepted but its capture waits until an older step ends (felt in wait_snapshot);
//   * a failed or aborted step is never committed: its captures are cancelled and, once the
//     coordinator decided its end and every capture job let go of its files, its directory is
//     removed — never on this node's own decision, since a removal racing a commit decided
//     elsewhere could tear a step; older steps are untouched;
//   * the peer-memory tier: with `replicas` > 0, each rank persisted here is copied to the
//     holders the coordinator assigned this node (HolderAssignment), from the hot cache, where
//     its step is kept from its save until then (HotCache::Keep: pool pressure still wins); then it
//     is reported REPLICATED, with its holders — or with the reason it could not be (too few
//     holders, a holder full or dead, the bytes gone). While the coordinator says it is still
//     planning this node's holders (HolderAssignment.planning: the node is new, back, or
//     registered changed; or no assignment came yet), a rank without enough holders waits for
//     them instead, its replication ready to send. With `replicas` 0 a persisted rank
//     counts as replicated at once. The coordinator decides the step REPLICATED (or not, with
//     that reason), and waits for the REPLICATED state end there;
//   * a memory-only step (Save.memory_only, Python persist=False) runs the same pipeline with no
//     storage in it: no directory, no data file, no write, no node manifest file — the slots are
//     checksummed and adopted by the hot cache, and the node manifest goes to the coordinator in
//     the report only. It is replicated like a persisted rank, never committed, and ends
//     REPLICATED (a terminal state for such a step) or FAILED; waits for PERSISTED or COMMITTED
//     fail at once. Its bytes stay in the hot cache under a keep until a newer step of the job is
//     replicated (pool pressure still wins) or the coordinator releases the job (JobReleased: its
//     trainers ended), and reported again, whole, after a reconnect (a restarted coordinator knew
//     it only in memory). Every rank of a step must save it the same way;
//   * every report carries the node's epoch (the coordinator's answer to its last registration);
//     a registration answered `fenced` (the coordinator declared this process lost while it was
//     frozen or cut off) fences every step in flight here: it is reported ABORTED in the new
//     epoch (after every reconnect, until decided), nothing else of it is reported, and the
//     coordinator's decision ends it — ABORTED, or COMMITTED where every rank had persisted
//     before the loss. Its memory-only steps are no longer kept or reported again: the
//     coordinator forgot them, and refuses the reports made before (coordinator_core.h);
//   * the writer plan pushed by the coordinator makes a rank skip replicas another rank writes,
//     for the registration it was computed from only (writer_plan_filter.h). Without a plan a
//     rank writes everything; the merge keeps one copy.
#pragma once

#include <boost/asio/io_context.hpp>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "ckptd/v1/local.pb.h"
#include "ckptd/v1/manifest.pb.h"
#include "daemon/capture_engine.h"
#include "daemon/capture_plan.h"
#include "daemon/coordinator/commit_engine.h"
#include "daemon/coordinator/coordinator_port.h"
#include "daemon/daemon_observer.h"
#include "daemon/host_pool.h"
#include "daemon/hot_cache.h"
#include "daemon/loop_tasks.h"
#include "daemon/node_manifest_builder.h"
#include "daemon/replication_request.h"
#include "daemon/task_pool.h"
#include "daemon/writer_plan_filter.h"

namespace ckpt {

// Receives a session's events. Implemented by Session; called on the loop.
class EventSink {
 public:
  virtual ~EventSink() = default;
  virtual void OnEvent(const ckptd::v1::Event& event) = 0;
};

class NodeState : public CoordinatorPort::Handler {
 public:
  struct Config {
    std::string node_id;
    std::string storage_root;
    uint64_t capture_throttle_bytes_per_second = 0;
    uint32_t max_steps_in_flight = 32;  // per job, capturing or persisting; more wait
    uint32_t max_steps_deferred = 64;   // per job, waiting to start; more are refused
    size_t finished_steps_kept = 64;    // per job, for late waits
    LayoutOptions layout;               // of data files cut down by a writer plan
  };
  using Done = std::function<void(Status)>;

  NodeState(boost::asio::io_context& io, Config config, FileSystem* fs, HostPool* pool,
            HotCache* hot, CaptureEngine* capture, CommitEngine* commit, TaskPool* storage);
  ~NodeState() override;

  // The coordinator that owns the step-wide rules (in process or ckpt-coordinator): required,
  // before any save; it outlives this.
  void AttachCoordinator(CoordinatorPort* link) { link_ = link; }
  void OnCoordinatorConnected(const CoordinatorPort::Registration& registration) override;
  void OnCoordinatorEvent(const ckptd::v1::CoordinatorEvent& event) override;

  struct SaveRequest {
    std::string job;
    uint64_t step = 0;
    uint32_t rank = 0;
    uint32_t world_size = 1;
    uint64_t session_id = 0;
    int32_t pid = 0;
    std::shared_ptr<const CapturePlan> plan;
    std::string extra;
    ckptd::v1::FullPolicy on_full = ckptd::v1::FULL_POLICY_WAIT;
    bool memory_only = false;  // Save.memory_only: captured and replicated, never written
    // Save.hold: accepted, but nothing is read until ConfirmSave. Save.replace_held: replaces
    // this session's held save of the step (which read nothing) with this one.
    bool hold = false;
    bool replace_held = false;
    // Called on the loop when the rank's capture finished, before it counts as captured: the
    // session reads what its trainer already sent (an Abandon may be among it), then calls
    // `caught_up` exactly once, on the loop — at once, or later when that input waits behind a
    // registration in flight (session.h). May be empty.
    std::function<void(std::function<void()> caught_up)> sync_input;
  };
  struct SaveOutcome {
    bool skipped = false;
    std::string reason;
    bool held = false;  // SaveRequest::hold: nothing is read until ConfirmSave
  };
  // Accepts the save and starts its capture; returns at once (no copying here).
  Result<SaveOutcome> StartSave(SaveRequest request);

  // The held save (SaveRequest::hold) of `step` by this session may be read now: its capture
  // starts (or waits behind older steps like any other). Returns false, changing nothing, when
  // the session holds no save of the step (replaced, ended, or made by another session).
  bool ConfirmSave(const std::string& job, uint64_t step, uint32_t rank, uint64_t session_id);

  // `done` runs when `rank` has captured `step` (OK), or the step failed (its reason).
  void WaitCaptured(const std::string& job, uint64_t step, uint32_t rank, Done done);
  // `done` runs when the step reaches `state` (PERSISTED: on this node; COMMITTED: globally).
  void WaitState(const std::string& job, uint64_t step, ckptd::v1::StepState state, Done done);
  // Newest committed step of a job (looked up on the storage thread).
  void Latest(const std::string& job, std::function<void(Result<std::optional<uint64_t>>)> done);
  // The step `rank` of `world_size` restores from: Latest, resolved once per restart of the job
  // (restore_points.h) — here, or by the coordinator, whose answer only counts (no fallback to
  // the storage root: two ranks must never restore different steps).
  void RestorePoint(const std::string& job, uint32_t rank, uint32_t world_size, uint64_t session_id,
                    std::function<void(Result<std::optional<uint64_t>>)> done);

  // The trainer of `rank` gave up on `step` (its fence timed out) and modifies the memory now:
  // the step is aborted unless it already ended or its commit is under way (possible only once
  // this rank's capture completed, so its bytes are intact). Returns whether this aborted it.
  bool Abandon(const std::string& job, uint64_t step, uint32_t rank, uint64_t session_id,
               const std::string& reason);

  void AddSink(const std::string& job, std::weak_ptr<EventSink> sink);
  // A re-attaching rank says its save of `step` went out on a connection that broke
  // (Hello.lost_step): if the step is in flight here without that rank, it can never complete
  // and is aborted now; if it is not here yet, a later save of it by another rank is refused.
  void OnSaveLost(const std::string& job, uint64_t step, uint32_t rank, uint32_t world_size);
  void OnSessionClosed(uint64_t session_id, const std::string& job, uint32_t rank, int32_t pid);

  // Shutdown: refuse new saves; `idle` runs once no step is in flight (at once if none is).
  void Drain(std::function<void()> idle);
  // Cancels every capture in flight (shutdown deadline passed).
  void CancelAll(const std::string& reason);

  // ---- the peer-memory tier ----
  // `replicas` copies of each persisted rank in other nodes' memory, sent through `replicate`
  // (its `done` may run on any thread; it is brought back onto the loop here). Set before the
  // loop runs; without it, replicas is 0. `remote_coordinator`: holders come from a
  // ckpt-coordinator, and until its first HolderAssignment persisted ranks wait for them.
  using Replicate = std::function<void(ReplicationRequest request,
                                       std::function<void(Status, std::vector<std::string>)> done)>;
  void SetReplication(uint32_t replicas, Replicate replicate, bool remote_coordinator = false) {
    replicas_ = replicas;
    replicate_ = std::move(replicate);
    holders_planning_ = remote_coordinator && replicas > 0;
  }
  // The coordinator released a job (JobReleased: its trainers ended): besides the keeps of its
  // memory-only steps here, `released` drops what this node holds of it for others. Set before
  // the loop runs; called on the loop.
  void SetJobReleased(std::function<void(const std::string& job, uint64_t through_step)> released) {
    job_released_ = std::move(released);
  }
  // The holders the coordinator assigned this node (node ids and addresses), for status.
  const std::vector<ReplicaHolder>& holders() const { return holders_; }

  // ---- operations (daemon/admin) ----
  // Receives step events; set before the loop runs; may be null. Not owned.
  void SetObserver(DaemonObserver* observer) { observer_ = observer; }
  // Every step known here, in flight and recently finished (job, then step order).
  std::vector<StepSnapshot> Snapshot() const;
  bool draining() const { return draining_; }

 private:
  struct RankSave {
    uint64_t session_id = 0;
    int32_t pid = 0;
    std::shared_ptr<CaptureJob> capture;
    std::string extra;
    bool captured = false;
    bool persisted = false;
    bool finished = false;  // the capture job let go of its files
    // A held save (SaveRequest::hold): `capture` is built but not submitted until ConfirmSave.
    bool held = false;
    std::chrono::steady_clock::time_point accepted = std::chrono::steady_clock::now();
    std::chrono::steady_clock::time_point captured_at;
    std::function<void(std::function<void()>)> sync_input;  // SaveRequest::sync_input
    // The capture finished and sync_input has not called back yet; a persist reported meanwhile
    // waits here until it has.
    bool syncing = false;
    std::optional<Status> persisted_early;
    // The peer-memory tier: the step's keep in the hot cache (HotCache::Keep), held from the
    // save until the rank's bytes were sent to its holders (then the sender releases it), the
    // holders that acknowledged them, or why they could not be replicated.
    std::shared_ptr<void> hot_keep;
    bool replicated = false;
    std::vector<std::string> replica_holders;
    std::string replication_error;
  };
  struct Waiter {
    bool rank_captured;  // true: waits for `rank` captured; false: for `state`
    uint32_t rank;
    ckptd::v1::StepState state;
    Done done;
  };
  struct Step {
    std::string job;
    uint64_t step = 0;
    uint32_t world_size = 0;
    ckptd::v1::StepState state = ckptd::v1::STEP_STATE_PENDING;
    std::string reason;
    std::map<uint32_t, RankSave> ranks;
    std::vector<Waiter> waiters;
    bool skipped = false;  // FAILED because a rank skipped it by policy (StepDecision.skipped)
    bool cleanup_posted = false;
    bool deferred = false;  // accepted, captures not started: too many older steps in flight
    std::vector<std::shared_ptr<CaptureJob>> deferred_captures;
    // The last node manifest reported (re-sent after a reconnect), and whether the coordinator
    // decided the step's end (only then are its files removed here).
    std::shared_ptr<const ckptd::v1::NodeManifest> node_manifest;
    bool decided_globally = false;
    // In flight when the coordinator declared this node lost (FenceSteps): reported ABORTED,
    // nothing else of it is reported, and the coordinator's decision ends it — ABORTED, or
    // COMMITTED when every rank was persisted before the node was lost.
    bool fenced = false;
    // The coordinator's REPLICATED decision: replicated, or not (with the reason).
    bool replicated = false;
    std::optional<std::string> not_replicated;
    // A memory-only step: no files; it ends REPLICATED (or FAILED). Its bytes stay in the hot
    // cache under a keep until a newer step of the job is replicated (pool pressure still wins).
    bool memory_only = false;
    std::shared_ptr<void> memory_keep;
    // Its PERSISTED reports list the shards its ranks skipped (SkippedShards::kListed): a
    // memory-only step saved under a writer plan from before a reconnect, whose registrations
    // the coordinator (perhaps restarted) may not have resolved again when it hears the step.
    bool list_skips = false;
    SkippedShards skipped_shards() const {
      return list_skips ? SkippedShards::kListed : SkippedShards::kUnderRegistration;
    }
    std::chrono::steady_clock::time_point accepted = std::chrono::steady_clock::now();
  };
  struct Job {
    Job(const std::string& name, const LayoutOptions& layout, uint64_t* next_registration_id)
        : writers(name, layout, next_registration_id) {}
    std::map<uint64_t, Step> steps;  // in flight and recently finished
    std::vector<std::weak_ptr<EventSink>> sinks;
    // The newest step committed in storage when the job's first session said hello (by an
    // earlier daemon or trainer incarnation); saves of it or older steps are refused.
    std::optional<uint64_t> newest_on_storage;
    bool storage_lookup_posted = false;
    // Steps not (yet) saved here whose save by these ranks was lost (OnSaveLost): a later save
    // of them by another rank is refused. The newest finished_steps_kept.
    std::map<uint64_t, std::set<uint32_t>> lost_saves;
    // What each rank registered, and the writer plan's cut of it.
    WriterPlanFilter writers;
    // The session of each rank that asked the job's restore point (its world size with it).
    std::map<uint32_t, std::pair<uint64_t, uint32_t>> restore_askers;
  };
  Job& JobNamed(const std::string& name);
  static std::vector<uint32_t> RanksOf(const Step& s);  // every rank saved here
  void Report(const Step& s, ckptd::v1::StepState state, std::vector<uint32_t> ranks,
              std::string reason = {});
  void ReportNodeManifest(Step& s);
  // The step's newest node manifest, again (after a reconnect).
  void ReportPersisted(const Step& s);
  // A rank's registration or withdrawal, stamped with this node's epoch.
  void ReportRegistration(ckptd::v1::ReportRegistrationRequest req);
  // The ranks that waited for this node's holders (HolderAssignment.planning), now that the
  // coordinator's plan includes the node: replicated to them, or reported not replicated.
  void ReplicateAwaiting();
  // The step a waiting replication is for, or null when it no longer should be sent (the step
  // is gone, fenced, aborted or failed).
  Step* StillAwaiting(const ReplicationRequest& request);
  // `request` to this node's holders, or reported not replicated when it has too few.
  void SendReplication(Step& s, uint32_t rank, ReplicationRequest request);
  // The ranks' replication outcomes, again, unless the step's REPLICATED was decided.
  void ReportReplicationAgain(const Step& s);
  // The job's newest replicated memory-only steps still held here, again (after a reconnect).
  void ReportMemoryStepsAgain(const Job& j);
  // JobReleased: the job's memory-only steps up to its step are kept no longer (nor reported
  // again), and job_released_ drops what this node holds of it for others.
  void OnJobReleased(const ckptd::v1::JobReleased& released);
  void FailLocally(Step& s, ckptd::v1::StepState state, const std::string& reason);
  static size_t ActiveSteps(const Job& job);
  void StartDeferred(const std::string& job);
  // Starts a capture built by StartSave or released by ConfirmSave: at once, or after the
  // older steps that defer the step.
  void StartCapture(Step& s, std::shared_ptr<CaptureJob> capture);
  // The pool slots reserved for a capture that will never start (replaced while held, or its
  // step ended while it was deferred or held) go back.
  void ReleaseReserved(CaptureJob& capture);

  static bool Terminal(ckptd::v1::StepState s);
  Step* FindStep(const std::string& job, uint64_t step);
  void OnRankCaptured(const std::string& job, uint64_t step, uint32_t rank, Status status);
  // The rank's capture counts (its trainer's input was read up to its end).
  void CountRankCaptured(Step& s, uint32_t rank);
  void OnRankPersisted(const std::string& job, uint64_t step, uint32_t rank, Status status);
  // The rank persisted: sends it to this node's holders (or reports at once why not).
  void StartReplication(Step& s, uint32_t rank);
  void OnRankReplicated(const std::string& job, uint64_t step, uint32_t rank, Status status,
                        std::vector<std::string> holders);
  void ReportReplicated(const Step& s, uint32_t rank, const std::vector<std::string>& holders,
                        std::string reason);
  static bool WaiterReached(const Step& s, const Waiter& w);
  static std::string LostSaveReason(uint32_t rank, uint64_t step);
  std::string RestoreSession(uint64_t session_id) const;  // RestoreQuery::session
  void SetState(Step& s, ckptd::v1::StepState state);
  // The coordinator decided `s` replicated: a memory-only step ends, and older memory-only steps
  // of the job may leave memory.
  void OnReplicated(Step& s);
  // Waiters for a state a memory-only step never reaches (PERSISTED, COMMITTED).
  static bool NeverReached(const Step& s, const Waiter& w);
  void FailStep(Step& s, ckptd::v1::StepState state, const std::string& reason);
  void ResolveWaiters(Step& s);
  void MaybeCleanup(Step& s);
  void Publish(const Step& s);
  void ReleaseCaptures(Step& s);
  void Prune(Job& j);
  void CheckDrained();
  // The coordinator declared this node lost (Registration.fenced): every step in flight is
  // fenced (Step::fenced) and its memory-only steps are no longer kept for it.
  void FenceSteps();
  // The ABORTED report of a fenced step.
  void ReportFenced(const Step& s);

  // The loop every method runs on. No code reads it now; kept, as the constructor's contract
  // names it ([[maybe_unused]]: clang's -Wunused-private-field is an error in the tsan stage).
  [[maybe_unused]] boost::asio::io_context& io_;
  Config config_;
  FileSystem* fs_;
  HostPool* pool_;
  HotCache* hot_;
  CaptureEngine* capture_;
  CommitEngine* commit_;
  std::map<std::string, Job> jobs_;
  bool draining_ = false;
  std::function<void()> on_idle_;
  CoordinatorPort* link_ = nullptr;  // the coordinator: in process, or ckpt-coordinator
  uint64_t next_registration_id_;    // random start per daemon process
  DaemonObserver* observer_ = nullptr;
  uint64_t connections_ = 0;  // OnCoordinatorConnected calls so far
  uint64_t epoch_ = 0;        // the coordinator's RegisterNodeResponse.epoch, on every report
  uint32_t replicas_ = 0;
  Replicate replicate_;
  std::function<void(const std::string& job, uint64_t through_step)> job_released_;
  std::vector<ReplicaHolder> holders_;  // the coordinator's HolderAssignment
  // HolderAssignment.planning (or no assignment yet): a plan that includes this node is due.
  // Ranks persisted meanwhile without enough holders wait in `awaiting_holders_`, their
  // replication ready to send (with the hot-cache keep), for the next one.
  bool holders_planning_ = false;
  std::vector<std::pair<uint32_t, ReplicationRequest>> awaiting_holders_;  // rank, request
  LoopTasks tasks_;  // storage work and engine callbacks; last, so it is destroyed first
};

std::string_view StepStateName(ckptd::v1::StepState s);

}  // namespace ckpt
