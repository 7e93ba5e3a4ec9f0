// CoordinatorCore: the global commit protocol of ckpt-coordinator (docs/design.md §6), with no gRPC
// types in it — coordinator_service.cc translates RPCs into these calls.
//
// Durable truth is the storage root, never this object's memory:
//   * a daemon writes node-<node id>.nmf (atomically) into the step directory before it reports
//     PERSISTED; the report carries the same manifest, so a commit needs no reads;
//   * a step is committed by CommitEngine::Commit — MANIFEST rename (the commit marker), then
//     LATEST, then retention — the same code the embedded coordinator of a single daemon runs;
//   * Start() scans the root before serving: a step directory without MANIFEST whose node
//     manifests cover every rank is committed, every other one is removed and remembered as
//     aborted (a daemon that re-reports it is told so). A crash at any point therefore leaves
//     each step committed-and-complete or absent, and LATEST names a committed step. A daemon
//     still writing a step during the scan can make its removal fail: the scan goes on (the
//     step is aborted all the same) and that daemon removes the directory when told.
//   * while serving, a commit first removes the step directories below it that no daemon
//     reported (a daemon killed between creating a step's files and its first report), so
//     such leftovers do not wait for the coordinator's next restart.
//
// Rules while serving:
//   * a step commits when all world_size ranks reported PERSISTED and every earlier in-flight
//     step of the job has ended (commits are in step order, one at a time per job, on the commit
//     thread); CAPTURED / PERSISTED / COMMITTED are broadcast to every node of the job;
//   * a step is ABORTED when its ranks do not all persist within step_timeout of its first
//     report, when a node of the job is lost (its Watch stream ended and did not return within
//     the lease, or the node re-registered as a new process), or FAILED when a node reports a
//     failure; the reason names the missing ranks and their nodes, every node of the job is told,
//     and the step directory is removed (each daemon also removes its own leftovers once its
//     writers have let go of them). Training is never blocked: only events are sent.
//   * the peer-memory tier: every node says at registration whether it can hold other nodes'
//     steps in memory and how many holders it wants; the holder plan (holder_registry.h) is
//     kept current as nodes come and go (a node whose event stream ended neither holds nor
//     replicates until it registers again), computed on the plan thread without the mutex, and
//     each node hears its holders (HolderAssignment). A
//     node replicates each rank it persisted to them and reports REPLICATED (or why not); when
//     every rank of a step is replicated the step is decided REPLICATED — beside its state,
//     before or after its commit — and a rank that could not be replicated decides it not
//     replicated, with the reason, so nobody waits for it in vain.
//   * a memory-only step (ReportRanksRequest.memory_only) is never committed and never holds up
//     a commit: once every rank is in memory its manifest is finished on the commit thread (the
//     merge and a commit's checks, no write) and kept here, the only copy — loads of the step ask
//     for it (StepManifest). The step ends REPLICATED when every rank is replicated too, or FAILED
//     when one is not (a holder full or dead, the node lost before it sent, the deadline). Latest
//     and RestorePoint count such a step while each of its ranks has a live copy (a holder from
//     its report, or its own node until a newer step is replicated), among the job's two newest
//     replicated steps (the holders keep two, replicator.h). A coordinator restart forgets them
//     until their nodes, reconnecting, report them again (NodeState::ReportMemoryStepsAgain).
//   * epochs fence a node that was lost while its process lived (frozen, or cut off from the
//     network while it still reached storage). Each registration of a node that is new here,
//     restarted, or was declared lost since gets a new epoch (a reconnect within the lease keeps
//     its epoch); the first epoch comes from the wall clock, so a restarted coordinator's are
//     above its predecessor's. The node stamps its epoch on every report and registration, and
//     declaring it lost ends that epoch: a report made in it is refused (FAILED_PRECONDITION),
//     so nothing the node queued while unreachable commits, replicates, counts as a copy or
//     registers a rank (the ranks it still holds register again in the new epoch). Its next
//     registration says `fenced`, and the node aborts what it had in flight (node_state.h).
//     Unstamped reports (epoch 0: an embedded coordinator, an older daemon) are not checked;
//   * a finished job's copies in memory are released: once no rank of the job has been
//     registered on any node, none restored and nothing else of it happened for peer_job_ttl
//     (its trainers ended and none came back), or when an operator asks (ReleaseJob), the
//     coordinator stops counting any copy of its steps so far (memory-only ones stop being
//     restorable, loads of persisted ones read storage) and tells every node to drop them
//     (JobReleased): holders free their peer pools, the nodes that saved them release their
//     hot-cache keeps. A node away meanwhile hears it when it attaches again (its registration
//     names the jobs its peer pool holds), and a job a restarted coordinator learns of only
//     from such a list is released after peer_job_ttl unless a rank registers. A rank
//     registering again makes the job live again; only steps above the release count (a
//     memory-only save of one at or below it fails);
//   * registrations of all ranks of a job give the writer plan (writer_plan.h); it is recomputed
//     only when a registration changes, off the request threads (the plan thread), and pushed
//     to each node of the job, each rank's writes tagged with the registration they were
//     computed from (a rank registered anew since writes everything). A rank's registration
//     ends with its trainer (the node withdraws it) or its node; until every rank has
//     registered again, the plan is revoked and every rank writes all it holds. So the first
//     save after a restart — any layout — writes everything, and the next uses the new plan.
//     Each node's report names, per rank that skipped shards, the registration it skipped
//     under (NodeManifest.skipped_under); the commit checks that registration's layout against
//     the merged manifest, once per distinct layout (CheckSkippedLayoutsWritten, rank_layout.h),
//     or, for a rank whose registration it no longer holds, the node manifest file's list: a
//     plan that changed under a step can fail that step, never commit a hole.
//   * each node's PERSISTED report is merged into the step's manifest as it arrives, on the
//     commit thread (ManifestMerger); the commit itself finishes the merge (name order, replicas,
//     skipped shards), validates and writes. A node reports again as more of its ranks persist,
//     each report a superset of the last, and only the new ranks' part is merged. A report
//     listing a strict subset of the node's last, each of its entries as the last has it, is an
//     older one arriving late and is ignored (before anything of it counts); any other report
//     that drops a rank makes the commit merge every node's last report afresh instead.
//
// Cost model — what grows with what (R ranks on N nodes, L distinct layouts of T tensors,
// S distinct shards; measured in bench/coordinator, bench/README.md "Coordinator"):
//   * a registration naming a known layout: O(1) bytes on the wire and O(log R) here; a new
//     layout O(T), once per distinct layout (layout_registry.h), not once per rank;
//   * memory: O(R) small rank records + O(L·T) for the distinct layouts + O(S) for the plan;
//   * a plan: O(R + L·T + S log S) on the plan thread (writer_plan.h); a restart whose ranks
//     come back with the same layouts on the same nodes reuses the previous plan;
//   * a plan's events: O(S + R) in all, each node getting the writes of its own ranks;
//   * a step's reports: O(R) in all (the skipped shards are named by registration, not listed);
//   * a commit, after the last report: that node's merge, then O(S log S + R log R) to finish
//     and validate, O(L·T) digest lookups for the skipped layouts, and the MANIFEST write (the
//     other nodes' merges ran as they reported);
//   * a node lost: O(its ranks) per job; a heartbeat (Watch) or step report never waits for a
//     plan (the mutex is not held while planning).
//
// Thread safety: every public method may be called from any thread; state is guarded by mu_.
// Sinks are called with mu_ held and must only queue (never call back into the core).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <new>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "ckptd/v1/coordinator.pb.h"
#include "common/file_system.h"
#include "common/manifest_merge.h"
#include "common/mutex.h"
#include "daemon/coordinator/commit_engine.h"
#include "daemon/coordinator/holder_registry.h"
#include "daemon/coordinator/layout_registry.h"
#include "daemon/coordinator/load_planner.h"
#include "daemon/coordinator/restore_points.h"
#include "daemon/coordinator/writer_plan.h"
#include "daemon/task_pool.h"

namespace ckpt {

// Where the core sends events for one node (the node's Watch stream). Must not block.
class NodeSink {
 public:
  virtual ~NodeSink() = default;
  virtual void Send(const ckptd::v1::CoordinatorEvent& event) = 0;
};

class CoordinatorCore {
 public:
  struct Config {
    std::string storage_root;
    uint32_t keep = 0;
    std::chrono::milliseconds step_timeout{std::chrono::minutes(10)};
    std::chrono::milliseconds lease{std::chrono::seconds(10)};
    // How long a registration asked for its layout has to send it before another registration
    // of the same layout is asked instead (layout_registry.h).
    std::chrono::milliseconds layout_ask_timeout{std::chrono::seconds(3)};
    // Cold loads across nodes (load_planner.h): how long a round waits for the rest of the
    // job's ranks before planning with those that asked.
    LoadPlanner::Options load_plan;
    // The peer-memory tier (holder_registry.h): how long a change of the nodes waits for more
    // before the holders are planned again.
    std::chrono::milliseconds holder_replan_delay{100};
    // A job none of whose ranks is registered on any node for this long (its trainers ended)
    // is released: every node drops its copies in memory (JobReleased). 0: never.
    std::chrono::milliseconds peer_job_ttl{std::chrono::minutes(30)};
    size_t finished_steps_kept = 64;  // per job, to answer late reports
    // Nice value of the commit thread (thread_priority.h). In a daemon (the embedded
    // coordinator) its worker_nice: merging and writing a step's manifest costs milliseconds of
    // CPU per 10,000 tensors, which must not delay the trainers' next requests on a busy node.
    int nice = 0;
    // A step the recovery scan removed is answered ABORTED when a daemon reports it again: it
    // was in flight on a live daemon when the coordinator restarted. False in process: the
    // daemon restarted with its coordinator, nothing of it is in flight, and a trainer may save
    // that step number anew.
    bool refuse_recovered_steps = true;
    std::string writer = "ckpt-coordinator";
    std::function<void(std::string_view point)> on_commit_point;  // CommitEngine::Config::on_point
    // Every state a step reaches (CAPTURED … COMMITTED / ABORTED / FAILED), for the Admin API's
    // watch streams. Called with the core's mutex held: it must only queue.
    std::function<void(const std::string& job, uint64_t step, ckptd::v1::StepState state,
                       const std::string& reason)>
        on_step_state;
    // Counting hooks for the coordinator's Prometheus metrics (coordinator_metrics.h). Each may
    // be called with the core's mutex held: it must only count, never call back.
    //   on_registration: every ReportRegistration request handled, with its serialized size
    //                    (the request as received, before validation) and the bytes of the
    //                    layout it carried (0 when it named a known layout by fingerprint);
    //   on_plan:         a writer plan computed for `job`, and how long PlanWriters took;
    //   on_commit:       `step` of `job` committed, seconds since its last rank report (what
    //                    the commit itself cost the job: the wait after its last rank persisted);
    //   on_skips:        a PERSISTED report's skipped shards: `listed` one by one
    //                    (NodeManifest.skipped), `named` by registration (skipped_under).
    std::function<void(size_t bytes, size_t layout_bytes)> on_registration;
    std::function<void(size_t listed, size_t named)> on_skips;
    std::function<void(const std::string& job, double seconds)> on_plan;
    std::function<void(const std::string& job, uint64_t step, double seconds)> on_commit;
  };

  // What the Admin API shows of the core: steps in flight and the nodes that registered.
  struct StepView {
    std::string job;
    uint64_t step = 0;
    uint32_t world_size = 0;
    ckptd::v1::StepState state = ckptd::v1::STEP_STATE_PENDING;
    std::map<uint32_t, std::string> saved;  // rank → node
    std::set<uint32_t> captured;
    std::set<uint32_t> persisted;
    std::chrono::steady_clock::time_point first_report;
  };
  struct NodeView {
    std::string node_id;
    bool attached = false;                                               // its event stream is open
    std::optional<std::chrono::steady_clock::time_point> lease_expires;  // while detached
    std::vector<std::string> jobs;
    uint64_t epoch = 0;
    bool lost = false;  // declared lost, not registered since
  };
  struct PlanView {
    std::string job;
    uint32_t world_size = 0;
    uint32_t ranks_registered = 0;
    uint64_t version = 0;
    bool in_force = false;
    uint64_t unique_bytes = 0;
    uint64_t registered_bytes = 0;
    uint32_t ranks_waiting = 0;  // registered by fingerprint, their layout not yet known
    size_t distinct_layouts = 0;
    size_t distinct_shards = 0;
  };
  struct Snapshot {
    std::vector<StepView> steps;  // not yet COMMITTED / ABORTED / FAILED, by job then step
    std::vector<NodeView> nodes;
    std::vector<PlanView> plans;  // jobs that registered tensors
    size_t layouts_known = 0;     // distinct layouts held (all jobs)
  };
  // `shared_commit`: the CommitEngine of the daemon it runs in (its pins, which keep a step being
  // loaded from retention, then apply to commits here); null: its own, from `config`.
  CoordinatorCore(Config config, FileSystem* fs, CommitEngine* shared_commit = nullptr);
  ~CoordinatorCore();

  // Recovery scan of the storage root (commits or removes every uncommitted step), then starts
  // the commit and timer threads. Returns what the scan did, one line per step.
  Result<std::vector<std::string>> Start();
  void Stop();

  Result<ckptd::v1::RegisterNodeResponse> RegisterNode(const ckptd::v1::RegisterNodeRequest& req,
                                                       const std::string& instance);
  // The node's event stream opened / ended. Attaching sends the node its current plans.
  Status AttachNode(const std::string& node_id, std::shared_ptr<NodeSink> sink);
  void DetachNode(const std::string& node_id, const NodeSink* sink);

  Result<ckptd::v1::ReportRanksResponse> ReportRanks(const ckptd::v1::ReportRanksRequest& req);
  // A rank's registration: its shards, or the fingerprint of a layout sent before (the answer
  // then says whether the coordinator needs the layout itself or holds the rank until it
  // arrives).
  Result<ckptd::v1::ReportRegistrationResponse> ReportRegistration(
      const ckptd::v1::ReportRegistrationRequest& req);

  Result<std::optional<uint64_t>> Latest(const std::string& job);
  // The step `rank` of `world_size` restores from: Latest, resolved once per restart of the
  // job (restore_points.h). `session`: the asking trainer's connection (opaque, unique).
  Result<std::optional<uint64_t>> RestorePoint(const std::string& job, uint32_t rank,
                                               uint32_t world_size, const std::string& session);
  Result<std::vector<uint64_t>> List(const std::string& job);
  // An operator releases a finished job's copies in memory now, without waiting for
  // peer_job_ttl: the JobReleased event sent to every node. NOT_FOUND for a job this coordinator
  // knows nothing of; FAILED_PRECONDITION while a rank of it is registered (its trainers run).
  Result<ckptd::v1::JobReleased> ReleaseJob(const std::string& job);
  // The manifest of a memory-only step (it is nowhere else): NOT_FOUND when this coordinator
  // holds none for it.
  Result<std::shared_ptr<const ckptd::v1::Manifest>> StepManifest(const std::string& job,
                                                                  uint64_t step);
  // The same, with the live daemons holding each rank's copies now (the Admin API's describe).
  struct MemoryStepView {
    std::shared_ptr<const ckptd::v1::Manifest> manifest;
    std::vector<std::vector<std::string>> copies;  // by rank: node ids
  };
  Result<MemoryStepView> DescribeMemoryOnly(const std::string& job, uint64_t step);
  // A rank about to load a step from storage: who reads what (load_planner.h), the step's data
  // files that live daemons hold in memory fetched from them. Plans without the core's mutex.
  Result<ckptd::v1::LoadPlanResponse> PlanLoad(const ckptd::v1::LoadPlanRequest& req);

  Snapshot TakeSnapshot();

  // Test and benchmark hooks.
  std::shared_ptr<const WriterAssignment> CurrentPlan(const std::string& job);
  // Blocks until no commit and no plan is queued or running (benchmarks).
  void WaitIdle();
  // Commits that merged every node's report afresh instead of finishing the merge built as the
  // reports arrived (a node's report dropped a rank it had reported).
  uint64_t CommitsMergedAfresh();

 private:
  struct StepRecord {
    uint32_t world_size = 0;
    ckptd::v1::StepState state = ckptd::v1::STEP_STATE_PENDING;
    std::string reason;
    bool skipped = false;                   // FAILED by a rank's skip policy (StepDecision.skipped)
    std::map<uint32_t, std::string> saved;  // rank → node
    std::set<uint32_t> captured;
    std::set<uint32_t> persisted;
    // Ranks whose bytes are held in memory by their node and its holders (REPLICATED reports),
    // and whether the step's REPLICATED decision went out (replicated, or not with a reason).
    std::set<uint32_t> replicated;
    std::map<uint32_t, std::vector<std::string>> replica_holders;  // rank → holders (node ids)
    // Nodes of `saved` lost since (their memory went with them, even if they came back).
    std::set<std::string> lost_savers;
    bool replication_decided = false;
    // That decision, and the nodes it was sent to: a node reporting the step for the first time
    // afterwards (one rank could not be replicated before another node's first report) hears it
    // in the answer.
    ckptd::v1::StepDecision replication;
    std::set<std::string> told_replication;
    // node → its PERSISTED report's manifest, shared with the merge task that folds it in.
    std::map<std::string, std::shared_ptr<const ckptd::v1::NodeManifest>> manifests;
    // `manifests` merged so far, on the commit thread (null until the first report), and the
    // ranks of each node in it; stale when a node's report dropped a rank it had reported: the
    // commit then merges `manifests` afresh.
    std::shared_ptr<MergeOnArena> merge;
    std::map<std::string, std::vector<uint32_t>> merged_ranks;  // sorted
    bool merge_stale = false;
    // The distinct layouts whose shards ranks left to others (NodeManifest.skipped_under),
    // checked against the merged manifest at the commit; and, by node, the ranks that skipped
    // under a registration this coordinator no longer holds, whose skipped shards the commit
    // reads from the node manifest file.
    std::map<const RankLayout*, SkippedLayout> skipped_layouts;
    std::map<std::string, std::set<uint32_t>> skips_unresolved;
    std::chrono::steady_clock::time_point first_report;
    std::chrono::steady_clock::time_point last_report;  // the commit latency counts from it
    std::chrono::steady_clock::time_point deadline;
    bool committing = false;
    // A memory-only step (Save.memory_only): never committed and never in the way of a commit.
    // Once every rank is in memory its manifest is finished on the commit thread and kept here
    // (loads of it ask for it: StepManifest); it ends REPLICATED (terminal) when every rank is
    // replicated too, or FAILED.
    bool memory_only = false;
    bool finishing_in_memory = false;
    std::shared_ptr<const ckptd::v1::Manifest> memory_manifest;
  };
  // One rank's registration: O(1), its layout shared with every rank of the same layout.
  struct RankRecord {
    std::string node_id;
    uint64_t registration_id = 0;
    LayoutFingerprint fingerprint;
    std::shared_ptr<const RankLayout> layout;  // null while waiting for it (layout_registry.h)
  };
  struct JobRecord {
    std::map<uint64_t, StepRecord> steps;
    std::set<std::string> nodes;
    std::map<uint32_t, RankRecord> registrations;
    std::map<std::string, std::set<uint32_t>> ranks_by_node;  // of `registrations`
    uint32_t waiting = 0;                // registrations whose layout is not known yet
    uint64_t registrations_version = 0;  // grows with every change of `registrations`
    uint32_t world_size = 0;
    bool plan_dirty = false;
    bool plan_queued = false;   // a plan task is queued or running on the plan thread
    bool plan_revoked = false;  // nodes were told to write everything
    uint64_t plan_version = 0;
    std::shared_ptr<const WriterAssignment> plan;  // null until every rank registered
    // Steps removed without a record here (by the restart scan, or as unreported leftovers
    // below a commit): a daemon that reports one later hears ABORTED.
    std::set<uint64_t> recovered_aborted;
    // Releasing its copies in memory: since when no rank is registered and nothing else of the
    // job happened (null while a rank is registered), whether that idle spell ended in a
    // release, and the newest step ever released (no copy of it or an older step counts again,
    // whatever a node reports: HeldInMemoryLocked; a memory-only report of one fails).
    std::optional<std::chrono::steady_clock::time_point> idle_since;
    bool released = false;
    std::optional<uint64_t> released_through;
    bool ReleasedStep(uint64_t step) const { return released_through && step <= *released_through; }
    // The newest step of it some node's peer pool held when it registered (held_jobs): a job a
    // restarted coordinator knows only from those lists is released through it.
    uint64_t held_through = 0;
  };
  struct NodeRecord {
    std::string instance;
    std::shared_ptr<NodeSink> sink;
    std::optional<std::chrono::steady_clock::time_point> lost_at;  // lease expiry while detached
    // The node's epoch (RegisterNodeResponse.epoch), and the newest of its epochs that ended
    // with the node declared lost: its reports stamped with that epoch or an older one are
    // refused (fencing). `lost`: declared lost since its last registration (it cannot attach
    // until it registers again). `fence_pending`: its registrations are answered `fenced` until
    // it attaches (an answer lost on the way must not let it skip the fence).
    uint64_t epoch = 0;
    uint64_t fenced_through = 0;
    bool lost = false;
    bool fence_pending = false;
    // RegisterNodeRequest.held_jobs (by name): told on attach which were released.
    std::set<std::string> held_jobs;
  };

  static bool Terminal(ckptd::v1::StepState s);
  void Decide(const std::string& job, uint64_t step, StepRecord& s, ckptd::v1::StepState state,
              const std::string& reason) REQUIRES(mu_);
  void Broadcast(const std::string& job, const ckptd::v1::CoordinatorEvent& e) REQUIRES(mu_);
  void SendPlan(const std::string& job, JobRecord& j, const std::string& only_node) REQUIRES(mu_);
  void MaybePlan(const std::string& job, JobRecord& j) REQUIRES(mu_);
  // On the plan thread: computes the job's plan without the mutex and installs it if the
  // registrations did not change meanwhile.
  void PlanJob(const std::string& job) EXCLUDES(mu_);
  // With mu_ held (`j` is one of jobs_; static functions, so the analysis cannot check it).
  static void WithdrawRank(JobRecord& j, uint32_t rank);
  static void SetRank(JobRecord& j, uint32_t rank, RankRecord record);
  // Takes `record` of `rank` out of the job's counts and node index (before replacing it).
  static void UnindexRank(JobRecord& j, uint32_t rank, const RankRecord& record);
  static bool Complete(const JobRecord& j);
  // `layout` arrived: the registrations waiting for it are registered.
  void ResolveWaiters(const std::shared_ptr<const RankLayout>& layout) REQUIRES(mu_);
  // What a commit task takes from its step record.
  struct CommitInputs {
    std::shared_ptr<MergeOnArena> merge;  // null: merge `nodes` afresh
    std::vector<std::shared_ptr<const ckptd::v1::NodeManifest>> nodes;
    std::vector<SkippedLayout> skipped_layouts;
    std::map<std::string, std::set<uint32_t>> skips_unresolved;
  };
  // Moves what a commit (or a memory-only step's finish) needs out of the step record.
  static CommitInputs TakeCommitInputs(StepRecord& s);
  // On the commit thread: finishes the merge (afresh when `in.merge` is null) and checks that
  // every shard the skipped layouts left to others was written.
  static Status FinishMerge(CommitInputs& in);
  // On the commit thread: finishes the step's merge, checks the skipped layouts, commits.
  void CommitStep(const std::string& job, uint64_t step, CommitInputs& in) EXCLUDES(mu_);
  // The skipped shards of `unresolved` ranks (by node), from their node manifest files in
  // `step_dir`, each stored in `merged`.
  Status CheckSkippedFromFiles(const std::string& step_dir,
                               const std::map<std::string, std::set<uint32_t>>& unresolved,
                               const ManifestMerger& merged);
  // A node's PERSISTED report names the registrations its ranks skipped shards under: their
  // layouts, once each, into `s.skipped_layouts`.
  void NoteSkippedLayouts(const JobRecord& j, StepRecord& s, const ckptd::v1::NodeManifest& m)
      REQUIRES(mu_);
  // A node's PERSISTED report: kept in `s.manifests`, and merged on the commit thread now.
  void MergeAsReported(StepRecord& s, std::shared_ptr<const ckptd::v1::NodeManifest> m)
      REQUIRES(mu_);
  void TryCommit(const std::string& job) REQUIRES(mu_);
  // A memory-only step whose ranks are all in memory: its manifest is finished on the commit
  // thread (FinishInMemory) — the merge, the skipped layouts' check and a commit's validation,
  // without a write.
  void FinishMemoryOnly(const std::string& job, uint64_t step, StepRecord& s) REQUIRES(mu_);
  void FinishInMemory(const std::string& job, uint64_t step, CommitInputs& in) EXCLUDES(mu_);
  // Ends a memory-only step REPLICATED once its manifest is finished and every rank replicated.
  void MaybeEndMemoryOnly(const std::string& job, uint64_t step, StepRecord& s) REQUIRES(mu_);
  // Decides a memory-only step not replicated (`reason`), which fails it.
  void FailMemoryOnly(const std::string& job, uint64_t step, StepRecord& s,
                      const std::string& reason) REQUIRES(mu_);
  // The newest step of `job` that restores now: `committed`, or a newer memory-only step whose
  // every rank is held by a live daemon (HeldInMemory), among the newest two replicated ones
  // (older copies are dropped by their holders: replicator.h).
  std::optional<uint64_t> RestorableNow(const std::string& job, std::optional<uint64_t> committed)
      REQUIRES(mu_);
  // `reachable`: only nodes with a data plane (for fetches); else every live node holding a copy.
  LoadPlanner::MemoryHolders HeldInMemoryLocked(const std::string& job, uint64_t step,
                                                bool reachable) REQUIRES(mu_);
  // A REPLICATED report: counts its ranks, or (with a reason) decides the step not replicated.
  Status NoteReplicated(const ckptd::v1::ReportRanksRequest& req, StepRecord& s) REQUIRES(mu_);
  // Decides the step not replicated (`reason`): for a memory-only step, which it fails.
  void DecideNotReplicated(const std::string& job, uint64_t step, StepRecord& s,
                           const std::string& reason) REQUIRES(mu_);
  // Records the step's REPLICATED decision `e` and sends it to the job's nodes.
  void DecideReplication(const std::string& job, StepRecord& s,
                         const ckptd::v1::CoordinatorEvent& e) REQUIRES(mu_);
  void SendHolders(const std::string& node_id) REQUIRES(mu_);
  // Releases the job's copies in memory: counted no more, and every attached node told.
  ckptd::v1::JobReleased Release(const std::string& job, JobRecord& j, const std::string& reason)
      REQUIRES(mu_);
  // Something of the job happened (a report, a restore point, a load's manifest): its release
  // clock, if it runs, starts again.
  static void NoteActivity(JobRecord& j);
  // Starts or runs the release clock of each job without registered ranks; the next deadline.
  void ReleaseIdleJobs(std::chrono::steady_clock::time_point now,
                       std::chrono::steady_clock::time_point* next) REQUIRES(mu_);
  // The peer tier's holder plan, due (HolderRegistry::TakeDue): computed on the plan thread
  // without the mutex, then applied and sent to the nodes whose holders changed.
  void PostHolderPlan(HolderRegistry::Replan replan) REQUIRES(mu_);
  void PlanHolderTier(const HolderRegistry::Replan& replan) EXCLUDES(mu_);
  // The step's data files live daemons hold in memory: each rank's own node while it is attached
  // (its hot cache), then the holders its REPLICATED report named, attached ones only.
  LoadPlanner::MemoryHolders HeldInMemory(const std::string& job, uint64_t step) EXCLUDES(mu_);
  // A task of the commit thread ended: counted down; the step's record, if it is still here.
  StepRecord* CommitTaskDone(const std::string& job, uint64_t step) REQUIRES(mu_);
  void OnCommitted(const std::string& job, uint64_t step, Status st);
  void LoseNode(const std::string& node_id, const std::string& why) REQUIRES(mu_);
  std::string MissingRanks(const StepRecord& s) const REQUIRES(mu_);
  // On the commit thread, after `committed` committed and before that is announced: removes the
  // step directories below it that no daemon reported (their daemon was killed between creating a
  // step's files and its first report). Commits go in step order and every step below `committed`
  // known here has ended, so such a directory has no writer left that will report it; nothing else
  // would remove it before the coordinator's next restart scan. A later report of such a step hears
  // ABORTED.
  void RemoveUnreportedBelow(const std::string& job, uint64_t committed) EXCLUDES(mu_);
  void Prune(JobRecord& j);
  void TimerLoop();
  Result<std::vector<std::string>> RecoverJob(const std::string& job);

  Config config_;
  FileSystem* fs_;
  std::unique_ptr<CommitEngine> owned_commit_;
  CommitEngine* commit_;
  TaskPool commit_thread_{1, config_.nice, "commit"};
  TaskPool plan_thread_{1, 0, "plan"};
  Mutex mu_;
  CondVar cv_;
  std::map<std::string, JobRecord> jobs_ GUARDED_BY(mu_);
  std::map<std::string, NodeRecord> nodes_ GUARDED_BY(mu_);
  // The next epoch to give a node: seeded from the wall clock (microseconds) at construction,
  // so that a restarted coordinator's epochs are above its predecessor's.
  uint64_t next_epoch_ GUARDED_BY(mu_) =
      static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(
                                std::chrono::system_clock::now().time_since_epoch())
                                .count());
  RestorePoints restore_points_ GUARDED_BY(mu_);
  // Its own lock, taken before mu_: a round being planned asks HeldInMemory.
  LoadPlanner load_planner_{config_.load_plan};
  LayoutRegistry layouts_ GUARDED_BY(mu_);
  HolderRegistry holders_ GUARDED_BY(mu_){config_.holder_replan_delay};
  int plans_in_flight_ GUARDED_BY(mu_) = 0;
  int commits_in_flight_ GUARDED_BY(mu_) = 0;
  uint64_t commits_merged_afresh_ GUARDED_BY(mu_) = 0;
  bool stopping_ GUARDED_BY(mu_) = false;
  std::thread timer_;
  bool started_ = false;
};

}  // namespace ckpt
