#include "daemon/coordinator/coordinator_core.h"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "common/logging.h"
#include "common/manifest_io.h"
#include "common/names.h"
#include "common/step_layout.h"

namespace ckpt {

using ckptd::v1::StepState;
using Clock = std::chrono::steady_clock;

namespace {

// The coordinator's merges keep the stored shards' replica keys for the skipped-layout check.
constexpr ManifestMerger::Options kCommitMergeOptions{.track_replica_keys = true};

std::string StepName(const std::string& job, uint64_t step) {
  return "job '" + job + "' step " + std::to_string(step);
}

std::string RankList(const std::vector<uint32_t>& ranks) {
  std::string out = "[";
  for (size_t i = 0; i < ranks.size(); ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
  return out + "]";
}

// A step's decision as a report's answer hears it.
ckptd::v1::StepDecision Decision(const std::string& job, uint64_t step, StepState state,
                                 const std::string& reason, bool skipped = false) {
  ckptd::v1::StepDecision d;
  d.set_job(job);
  d.set_step(step);
  d.set_state(state);
  d.set_reason(reason);
  d.set_skipped(skipped);
  return d;
}

// The step's REPLICATED decision: replicated, or — with a reason — not.
ckptd::v1::CoordinatorEvent ReplicationEvent(const std::string& job, uint64_t step,
                                             const std::string& not_replicated_reason = {}) {
  ckptd::v1::CoordinatorEvent e;
  *e.mutable_step() = Decision(job, step, ckptd::v1::STEP_STATE_REPLICATED, not_replicated_reason);
  e.mutable_step()->set_not_replicated(!not_replicated_reason.empty());
  return e;
}

// What a node hears when a job's copies in memory are released (Release).
ckptd::v1::CoordinatorEvent ReleasedEvent(const std::string& job, uint64_t through,
                                          const std::string& reason) {
  ckptd::v1::CoordinatorEvent e;
  e.mutable_released()->set_job(job);
  e.mutable_released()->set_through_step(through);
  e.mutable_released()->set_reason(reason);
  return e;
}

// RegisterNodeRequest.held_jobs kept per node, at most (a hostile list costs bounded memory),
// and no job record is made for one once the coordinator holds this many.
constexpr size_t kMaxHeldJobs = 4096;
constexpr size_t kMaxJobsLearnedFromHolders = 16384;

// Fencing: a report stamped with an epoch that ended when its node was declared lost (frozen
// or cut off past its lease) is refused; what the node said then may be stale. 0: unstamped.
Status RefuseFencedReport(uint64_t epoch, uint64_t fenced_through, const std::string& ctx) {
  if (epoch == 0 || epoch > fenced_through) return Status::Ok();
  spdlog::warn("{}: refused, made in the node's epoch {}, which ended when it was declared lost",
               ctx, epoch);
  return FailedPrecondition(ctx + ": made in the node's epoch " + std::to_string(epoch) +
                            ", which ended when the coordinator declared the node lost; a "
                            "fenced node's reports from before are refused");
}

// True when `m` is an older report of the node manifest `held` (same node and step): it lists
// fewer ranks, and every rank, shard and skipped_under entry it has is in `held` exactly as it
// is in `m`. A daemon reports a step again each time another rank persists, each report a
// superset of the last, so a report overtaken by a newer one looks like this. Entries that
// differ (a rank's file written anew) are not an older report: the commit merges afresh.
bool OlderReportOf(const ckptd::v1::NodeManifest& m, const ckptd::v1::NodeManifest& held) {
  if (m.ranks_size() >= held.ranks_size()) return false;
  const auto contains = [](const auto& entries, const auto& entry) {
    const std::string want = entry.SerializeAsString();
    return std::any_of(entries.begin(), entries.end(),
                       [&](const auto& e) { return e.SerializeAsString() == want; });
  };
  for (const auto& r : m.ranks()) {
    if (!contains(held.ranks(), r)) return false;
  }
  for (const auto& u : m.skipped_under()) {
    if (!contains(held.skipped_under(), u)) return false;
  }
  // Rare (only overtaken reports get here), so plainly: each tensor's shards as serialized bytes.
  std::unordered_map<std::string, std::unordered_set<std::string>> held_shards;
  for (const auto& t : held.tensors()) {
    auto& shards = held_shards[t.name()];
    for (const auto& shard : t.shards()) shards.insert(shard.SerializeAsString());
  }
  for (const auto& t : m.tensors()) {
    auto it = held_shards.find(t.name());
    if (it == held_shards.end() && t.shards_size() > 0) return false;
    for (const auto& shard : t.shards()) {
      if (it->second.count(shard.SerializeAsString()) == 0) return false;
    }
  }
  return true;
}

}  // namespace

CoordinatorCore::CoordinatorCore(Config config, FileSystem* fs, CommitEngine* shared_commit)
    : config_(std::move(config)),
      fs_(fs),
      owned_commit_(shared_commit != nullptr
                        ? nullptr
                        : std::make_unique<CommitEngine>(
                              CommitEngine::Config{config_.storage_root, config_.keep,
                                                   config_.writer, config_.on_commit_point},
                              fs)),
      commit_(shared_commit != nullptr ? shared_commit : owned_commit_.get()),
      layouts_(config_.layout_ask_timeout) {}

CoordinatorCore::~CoordinatorCore() { Stop(); }

bool CoordinatorCore::Terminal(StepState s) {
  // REPLICATED is a state only for memory-only steps, whose end it is.
  return s == ckptd::v1::STEP_STATE_COMMITTED || s == ckptd::v1::STEP_STATE_ABORTED ||
         s == ckptd::v1::STEP_STATE_FAILED || s == ckptd::v1::STEP_STATE_REPLICATED;
}

Result<std::vector<std::string>> CoordinatorCore::Start() {
  RETURN_IF_ERROR(fs_->CreateDirs(config_.storage_root), "storage root");
  std::vector<std::string> report;
  ASSIGN_OR_RETURN(auto jobs, fs_->ListDir(config_.storage_root), "recovery scan");
  for (const auto& job : jobs) {
    if (!ValidateJobName(job).ok()) continue;  // not a job directory of ours
    ASSIGN_OR_RETURN(auto lines, RecoverJob(job));
    report.insert(report.end(), lines.begin(), lines.end());
  }
  commit_thread_.Start();
  plan_thread_.Start();
  started_ = true;
  timer_ = std::thread([this] { TimerLoop(); });
  return report;
}

Result<std::vector<std::string>> CoordinatorCore::RecoverJob(const std::string& job) {
  std::vector<std::string> report;
  const std::string job_dir = JobDir(config_.storage_root, job);
  auto entries = fs_->ListDir(job_dir);
  if (!entries.ok()) return report;  // a plain file in the root
  for (const auto& name : *entries) {
    if (!name.ends_with(".tmp")) continue;
    if (Status st = fs_->RemoveAll(JoinPath(job_dir, name)); !st.ok()) {
      report.push_back("job '" + job + "': leftover " + name + " not removed: " + st.message());
    }
  }
  ASSIGN_OR_RETURN(auto steps, ListUncommittedSteps(fs_, job_dir));
  for (uint64_t step : steps) {
    const std::string dir = StepDir(config_.storage_root, job, step);
    std::vector<ckptd::v1::NodeManifest> nodes;
    std::string why;
    auto files = fs_->ListDir(dir);
    if (files.ok()) {
      for (const auto& f : *files) {
        if (!f.starts_with("node-") || !f.ends_with(".nmf")) continue;
        auto m = ReadNodeManifest(fs_, JoinPath(dir, f));
        if (!m.ok()) {
          why = m.status().message();
          nodes.clear();
          break;
        }
        nodes.push_back(std::move(m).value());
      }
    }
    Status committed = FailedPrecondition(why.empty() ? "no node manifest" : why);
    if (!nodes.empty() && why.empty()) {
      std::set<uint32_t> ranks;
      for (const auto& n : nodes) {
        for (const auto& r : n.ranks()) ranks.insert(r.rank());
      }
      if (ranks.size() == nodes[0].world_size()) {
        committed = commit_->Commit(nodes);
      } else {
        committed =
            FailedPrecondition(std::to_string(ranks.size()) + " of " +
                               std::to_string(nodes[0].world_size()) + " ranks were persisted");
      }
    }
    if (committed.ok()) {
      report.push_back(StepName(job, step) + ": committed (every rank was persisted)");
      continue;
    }
    // A daemon may still be writing into the directory (the coordinator restarted under a live
    // step): removal can then fail (ENOTEMPTY as a file appears). Not fatal — the step is
    // aborted either way, and the daemon, told so when it reports the step again, removes the
    // directory once its writers have let go.
    const Status removed = commit_->RemoveStep(job, step);
    if (config_.refuse_recovered_steps) {
      MutexLock lock(mu_);
      jobs_[job].recovered_aborted.insert(step);
    }
    report.push_back(StepName(job, step) + ": removed (" + committed.message() + ")" +
                     (removed.ok() ? ""
                                   : "; not all of it yet: " + removed.message() +
                                         " (its writer removes the rest when told)"));
  }
  return report;
}

void CoordinatorCore::Stop() {
  {
    MutexLock lock(mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  cv_.NotifyAll();
  if (timer_.joinable()) timer_.join();
  plan_thread_.Stop();
  commit_thread_.Stop();
  MutexLock lock(mu_);
  nodes_.clear();
}

Result<ckptd::v1::RegisterNodeResponse> CoordinatorCore::RegisterNode(
    const ckptd::v1::RegisterNodeRequest& req, const std::string& incarnation) {
  if (req.node_id().empty() || req.node_id().size() > 253 ||
      req.node_id().find_first_of("/\\\0 ", 0, 4) != std::string::npos) {
    return InvalidArgument("node id '" + EscapeForLog(req.node_id()) +
                           "' is empty, too long or holds '/', '\\', NUL or space");
  }
  MutexLock lock(mu_);
  NodeRecord& n = nodes_[req.node_id()];
  const bool restarted = !n.instance.empty() && n.instance != req.instance();
  if (restarted) {
    // The daemon restarted: whatever its previous process had in flight is gone.
    LoseNode(req.node_id(), "its daemon restarted");
  }
  if (n.instance != req.instance()) {
    spdlog::info("node '{}' registered (instance {}, admin {}, version {})", req.node_id(),
                 req.instance(), req.admin_address(), req.version());
  }
  n.instance = req.instance();
  // A node new here, restarted, or declared lost since its last registration starts a new
  // epoch; a node that reconnects within its lease keeps its epoch (its reports in flight stand).
  // The same process, woken or reconnected late — or registering again before it attached.
  const bool fenced = !restarted && (n.lost || n.fence_pending);
  if (n.epoch == 0 || n.lost) {
    if (n.lost && !restarted) {
      spdlog::warn(
          "node '{}' registered again after it was declared lost: its reports from epoch {} are "
          "refused (fenced); its epoch is now {}",
          req.node_id(), n.fenced_through, next_epoch_);
    }
    n.epoch = next_epoch_++;
    n.lost = false;
  }
  n.fence_pending = fenced;
  // Alive now: a node whose stream is down gets a whole lease to open it again.
  if (n.lost_at) n.lost_at = Clock::now() + config_.lease;
  holders_.Set(req.node_id(),
               {req.peer_address(), req.failure_domain(), req.peer_pool_bytes(), req.replicas()},
               Clock::now());
  // The jobs its peer pool holds: a job unknown here (this coordinator restarted since) gets a
  // record, so that its release clock runs unless a rank of it registers again.
  n.held_jobs.clear();
  for (const auto& held : req.held_jobs()) {
    if (!ValidateJobName(held.job()).ok() || n.held_jobs.size() >= kMaxHeldJobs) continue;
    auto j = jobs_.find(held.job());
    if (j == jobs_.end()) {
      if (jobs_.size() >= kMaxJobsLearnedFromHolders) continue;  // a hostile flood: bounded
      j = jobs_.try_emplace(held.job()).first;
    }
    n.held_jobs.insert(held.job());
    j->second.held_through = std::max(j->second.held_through, held.newest_step());
    // Copies newer than its release surfaced (a node away then, or a PUT that landed after
    // it): the job is released again, through them.
    if (j->second.released && held.newest_step() > j->second.released_through.value_or(0)) {
      j->second.released = false;
    }
  }
  cv_.NotifyAll();  // the timer plans the holders
  ckptd::v1::RegisterNodeResponse resp;
  resp.set_lease_ms(static_cast<uint64_t>(config_.lease.count()));
  resp.set_incarnation(incarnation);
  resp.set_epoch(n.epoch);
  resp.set_fenced(fenced);
  return resp;
}

Status CoordinatorCore::AttachNode(const std::string& node_id, std::shared_ptr<NodeSink> sink) {
  MutexLock lock(mu_);
  auto it = nodes_.find(node_id);
  if (it == nodes_.end()) {
    return FailedPrecondition("node '" + EscapeForLog(node_id) + "' watches before RegisterNode");
  }
  if (it->second.lost) {
    // Its lease ran out between its registration and this: it must register again, and hear
    // that it was fenced, before its reports count.
    return FailedPrecondition("node '" + EscapeForLog(node_id) +
                              "' was declared lost since it registered: register again");
  }
  it->second.fence_pending = false;
  it->second.sink = std::move(sink);
  it->second.lost_at.reset();
  for (auto& [name, j] : jobs_) {
    if (j.nodes.count(node_id) != 0 && j.plan) SendPlan(name, j, node_id);
  }
  SendHolders(node_id);
  // What was released while it was away: each job its peer pool holds that was ever released
  // (those steps never count again, even if the job came back), and, while they stay released,
  // the jobs it saved for (its own keeps).
  const std::set<std::string> held = std::move(it->second.held_jobs);
  it->second.held_jobs.clear();
  for (const auto& [name, j] : jobs_) {
    if (!j.released_through) continue;
    if (held.count(name) == 0 && !(j.released && j.nodes.count(node_id) != 0)) continue;
    // Through the holders' newest steps only while it stays released: once the job came back,
    // steps above its release are live copies.
    const uint64_t through =
        j.released ? std::max(*j.released_through, j.held_through) : *j.released_through;
    it->second.sink->Send(ReleasedEvent(name, through, "released while this node was away"));
  }
  return Status::Ok();
}

Result<ckptd::v1::LoadPlanResponse> CoordinatorCore::PlanLoad(
    const ckptd::v1::LoadPlanRequest& req) {
  try {
    return load_planner_.Ask(req, LoadPlanner::Clock::now(),
                             [&] { return HeldInMemory(req.job(), req.step()); });
  } catch (const std::bad_alloc&) {  // a plan too large for this process: refused, not fatal
    return ResourceExhausted("load plan of job '" + req.job() + "': out of memory");
  }
}

LoadPlanner::MemoryHolders CoordinatorCore::HeldInMemory(const std::string& job, uint64_t step) {
  MutexLock lock(mu_);
  return HeldInMemoryLocked(job, step, /*reachable=*/true);
}

LoadPlanner::MemoryHolders CoordinatorCore::HeldInMemoryLocked(const std::string& job,
                                                               uint64_t step, bool reachable) {
  LoadPlanner::MemoryHolders held;
  auto j = jobs_.find(job);
  if (j == jobs_.end()) return held;
  if (j->second.ReleasedStep(step)) return held;
  auto s = j->second.steps.find(step);
  if (s == j->second.steps.end() || s->second.state == ckptd::v1::STEP_STATE_ABORTED ||
      s->second.state == ckptd::v1::STEP_STATE_FAILED) {
    return held;
  }
  // A daemon's hot cache holds its newest step of a job only: the node that saved a rank counts
  // as holding the rank's file for the newest step this coordinator knows of the job — and for a
  // memory-only step until a newer step of the job is replicated (the node keeps it until then).
  bool newest = s == std::prev(j->second.steps.end());
  if (s->second.memory_only) {
    newest = std::none_of(std::next(s), j->second.steps.end(), [](const auto& later) {
      return later.second.replication_decided && !later.second.replication.not_replicated();
    });
  }
  for (const auto& [rank, holders] : s->second.replica_holders) {
    std::vector<std::string> candidates;  // the writer first (newest step only), then holders
    auto saved = s->second.saved.find(rank);
    if (newest && saved != s->second.saved.end() &&
        s->second.lost_savers.count(saved->second) == 0) {
      candidates.push_back(saved->second);
    }
    candidates.insert(candidates.end(), holders.begin(), holders.end());
    auto& list = held[DataFileName(rank)];
    for (const std::string& node : candidates) {
      auto n = nodes_.find(node);
      if (n == nodes_.end() || !n->second.sink) continue;  // lost, or its stream is down
      const std::string address = holders_.AddressOf(node);
      const bool listed =
          std::any_of(list.begin(), list.end(), [&node](const auto& h) { return h.first == node; });
      if ((!reachable || !address.empty()) && !listed) list.emplace_back(node, address);
    }
    if (list.empty()) held.erase(DataFileName(rank));
  }
  return held;
}

void CoordinatorCore::PostHolderPlan(HolderRegistry::Replan replan) {
  ++plans_in_flight_;
  if (!plan_thread_.Post([this, replan = std::move(replan)] { PlanHolderTier(replan); })) {
    --plans_in_flight_;  // stopping: the nodes keep the holders they have
    cv_.NotifyAll();
  }
}

void CoordinatorCore::PlanHolderTier(const HolderRegistry::Replan& replan) {
  const auto start = Clock::now();
  HolderRegistry::Planned planned = HolderRegistry::Plan(replan);
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  {
    MutexLock lock(mu_);
    --plans_in_flight_;
    const auto told = holders_.Apply(planned);
    for (const std::string& node : told) SendHolders(node);
    if (!told.empty()) {
      spdlog::info("holder plan v{}: {} node(s) told their holders, planned in {:.1f} ms",
                   holders_.version(), told.size(), ms);
    }
    cv_.NotifyAll();  // the timer waits for the next plan, due again now
  }
  // What the plan replaced (`planned`, and the snapshots in `replan`) is freed here, unlocked.
}

void CoordinatorCore::SendHolders(const std::string& node_id) {
  auto n = nodes_.find(node_id);
  if (n == nodes_.end() || !n->second.sink) return;  // it hears them when it attaches
  ckptd::v1::CoordinatorEvent e;
  *e.mutable_holders() = holders_.AssignmentFor(node_id);
  n->second.sink->Send(e);
}

void CoordinatorCore::DetachNode(const std::string& node_id, const NodeSink* sink) {
  MutexLock lock(mu_);
  auto it = nodes_.find(node_id);
  if (it == nodes_.end() || it->second.sink.get() != sink) return;  // replaced already
  it->second.sink.reset();
  it->second.lost_at = Clock::now() + config_.lease;
  spdlog::warn("node '{}': event stream ended; lost unless it returns within {} ms", node_id,
               config_.lease.count());
  // Until it registers again (every reconnect does), it neither holds nor replicates: the nodes
  // it held for get other holders at once, rather than failing to replicate for a lease.
  holders_.Remove(node_id, Clock::now());
  cv_.NotifyAll();
}

void CoordinatorCore::LoseNode(const std::string& node_id, const std::string& why) {
  spdlog::warn("node '{}' lost: {}", node_id, why);
  if (auto n = nodes_.find(node_id); n != nodes_.end()) {
    n->second.fenced_through = std::max(n->second.fenced_through, n->second.epoch);
    n->second.lost = true;
  }
  holders_.Remove(node_id, Clock::now());
  cv_.NotifyAll();
  // What it held in memory went with it (a restarted daemon holds nothing).
  for (auto& [name, j] : jobs_) {
    for (auto& [n, s] : j.steps) {
      for (auto& [rank, holders] : s.replica_holders) std::erase(holders, node_id);
      if (j.nodes.count(node_id) != 0) s.lost_savers.insert(node_id);
    }
  }
  for (auto& [name, j] : jobs_) {
    if (j.nodes.count(node_id) == 0) continue;
    // Its trainers' registrations went with it: nobody skips a replica it was to write.
    std::vector<uint32_t> gone;
    if (auto on = j.ranks_by_node.find(node_id); on != j.ranks_by_node.end()) {
      gone.assign(on->second.begin(), on->second.end());
    }
    for (uint32_t rank : gone) WithdrawRank(j, rank);
    MaybePlan(name, j);
    for (auto& [n, s] : j.steps) {
      if (Terminal(s.state) || s.committing) continue;
      if (s.memory_only && s.persisted.size() == s.world_size) {
        // In memory everywhere, but the lost node's ranks that were not replicated yet are gone.
        std::vector<uint32_t> unreplicated;
        for (const auto& [rank, node] : s.saved) {
          if (node == node_id && s.replicated.count(rank) == 0) unreplicated.push_back(rank);
        }
        if (unreplicated.empty()) continue;
        const std::string reason = "rank(s) " + RankList(unreplicated) + " on node '" + node_id +
                                   "' not replicated: the node was lost (" + why + ")";
        FailMemoryOnly(name, n, s, reason);
        continue;
      }
      if (s.persisted.size() == s.world_size) continue;
      Decide(name, n, s, ckptd::v1::STEP_STATE_ABORTED,
             "node '" + node_id + "' was lost (" + why + "); " + MissingRanks(s));
    }
  }
}

std::string CoordinatorCore::MissingRanks(const StepRecord& s) const {
  std::map<std::string, std::vector<uint32_t>> by_node;
  std::vector<uint32_t> unsaved;
  for (uint32_t r = 0; r < s.world_size; ++r) {
    if (s.persisted.count(r) != 0) continue;
    auto it = s.saved.find(r);
    if (it == s.saved.end()) {
      unsaved.push_back(r);
    } else {
      by_node[it->second].push_back(r);
    }
  }
  std::string out = "missing ranks";
  bool any = false;
  for (const auto& [node, ranks] : by_node) {
    out += std::string(any ? ";" : "") + " " + RankList(ranks) + " on node '" + node +
           "' (not persisted)";
    any = true;
  }
  if (!unsaved.empty()) {
    out += std::string(any ? ";" : "") + " " + RankList(unsaved) + " (never saved; node unknown)";
  }
  return out;
}

void CoordinatorCore::Broadcast(const std::string& job, const ckptd::v1::CoordinatorEvent& e) {
  auto j = jobs_.find(job);
  if (j == jobs_.end()) return;
  for (const auto& node : j->second.nodes) {
    auto n = nodes_.find(node);
    if (n != nodes_.end() && n->second.sink) n->second.sink->Send(e);
  }
}

void CoordinatorCore::Decide(const std::string& job, uint64_t step, StepRecord& s, StepState state,
                             const std::string& reason) {
  if (Terminal(s.state)) return;
  s.state = state;
  s.reason = reason;
  if (Terminal(state)) {
    spdlog::log(
        state == ckptd::v1::STEP_STATE_COMMITTED ? spdlog::level::info : spdlog::level::warn,
        "{}: {}{}", StepName(job, step),
        state == ckptd::v1::STEP_STATE_COMMITTED ? "committed"
        : state == ckptd::v1::STEP_STATE_ABORTED ? "aborted"
                                                 : "failed",
        reason.empty() ? "" : ": " + reason);
  }
  ckptd::v1::CoordinatorEvent e;
  *e.mutable_step() = Decision(job, step, state, reason, s.skipped);
  // Counted before it is announced: whoever hears of the decision finds it in the metrics.
  if (config_.on_step_state) config_.on_step_state(job, step, state, reason);
  if (state == ckptd::v1::STEP_STATE_COMMITTED && config_.on_commit) {
    config_.on_commit(job, step,
                      std::chrono::duration<double>(Clock::now() - s.last_report).count());
  }
  Broadcast(job, e);
  if (state == ckptd::v1::STEP_STATE_ABORTED || state == ckptd::v1::STEP_STATE_FAILED) {
    s.manifests.clear();
    s.merged_ranks.clear();
    s.merge.reset();  // its queued merges finish on the commit thread and free it there
    s.skipped_layouts.clear();
    s.skips_unresolved.clear();
    ++commits_in_flight_;
    const bool posted = commit_thread_.Post([this, job, step] {
      Status st = commit_->RemoveStep(job, step);
      if (!st.ok()) spdlog::warn("{}: removing its data: {}", StepName(job, step), st.ToString());
      MutexLock lock(mu_);
      --commits_in_flight_;
      cv_.NotifyAll();
    });
    if (!posted) {  // stopping: the next start's recovery scan removes the directory
      --commits_in_flight_;
      cv_.NotifyAll();
      spdlog::warn("{}: the coordinator is stopping; its data is left to the next recovery scan",
                   StepName(job, step));
    }
    TryCommit(job);  // a later step may have waited behind this one
  }
}

Result<ckptd::v1::ReportRanksResponse> CoordinatorCore::ReportRanks(
    const ckptd::v1::ReportRanksRequest& req) {
  RETURN_IF_ERROR(ValidateJobName(req.job()));
  const std::string ctx =
      StepName(req.job(), req.step()) + " from node '" + EscapeForLog(req.node_id()) + "'";
  if (req.world_size() == 0 || req.world_size() > (1u << 20)) {
    return InvalidArgument(ctx + ": world size " + std::to_string(req.world_size()));
  }
  for (uint32_t r : req.ranks()) {
    if (r >= req.world_size()) {
      return InvalidArgument(ctx + ": rank " + std::to_string(r) + " is not below world size " +
                             std::to_string(req.world_size()));
    }
  }
  ckptd::v1::ReportRanksResponse resp;
  MutexLock lock(mu_);
  auto node = nodes_.find(req.node_id());
  if (node == nodes_.end()) {
    return FailedPrecondition(ctx + ": the node has not registered");
  }
  // What it says of its steps, copies or holders in an epoch that ended may be stale.
  RETURN_IF_ERROR(RefuseFencedReport(req.epoch(), node->second.fenced_through, ctx));
  JobRecord& j = jobs_[req.job()];
  j.nodes.insert(req.node_id());
  NoteActivity(j);
  if (req.memory_only() && j.ReleasedStep(req.step())) {
    // Its copies would be dropped by a release still on its way, and are never counted.
    *resp.mutable_decision() = Decision(
        req.job(), req.step(), ckptd::v1::STEP_STATE_FAILED,
        "the job's copies in memory were released through step " +
            std::to_string(*j.released_through) +
            " (its trainers had ended): a memory-only step at or below it never restores; save "
            "a later step number, or persist it");
    return resp;
  }
  auto it = j.steps.find(req.step());
  if (it == j.steps.end()) {
    if (req.state() == ckptd::v1::STEP_STATE_REPLICATED) {
      // Nothing here follows that step's replication (this coordinator restarted, or the step
      // is older than the ones it keeps): its waiters hear so instead of waiting forever.
      *resp.mutable_decision() =
          ReplicationEvent(req.job(), req.step(),
                           "the coordinator has no record of the step (it restarted, or the step "
                           "is older than the steps it keeps): its replication is not followed")
              .step();
      return resp;
    }
    StepState ended = ckptd::v1::STEP_STATE_PENDING;
    std::string why;
    if (j.recovered_aborted.count(req.step()) != 0) {
      ended = ckptd::v1::STEP_STATE_ABORTED;
      why = "the coordinator restarted before every rank was persisted; the step was removed";
    } else {
      auto committed = fs_->Exists(JoinPath(StepDir(config_.storage_root, req.job(), req.step()),
                                            std::string(kManifestFileName)));
      if (committed.ok() && *committed) ended = ckptd::v1::STEP_STATE_COMMITTED;
    }
    if (ended != ckptd::v1::STEP_STATE_PENDING) {
      *resp.mutable_decision() = Decision(req.job(), req.step(), ended, why);
      return resp;
    }
    restore_points_.OnStepStarted(req.job(), req.step());
    StepRecord fresh;
    fresh.world_size = req.world_size();
    fresh.memory_only = req.memory_only();
    fresh.first_report = Clock::now();
    fresh.deadline = fresh.first_report + config_.step_timeout;
    it = j.steps.emplace(req.step(), std::move(fresh)).first;
    cv_.NotifyAll();
  }
  StepRecord& s = it->second;
  if (req.state() == ckptd::v1::STEP_STATE_REPLICATED &&
      s.state == ckptd::v1::STEP_STATE_COMMITTED) {
    RETURN_IF_ERROR(NoteReplicated(req, s));  // a committed step's copies count as hot state
    if (s.replication_decided) *resp.mutable_decision() = s.replication;
    return resp;
  }
  if (Terminal(s.state)) {
    *resp.mutable_decision() = Decision(req.job(), req.step(), s.state, s.reason, s.skipped);
    return resp;
  }
  s.last_report = Clock::now();
  if (s.world_size != req.world_size()) {
    return InvalidArgument(ctx + ": world size " + std::to_string(req.world_size()) +
                           " differs from the step's " + std::to_string(s.world_size));
  }
  if (req.memory_only() != s.memory_only &&
      (s.committing || (!s.memory_only && s.persisted.size() == s.world_size))) {
    // Every rank is durable and the commit is under way: a stray report changes nothing.
    return InvalidArgument(ctx + ": reports the step " +
                           (req.memory_only() ? "memory-only" : "saved to storage") +
                           ", which it is not; ignored (its commit is under way)");
  }
  if (req.memory_only() != s.memory_only) {
    // Some ranks write the step and others keep it in memory only: it can neither commit nor
    // restore from memory alone.
    std::vector<uint32_t> ranks(req.ranks().begin(), req.ranks().end());
    Decide(req.job(), req.step(), s, ckptd::v1::STEP_STATE_FAILED,
           "rank(s) " + RankList(ranks) + " on node '" + EscapeForLog(req.node_id()) +
               "' saved the step " + (req.memory_only() ? "memory-only" : "to storage") +
               ", other ranks " + (s.memory_only ? "memory-only" : "to storage") +
               ": every rank must save a step the same way (persist=)");
    *resp.mutable_decision() = Decision(req.job(), req.step(), s.state, s.reason, s.skipped);
    return resp;
  }
  for (uint32_t r : req.ranks()) {
    auto [at, inserted] = s.saved.try_emplace(r, req.node_id());
    if (!inserted && at->second != req.node_id()) {
      return InvalidArgument(ctx + ": rank " + std::to_string(r) + " was already saved on node '" +
                             at->second + "'");
    }
  }
  // A node that did not hear the decision (it reported the step only later, or its stream was
  // down) hears it in the answer; a REPLICATED report always does (it may be a re-report after
  // the node reconnected).
  if (s.replication_decided && (req.state() == ckptd::v1::STEP_STATE_REPLICATED ||
                                s.told_replication.insert(req.node_id()).second)) {
    *resp.mutable_decision() = s.replication;
  }
  switch (req.state()) {
    case ckptd::v1::STEP_STATE_PENDING:
      break;
    case ckptd::v1::STEP_STATE_REPLICATED:
      RETURN_IF_ERROR(NoteReplicated(req, s));
      break;
    case ckptd::v1::STEP_STATE_CAPTURED:
      s.captured.insert(req.ranks().begin(), req.ranks().end());
      if (s.captured.size() == s.world_size && s.state < ckptd::v1::STEP_STATE_CAPTURED) {
        Decide(req.job(), req.step(), s, ckptd::v1::STEP_STATE_CAPTURED, "");
      }
      break;
    case ckptd::v1::STEP_STATE_PERSISTED: {
      const auto& m = req.node_manifest();
      if (m.job() != req.job() || m.step() != req.step() || m.node_id() != req.node_id() ||
          m.world_size() != req.world_size()) {
        return InvalidArgument(ctx + ": the node manifest is for job '" + EscapeForLog(m.job()) +
                               "' step " + std::to_string(m.step()) + " node '" +
                               EscapeForLog(m.node_id()) + "'");
      }
      // Every rank checked before any is counted: a refused report changes nothing.
      for (const auto& r : m.ranks()) {
        if (r.rank() >= s.world_size) {
          return InvalidArgument(ctx + ": node manifest lists rank " + std::to_string(r.rank()));
        }
      }
      for (const auto& r : m.ranks()) {
        s.saved.try_emplace(r.rank(), req.node_id());
        s.captured.insert(r.rank());
        s.persisted.insert(r.rank());
      }
      if (config_.on_skips) {
        size_t named = 0;
        for (const auto& under : m.skipped_under()) named += under.shards();
        config_.on_skips(static_cast<size_t>(m.skipped_size()), named);
      }
      const auto held = s.manifests.find(req.node_id());
      if (held != s.manifests.end() && OlderReportOf(m, *held->second)) {
        // Retried after its answer was lost, or re-sent on a reconnect, and overtaken by a newer
        // report: the manifest held already says all this and more (ranks above are counted).
        spdlog::info(
            "{}: a report of {} of the {} ranks this node reported before, each as "
            "reported then: an older report arriving late, ignored",
            ctx, m.ranks_size(), held->second->ranks_size());
      } else if (!s.committing && !s.finishing_in_memory) {  // else a late copy the commit has
        NoteSkippedLayouts(j, s, m);
        MergeAsReported(s, std::make_shared<const ckptd::v1::NodeManifest>(m));
      }
      if (s.captured.size() == s.world_size && s.state < ckptd::v1::STEP_STATE_CAPTURED) {
        Decide(req.job(), req.step(), s, ckptd::v1::STEP_STATE_CAPTURED, "");
      }
      if (s.memory_only) {
        // In memory on every node: never persisted nor committed (no PERSISTED decision, so
        // waiters for it fail instead of hearing of a durability that is not there).
        if (s.persisted.size() == s.world_size) FinishMemoryOnly(req.job(), req.step(), s);
      } else if (s.persisted.size() == s.world_size && s.state < ckptd::v1::STEP_STATE_PERSISTED) {
        Decide(req.job(), req.step(), s, ckptd::v1::STEP_STATE_PERSISTED, "");
        TryCommit(req.job());
      }
      break;
    }
    case ckptd::v1::STEP_STATE_FAILED:
    case ckptd::v1::STEP_STATE_ABORTED:
      if (s.persisted.size() == s.world_size) {
        // Every rank is durable and the commit is under way: a node failing afterwards (e.g. a
        // daemon shutting down) changes nothing on disk, so the step still commits.
        spdlog::warn("{}: ignoring a late failure report ({}): every rank is persisted", ctx,
                     req.reason());
        break;
      }
      if (!Terminal(s.state)) s.skipped = req.skipped();
      Decide(req.job(), req.step(), s, req.state(),
             "node '" + req.node_id() + "': " + req.reason());
      break;
    default:
      return InvalidArgument(ctx + ": cannot report state " + std::to_string(req.state()));
  }
  return resp;
}

Result<ckptd::v1::ReportRegistrationResponse> CoordinatorCore::ReportRegistration(
    const ckptd::v1::ReportRegistrationRequest& req) {
  const size_t request_bytes = req.ByteSizeLong();
  ckptd::v1::ReportRegistrationResponse resp;
  RETURN_IF_ERROR(ValidateJobName(req.job()));
  const std::string ctx = "job '" + req.job() + "' rank " + std::to_string(req.rank()) +
                          " from node '" + EscapeForLog(req.node_id()) + "'";
  if (req.world_size() == 0 || req.rank() >= req.world_size()) {
    return InvalidArgument(ctx + ": rank is not below world size " +
                           std::to_string(req.world_size()));
  }
  if (req.withdrawn()) {
    if (config_.on_registration) config_.on_registration(request_bytes, 0);
    MutexLock lock(mu_);
    if (auto node = nodes_.find(req.node_id()); node != nodes_.end()) {
      RETURN_IF_ERROR(RefuseFencedReport(req.epoch(), node->second.fenced_through, ctx));
    }
    if (!req.restore_session().empty()) {
      restore_points_.OnSessionEnded(req.job(), req.rank(), req.restore_session());
    }
    auto j = jobs_.find(req.job());
    if (j == jobs_.end()) return resp;
    NoteActivity(j->second);  // a restore's session that ended starts the release clock anew
    auto have = j->second.registrations.find(req.rank());
    // Only the registration it names: the rank may have registered anew elsewhere meanwhile.
    if (req.registration_id() == 0 || have == j->second.registrations.end() ||
        have->second.node_id != req.node_id() ||
        have->second.registration_id != req.registration_id()) {
      return resp;
    }
    WithdrawRank(j->second, req.rank());
    MaybePlan(req.job(), j->second);
    cv_.NotifyAll();  // the timer may have a job to release
    return resp;
  }
  LayoutFingerprint claimed;
  if (!req.layout_fingerprint().empty() &&
      !LayoutFingerprint::FromBytes(req.layout_fingerprint(), &claimed)) {
    return InvalidArgument(ctx + ": a layout fingerprint of " +
                           std::to_string(req.layout_fingerprint().size()) + " bytes (not 16)");
  }
  // A layout sent (or one from a daemon that always sends it) is parsed and checked here,
  // outside the mutex: O(its shards), once per distinct layout when daemons send fingerprints.
  std::shared_ptr<const RankLayout> layout;
  if (req.shards_size() > 0 || claimed.empty()) {
    ASSIGN_OR_RETURN(layout, MakeRankLayout(req.shards(), claimed, ctx));
  }
  if (config_.on_registration) {
    config_.on_registration(request_bytes, layout ? layout->wire_bytes : 0);
  }
  const LayoutFingerprint fingerprint = layout ? layout->fingerprint : claimed;
  MutexLock lock(mu_);
  auto node = nodes_.find(req.node_id());
  if (node == nodes_.end()) return FailedPrecondition(ctx + ": node not registered");
  // A rank that registered on another node since keeps that registration.
  RETURN_IF_ERROR(RefuseFencedReport(req.epoch(), node->second.fenced_through, ctx));
  if (layout) {
    layout = layouts_.Intern(std::move(layout));
  } else {
    layout = layouts_.Find(fingerprint);
    if (!layout && layouts_.Ask(fingerprint, Clock::now())) {
      resp.set_need_layout(true);  // nothing recorded: the rank registers when it answers
      return resp;
    }
  }
  JobRecord& j = jobs_[req.job()];
  j.nodes.insert(req.node_id());
  if (j.world_size != req.world_size()) {
    j.registrations.clear();
    j.ranks_by_node.clear();
    j.waiting = 0;
    ++j.registrations_version;
    j.world_size = req.world_size();
    j.plan_dirty = true;
  }
  auto have = j.registrations.find(req.rank());
  if (have != j.registrations.end() && have->second.node_id == req.node_id() &&
      have->second.fingerprint == fingerprint && have->second.layout != nullptr) {
    if (have->second.registration_id != req.registration_id()) {
      // The same shards registered anew (a trainer that reconnected): the plan stands, and the
      // node needs it under the new id before the rank skips anything.
      have->second.registration_id = req.registration_id();
      if (!j.plan_dirty && j.plan && !j.plan_revoked) SendPlan(req.job(), j, req.node_id());
    }
  } else {
    SetRank(j, req.rank(), RankRecord{req.node_id(), req.registration_id(), fingerprint, layout});
    if (!layout) {
      layouts_.AddWaiter(fingerprint, LayoutRegistry::Waiter{req.job(), req.rank(),
                                                             req.registration_id(), req.node_id()});
      resp.set_layout_pending(true);
    }
  }
  if (layout) ResolveWaiters(layout);
  MaybePlan(req.job(), j);
  return resp;
}

void CoordinatorCore::UnindexRank(JobRecord& j, uint32_t rank, const RankRecord& record) {
  if (!record.layout) --j.waiting;
  auto on = j.ranks_by_node.find(record.node_id);
  if (on != j.ranks_by_node.end()) {
    on->second.erase(rank);
    if (on->second.empty()) j.ranks_by_node.erase(on);
  }
}

void CoordinatorCore::SetRank(JobRecord& j, uint32_t rank, RankRecord record) {
  auto [it, fresh] = j.registrations.try_emplace(rank);
  if (!fresh) UnindexRank(j, rank, it->second);
  if (!record.layout) ++j.waiting;
  j.ranks_by_node[record.node_id].insert(rank);
  it->second = std::move(record);
  ++j.registrations_version;
  j.plan_dirty = true;
  j.idle_since.reset();  // live again: what it saves from now on counts
  j.released = false;
}

void CoordinatorCore::WithdrawRank(JobRecord& j, uint32_t rank) {
  auto it = j.registrations.find(rank);
  if (it == j.registrations.end()) return;
  UnindexRank(j, rank, it->second);
  j.registrations.erase(it);
  ++j.registrations_version;
  j.plan_dirty = true;
  NoteActivity(j);  // with no rank left, the release clock starts
}

bool CoordinatorCore::Complete(const JobRecord& j) {
  return j.world_size != 0 && j.registrations.size() == j.world_size && j.waiting == 0;
}

void CoordinatorCore::ResolveWaiters(const std::shared_ptr<const RankLayout>& layout) {
  for (const auto& w : layouts_.TakeWaiters(layout->fingerprint)) {
    auto j = jobs_.find(w.job);
    if (j == jobs_.end()) continue;
    auto r = j->second.registrations.find(w.rank);
    // Only the registration that waited: the rank may have registered otherwise since.
    if (r == j->second.registrations.end() || r->second.layout != nullptr ||
        r->second.registration_id != w.registration_id ||
        r->second.fingerprint != layout->fingerprint) {
      continue;
    }
    r->second.layout = layout;
    --j->second.waiting;
    ++j->second.registrations_version;
    j->second.plan_dirty = true;
    MaybePlan(w.job, j->second);
  }
}

void CoordinatorCore::MaybePlan(const std::string& job, JobRecord& j) {
  if (!j.plan_dirty) return;
  if (!Complete(j)) {
    // A registration changed and not every rank has registered again: until they have, nobody
    // skips anything (the old plan stays only to check steps already in flight under it).
    if (j.plan && !j.plan_revoked) {
      j.plan_revoked = true;
      for (const auto& node : j.nodes) SendPlan(job, j, node);
    }
    return;
  }
  if (j.plan_queued) return;  // the plan thread looks again when it is done
  j.plan_queued = true;
  ++plans_in_flight_;
  if (!plan_thread_.Post([this, job] { PlanJob(job); })) {
    j.plan_queued = false;  // stopping: registrations live in memory and go with the process
    --plans_in_flight_;
    cv_.NotifyAll();
  }
}

void CoordinatorCore::PlanJob(const std::string& job) {
  std::vector<PlanRank> inputs;
  std::shared_ptr<const WriterAssignment> previous;
  uint64_t version = 0;
  {
    MutexLock lock(mu_);
    auto it = jobs_.find(job);
    if (it == jobs_.end() || !it->second.plan_dirty || !Complete(it->second)) {
      if (it != jobs_.end()) it->second.plan_queued = false;
      --plans_in_flight_;
      cv_.NotifyAll();
      return;
    }
    JobRecord& j = it->second;
    inputs.reserve(j.registrations.size());
    for (const auto& [rank, r] : j.registrations)
      inputs.push_back(PlanRank{rank, r.node_id, r.layout});
    previous = j.plan;
    version = j.registrations_version;
  }
  const auto start = Clock::now();
  auto plan = PlanWriters(std::move(inputs), previous);
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  MutexLock lock(mu_);
  --plans_in_flight_;
  cv_.NotifyAll();
  JobRecord& j = jobs_[job];
  j.plan_queued = false;
  if (j.registrations_version != version) {
    MaybePlan(job, j);  // registrations changed while planning: plan them (or revoke)
    return;
  }
  j.plan = std::move(plan);
  j.plan_dirty = false;
  j.plan_revoked = false;
  ++j.plan_version;
  if (config_.on_plan) config_.on_plan(job, seconds);
  spdlog::info(
      "job '{}': writer plan v{} for {} ranks ({} distinct layouts, {} distinct shards): {} of {} "
      "registered bytes written, in {:.1f} ms{}",
      job, j.plan_version, j.plan->inputs.size(), j.plan->distinct_layouts, j.plan->distinct_shards,
      j.plan->unique_bytes, j.plan->registered_bytes, seconds * 1e3,
      j.plan == previous ? " (the previous plan, unchanged)" : "");
  for (const auto& node : j.nodes) SendPlan(job, j, node);
}

void CoordinatorCore::SendPlan(const std::string& job, JobRecord& j, const std::string& node) {
  auto n = nodes_.find(node);
  if (n == nodes_.end() || !n->second.sink || !j.plan) return;
  ckptd::v1::CoordinatorEvent e;
  auto* p = e.mutable_plan();
  p->set_job(job);
  p->set_version(j.plan_version);
  p->set_checks_skipped_under(true);
  auto on = j.ranks_by_node.find(node);
  if (!j.plan_revoked && on != j.ranks_by_node.end()) {  // revoked: every rank writes everything
    for (uint32_t rank : on->second) {
      const RankRecord& r = j.registrations.at(rank);
      // A daemon that sends no registration id predates the NodeManifest.skipped check: it
      // writes everything, which is always safe.
      if (r.registration_id == 0 || !r.layout) continue;
      // Only a rank whose registration the plan was computed from (the same layout on the same
      // node); one registered otherwise since writes everything until the next plan.
      const ptrdiff_t index = j.plan->IndexOf(rank);
      if (index < 0) continue;
      const PlanRank& planned = j.plan->inputs[static_cast<size_t>(index)];
      if (planned.layout != r.layout || planned.node_id != r.node_id) continue;
      auto* rs = p->add_ranks();
      rs->set_rank(rank);
      rs->set_registration_id(r.registration_id);
      rs->set_write_listed(true);
      for (uint32_t shard : j.plan->writes[static_cast<size_t>(index)]) {
        rs->add_write(r.layout->shards[shard].name);
      }
    }
  }
  n->second.sink->Send(e);
}

uint64_t CoordinatorCore::CommitsMergedAfresh() {
  MutexLock lock(mu_);
  return commits_merged_afresh_;
}

void CoordinatorCore::NoteSkippedLayouts(const JobRecord& j, StepRecord& s,
                                         const ckptd::v1::NodeManifest& m) {
  for (const auto& under : m.skipped_under()) {
    auto reg = j.registrations.find(under.rank());
    if (reg != j.registrations.end() && reg->second.registration_id == under.registration_id() &&
        reg->second.node_id == m.node_id() && reg->second.layout) {
      s.skipped_layouts.try_emplace(reg->second.layout.get(),
                                    SkippedLayout{reg->second.layout, under.rank()});
    } else {
      // The rank's trainer registered again since (or this coordinator restarted): its node
      // manifest file still lists what it skipped, and the commit checks that.
      s.skips_unresolved[m.node_id()].insert(under.rank());
    }
  }
  // A report sent again after a reconnect lists a memory-only step's skipped shards (it has no
  // file): ranks left unresolved by the node's earlier report are settled by the list, which
  // only a merge of every node's last report sees (the earlier one is merged without it).
  auto unresolved = s.skips_unresolved.find(m.node_id());
  if (unresolved == s.skips_unresolved.end()) return;
  for (const auto& k : m.skipped()) {
    if (unresolved->second.erase(k.rank()) > 0) s.merge_stale = true;
  }
  if (unresolved->second.empty()) s.skips_unresolved.erase(unresolved);
}

void CoordinatorCore::MergeAsReported(StepRecord& s,
                                      std::shared_ptr<const ckptd::v1::NodeManifest> m) {
  s.manifests.insert_or_assign(m->node_id(), m);
  if (s.merge_stale) return;
  // A node reports the step again each time another of its ranks persists, each manifest a
  // superset of the last: only the new ranks' part is merged (an older one arriving late was
  // set aside before: OlderReportOf). One that drops a rank it reported before is merged afresh,
  // with every node's last report, at the commit.
  std::vector<uint32_t> ranks;
  ranks.reserve(m->ranks_size());
  for (const auto& r : m->ranks()) ranks.push_back(r.rank());
  std::sort(ranks.begin(), ranks.end());
  std::vector<uint32_t>& merged = s.merged_ranks[m->node_id()];
  if (!std::includes(ranks.begin(), ranks.end(), merged.begin(), merged.end())) {
    s.merge_stale = true;
    return;
  }
  if (ranks == merged && !merged.empty()) return;  // sent again (a reconnect): nothing new
  if (!s.merge) s.merge = std::make_shared<MergeOnArena>(kCommitMergeOptions);
  // An error stays in the merger and ends the commit; a task not posted (stopping) leaves the
  // step to the next start's recovery scan.
  const bool posted = commit_thread_.Post([merge = s.merge, m = std::move(m), before = merged] {
    (void)merge->merger().Add(*m, before);
  });
  if (!posted) s.merge_stale = true;
  merged = std::move(ranks);
}

void CoordinatorCore::TryCommit(const std::string& job) {
  auto j = jobs_.find(job);
  if (j == jobs_.end()) return;
  for (auto& [n, s] : j->second.steps) {
    if (Terminal(s.state) || s.memory_only) continue;  // memory-only steps never commit
    // The oldest step in flight decides: later ones wait for it.
    if (s.state != ckptd::v1::STEP_STATE_PERSISTED || s.committing) return;
    s.committing = true;
    // The merge of the reports so far, queued before this task on the same thread; afresh
    // from every node's last report when one dropped a rank.
    CommitInputs in = TakeCommitInputs(s);
    if (!in.merge) ++commits_merged_afresh_;
    ++commits_in_flight_;
    const bool posted = commit_thread_.Post(
        [this, job, step = n, in = std::move(in)]() mutable { CommitStep(job, step, in); });
    if (!posted) {
      // Stopping: no commit now. The node manifests are on storage, so the next start's
      // recovery scan commits the step; until then it stays `committing` (not tried again).
      --commits_in_flight_;
      cv_.NotifyAll();
      spdlog::warn("{}: the coordinator is stopping; the commit is left to the next recovery scan",
                   StepName(job, n));
    }
    return;
  }
}

CoordinatorCore::CommitInputs CoordinatorCore::TakeCommitInputs(StepRecord& s) {
  CommitInputs in;
  in.merge = s.merge_stale ? nullptr : std::move(s.merge);
  if (!in.merge) {
    for (auto& [node, m] : s.manifests) in.nodes.push_back(std::move(m));
  }
  for (auto& [key, skipped] : s.skipped_layouts) in.skipped_layouts.push_back(std::move(skipped));
  in.skips_unresolved = std::move(s.skips_unresolved);
  s.skips_unresolved.clear();
  s.manifests.clear();
  s.merged_ranks.clear();
  s.merge.reset();
  s.skipped_layouts.clear();
  return in;
}

Status CoordinatorCore::FinishMerge(CommitInputs& in) {
  if (!in.merge) {
    in.merge = std::make_shared<MergeOnArena>(kCommitMergeOptions);
    for (const auto& m : in.nodes) {
      if (!in.merge->merger().Add(*m).ok()) break;  // Finish returns the error
    }
  }
  RETURN_IF_ERROR(in.merge->merger().Finish());
  return CheckSkippedLayoutsWritten(in.merge->merger(), in.skipped_layouts);
}

void CoordinatorCore::CommitStep(const std::string& job, uint64_t step, CommitInputs& in) {
  const std::string step_dir = StepDir(config_.storage_root, job, step);
  Status st = FinishMerge(in);
  if (st.ok()) st = CheckSkippedFromFiles(step_dir, in.skips_unresolved, in.merge->merger());
  if (st.ok()) st = commit_->CommitMerged(in.merge->manifest());
  if (!st.ok()) {
    // A failure after the MANIFEST rename still leaves a committed step: report the truth.
    auto exists = fs_->Exists(JoinPath(step_dir, std::string(kManifestFileName)));
    if (exists.ok() && *exists) {
      spdlog::warn("{}: committed, but: {}", StepName(job, step), st.ToString());
      st = Status::Ok();
    }
  }
  // Before the decision goes out, so a step heard as committed has no leftovers below it.
  if (st.ok()) RemoveUnreportedBelow(job, step);
  OnCommitted(job, step, st);
}

Status CoordinatorCore::CheckSkippedFromFiles(
    const std::string& step_dir, const std::map<std::string, std::set<uint32_t>>& unresolved,
    const ManifestMerger& merged) {
  for (const auto& [node, ranks] : unresolved) {
    const std::string path = JoinPath(step_dir, NodeManifestFileName(node));
    ASSIGN_OR_RETURN(ckptd::v1::NodeManifest file, ReadNodeManifest(fs_, path),
                     "checking the shards skipped by ranks of node '" + node + "'");
    for (const auto& k : file.skipped()) {
      if (ranks.count(k.rank()) == 0) continue;
      const std::span<const uint64_t> shape(k.global_shape().data(),
                                            static_cast<size_t>(k.global_shape_size()));
      if (merged.Wrote(DigestReplicaKey(ReplicaKey(k.name(), k.dtype(), shape, k.geometry())))) {
        continue;
      }
      return FailedPrecondition(
          "tensor '" + EscapeForLog(k.name()) + "': rank " + std::to_string(k.rank()) + " (node '" +
          node +
          "') left a shard to another rank under the writer plan, and no rank wrote it (the "
          "plan changed while the step was in flight); the next step uses one plan");
    }
  }
  return Status::Ok();
}

CoordinatorCore::StepRecord* CoordinatorCore::CommitTaskDone(const std::string& job,
                                                             uint64_t step) {
  --commits_in_flight_;
  cv_.NotifyAll();
  auto j = jobs_.find(job);
  if (j == jobs_.end()) return nullptr;
  auto it = j->second.steps.find(step);
  return it == j->second.steps.end() ? nullptr : &it->second;
}

void CoordinatorCore::OnCommitted(const std::string& job, uint64_t step, Status st) {
  MutexLock lock(mu_);
  StepRecord* s = CommitTaskDone(job, step);
  if (s == nullptr) return;
  s->committing = false;
  if (st.ok()) {
    Decide(job, step, *s, ckptd::v1::STEP_STATE_COMMITTED, "");
  } else {
    Decide(job, step, *s, ckptd::v1::STEP_STATE_FAILED, "commit failed: " + st.message());
  }
  Prune(jobs_[job]);
  TryCommit(job);
}

void CoordinatorCore::RemoveUnreportedBelow(const std::string& job, uint64_t committed) {
  auto uncommitted = ListUncommittedSteps(fs_, JobDir(config_.storage_root, job));
  if (!uncommitted.ok()) {
    spdlog::warn("job '{}': looking for unreported steps below step {}: {}", job, committed,
                 uncommitted.status().ToString());
    return;
  }
  std::vector<uint64_t> orphans;
  {
    MutexLock lock(mu_);
    JobRecord& j = jobs_[job];
    for (uint64_t step : *uncommitted) {
      if (step >= committed) break;
      auto known = j.steps.find(step);
      if (known != j.steps.end() && !Terminal(known->second.state)) continue;  // a late report
      // Recorded before the removal, so a report arriving meanwhile hears ABORTED instead of
      // starting the step afresh in a directory being removed.
      if (config_.refuse_recovered_steps) j.recovered_aborted.insert(step);
      orphans.push_back(step);
    }
  }
  for (uint64_t step : orphans) {
    const Status removed = commit_->RemoveStep(job, step);
    if (removed.ok()) {
      spdlog::warn("{}: removed: no daemon reported it and step {} committed after it",
                   StepName(job, step), committed);
    } else {
      spdlog::warn("{}: unreported step below committed step {}: {}", StepName(job, step),
                   committed, removed.ToString());
    }
  }
}

void CoordinatorCore::Prune(JobRecord& j) {
  size_t finished = 0;
  for (const auto& [n, s] : j.steps) finished += Terminal(s.state) ? 1 : 0;
  for (auto it = j.steps.begin(); it != j.steps.end() && finished > config_.finished_steps_kept;) {
    if (Terminal(it->second.state)) {
      it = j.steps.erase(it);
      --finished;
    } else {
      ++it;
    }
  }
}

Status CoordinatorCore::NoteReplicated(const ckptd::v1::ReportRanksRequest& req, StepRecord& s) {
  if (s.world_size != req.world_size()) {
    return InvalidArgument(StepName(req.job(), req.step()) + ": world size " +
                           std::to_string(req.world_size()) + " differs from the step's " +
                           std::to_string(s.world_size));
  }
  if (req.reason().empty()) {
    for (uint32_t r : req.ranks()) {
      s.replica_holders[r].assign(req.holders().begin(), req.holders().end());
    }
  }
  if (s.replication_decided) return Status::Ok();
  if (!req.reason().empty()) {
    std::vector<uint32_t> ranks(req.ranks().begin(), req.ranks().end());
    const std::string reason = "rank(s) " + RankList(ranks) + " on node '" +
                               EscapeForLog(req.node_id()) + "' not replicated: " + req.reason();
    spdlog::info("{}: not replicated: {}", StepName(req.job(), req.step()), reason);
    DecideNotReplicated(req.job(), req.step(), s, reason);
    return Status::Ok();
  }
  s.replicated.insert(req.ranks().begin(), req.ranks().end());
  if (s.replicated.size() < s.world_size) return Status::Ok();
  if (s.memory_only) {
    MaybeEndMemoryOnly(req.job(), req.step(), s);
  } else {
    DecideReplication(req.job(), s, ReplicationEvent(req.job(), req.step()));
  }
  return Status::Ok();
}

void CoordinatorCore::DecideNotReplicated(const std::string& job, uint64_t step, StepRecord& s,
                                          const std::string& reason) {
  if (s.memory_only) {
    FailMemoryOnly(job, step, s, reason);
  } else {
    DecideReplication(job, s, ReplicationEvent(job, step, reason));
  }
}

void CoordinatorCore::DecideReplication(const std::string& job, StepRecord& s,
                                        const ckptd::v1::CoordinatorEvent& e) {
  s.replication_decided = true;
  s.replication = e.step();
  if (auto j = jobs_.find(job); j != jobs_.end()) {
    for (const auto& node : j->second.nodes) {
      auto n = nodes_.find(node);
      if (n != nodes_.end() && n->second.sink) s.told_replication.insert(node);
    }
  }
  Broadcast(job, e);
}

void CoordinatorCore::FinishMemoryOnly(const std::string& job, uint64_t step, StepRecord& s) {
  if (s.finishing_in_memory || s.memory_manifest || Terminal(s.state)) return;
  s.finishing_in_memory = true;
  CommitInputs in = TakeCommitInputs(s);
  ++commits_in_flight_;
  if (!commit_thread_.Post(
          [this, job, step, in = std::move(in)]() mutable { FinishInMemory(job, step, in); })) {
    --commits_in_flight_;  // stopping: the step dies with this process
    cv_.NotifyAll();
  }
}

void CoordinatorCore::FinishInMemory(const std::string& job, uint64_t step, CommitInputs& in) {
  Status st = FinishMerge(in);
  if (st.ok() && !in.skips_unresolved.empty()) {
    // Their lists are in node manifest files, which a memory-only step does not write.
    st = FailedPrecondition(
        "ranks skipped shards under a writer plan this coordinator no longer holds; the next "
        "step uses one plan");
  }
  std::shared_ptr<ckptd::v1::Manifest> manifest;
  if (st.ok()) {
    manifest = std::make_shared<ckptd::v1::Manifest>(in.merge->manifest());
    manifest->set_writer(config_.writer);
    st = CommitEngine::CheckCommittable(*manifest);
  }
  MutexLock lock(mu_);
  StepRecord* s = CommitTaskDone(job, step);
  if (s == nullptr) return;
  s->finishing_in_memory = false;
  if (Terminal(s->state)) return;
  if (!st.ok()) {
    FailMemoryOnly(job, step, *s, "its manifest: " + st.message());
    return;
  }
  s->memory_manifest = std::move(manifest);
  MaybeEndMemoryOnly(job, step, *s);
}

void CoordinatorCore::MaybeEndMemoryOnly(const std::string& job, uint64_t step, StepRecord& s) {
  if (!s.memory_only || Terminal(s.state) || !s.memory_manifest ||
      s.replicated.size() < s.world_size) {
    return;
  }
  s.state = ckptd::v1::STEP_STATE_REPLICATED;
  s.reason.clear();
  spdlog::info(
      "{}: replicated (memory-only: every rank is held in memory by its node and its "
      "holders)",
      StepName(job, step));
  if (config_.on_step_state) config_.on_step_state(job, step, s.state, "");
  DecideReplication(job, s, ReplicationEvent(job, step));
  if (auto j = jobs_.find(job); j != jobs_.end()) Prune(j->second);
}

void CoordinatorCore::FailMemoryOnly(const std::string& job, uint64_t step, StepRecord& s,
                                     const std::string& reason) {
  if (Terminal(s.state)) return;
  // Waiters for REPLICATED hear why first (FAILED_PRECONDITION, as for a persisted step), then
  // the step fails: without its copies it restores from nowhere.
  if (!s.replication_decided) DecideReplication(job, s, ReplicationEvent(job, step, reason));
  s.memory_manifest.reset();
  Decide(job, step, s, ckptd::v1::STEP_STATE_FAILED, "memory-only step not replicated: " + reason);
}

std::optional<uint64_t> CoordinatorCore::RestorableNow(const std::string& job,
                                                       std::optional<uint64_t> committed) {
  auto j = jobs_.find(job);
  if (j == jobs_.end()) return committed;
  // A holder keeps the newest two steps of a file that reached it whole (replicator.h): only
  // the newest two replicated steps of the job are candidates.
  int candidates = 0;
  for (auto it = j->second.steps.rbegin(); it != j->second.steps.rend() && candidates < 2; ++it) {
    const StepRecord& s = it->second;
    if (!s.replication_decided || s.replication.not_replicated()) continue;
    ++candidates;
    if (committed && it->first <= *committed) break;
    if (s.state != ckptd::v1::STEP_STATE_REPLICATED) continue;  // memory-only steps only
    const auto held = HeldInMemoryLocked(job, it->first, /*reachable=*/false);
    bool every_rank = true;
    for (uint32_t r = 0; r < s.world_size && every_rank; ++r) {
      every_rank = held.count(DataFileName(r)) != 0;
    }
    if (every_rank) return it->first;
  }
  return committed;
}

Result<std::shared_ptr<const ckptd::v1::Manifest>> CoordinatorCore::StepManifest(
    const std::string& job, uint64_t step) {
  RETURN_IF_ERROR(ValidateJobName(job));
  MutexLock lock(mu_);
  auto j = jobs_.find(job);
  if (j != jobs_.end()) {
    NoteActivity(j->second);
    auto s = j->second.steps.find(step);
    if (s != j->second.steps.end() && s->second.memory_manifest && !j->second.ReleasedStep(step) &&
        s->second.state == ckptd::v1::STEP_STATE_REPLICATED) {
      return s->second.memory_manifest;
    }
  }
  return NotFound(StepName(job, step) +
                  " is not a replicated memory-only step this coordinator holds (never saved "
                  "with persist=False, failed, too old, released after its job ended, or the "
                  "coordinator restarted)");
}

void CoordinatorCore::TimerLoop() {
  MutexLock lock(mu_);
  while (!stopping_) {
    const auto now = Clock::now();
    auto next = now + std::chrono::seconds(1);
    std::vector<std::string> lost;
    for (auto& [id, n] : nodes_) {
      if (!n.lost_at) continue;
      if (*n.lost_at <= now) {
        lost.push_back(id);
      } else {
        next = std::min(next, *n.lost_at);
      }
    }
    for (const auto& id : lost) {
      nodes_[id].lost_at.reset();
      LoseNode(id, "its lease of " + std::to_string(config_.lease.count()) + " ms expired");
    }
    for (const auto& [fingerprint, w] : layouts_.OverdueAsks(now)) {
      auto n = nodes_.find(w.node_id);
      if (n == nodes_.end() || !n->second.sink) continue;  // asked again at the next deadline
      spdlog::info("job '{}': layout {} asked again, of rank {} on node '{}'", w.job,
                   fingerprint.ToHex(), w.rank, w.node_id);
      ckptd::v1::CoordinatorEvent e;
      auto* l = e.mutable_layout();
      l->set_job(w.job);
      l->set_rank(w.rank);
      l->set_registration_id(w.registration_id);
      l->set_layout_fingerprint(fingerprint.ToBytes());
      n->second.sink->Send(e);
    }
    if (auto due = layouts_.NextDeadline()) next = std::min(next, *due);
    if (auto replan = holders_.TakeDue(now)) PostHolderPlan(std::move(*replan));
    if (auto due = holders_.due()) next = std::min(next, *due);
    ReleaseIdleJobs(now, &next);
    for (auto& [job, j] : jobs_) {
      for (auto& [step, s] : j.steps) {
        if (!s.replication_decided && s.state != ckptd::v1::STEP_STATE_ABORTED &&
            s.state != ckptd::v1::STEP_STATE_FAILED) {
          // Counted from the step's last report: capture and persist do not eat into it.
          const auto replication_deadline = s.last_report + config_.step_timeout;
          if (replication_deadline <= now) {
            std::vector<uint32_t> missing;
            for (uint32_t r = 0; r < s.world_size; ++r) {
              if (s.replicated.count(r) == 0) missing.push_back(r);
            }
            DecideNotReplicated(job, step, s,
                                "rank(s) " + RankList(missing) + " not replicated within " +
                                    std::to_string(config_.step_timeout.count()) + " ms");
          } else {
            next = std::min(next, replication_deadline);
          }
        }
        if (Terminal(s.state) || s.committing || s.state == ckptd::v1::STEP_STATE_PERSISTED ||
            (s.memory_only && s.persisted.size() == s.world_size)) {
          continue;  // ends at its commit, or (memory-only) at its replication's deadline above
        }
        if (s.deadline <= now) {
          Decide(job, step, s, ckptd::v1::STEP_STATE_ABORTED,
                 "not every rank persisted within " + std::to_string(config_.step_timeout.count()) +
                     " ms; " + MissingRanks(s));
        } else {
          next = std::min(next, s.deadline);
        }
      }
    }
    cv_.WaitUntil(mu_, next);
  }
}

void CoordinatorCore::ReleaseIdleJobs(Clock::time_point now, Clock::time_point* next) {
  if (config_.peer_job_ttl.count() <= 0) return;
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    const std::string& job = it->first;
    JobRecord& j = it->second;
    if (!j.registrations.empty() || j.released) {
      ++it;
      continue;
    }
    // Restoring (a restore point stands until training resumes or the restart dies) is live
    // though nothing registered yet: ranks register with their first save.
    if (!j.idle_since || restore_points_.Pinned(job)) j.idle_since = now;
    const auto due = *j.idle_since + config_.peer_job_ttl;
    if (due > now) {
      *next = std::min(*next, due);
      ++it;
      continue;
    }
    Release(job, j,
            "no rank of the job registered for " + std::to_string(config_.peer_job_ttl.count()) +
                " ms (--peer-job-ttl)");
    // A job learned of only from a holder's list leaves no record: it ends here.
    const bool orphan = j.steps.empty() && j.nodes.empty() && j.recovered_aborted.empty() &&
                        !j.plan && j.world_size == 0;
    it = orphan ? jobs_.erase(it) : std::next(it);
  }
}

void CoordinatorCore::NoteActivity(JobRecord& j) {
  if (j.registrations.empty()) j.idle_since = Clock::now();
}

ckptd::v1::JobReleased CoordinatorCore::Release(const std::string& job, JobRecord& j,
                                                const std::string& reason) {
  j.released = true;
  // What this coordinator counts no more: the steps it knows. Nodes drop what they hold up to
  // the newest step any of them said it holds too (a node's word never widens what is counted).
  uint64_t known = j.released_through.value_or(0);
  if (!j.steps.empty()) known = std::max(known, j.steps.rbegin()->first);
  j.released_through = known;
  const uint64_t through = std::max(known, j.held_through);
  size_t memory_only = 0;
  for (auto& [n, s] : j.steps) {
    if (!s.memory_only) continue;
    if (!Terminal(s.state)) {
      FailMemoryOnly(job, n, s, "the job's copies in memory were released: " + reason);
    } else if (s.memory_manifest) {
      s.memory_manifest.reset();  // not restorable any more: StepManifest answers NOT_FOUND
      ++memory_only;
    }
  }
  const ckptd::v1::CoordinatorEvent e = ReleasedEvent(job, through, reason);
  size_t told = 0;
  for (auto& [id, n] : nodes_) {
    if (!n.sink) continue;  // told when it attaches again
    n.sink->Send(e);
    ++told;
  }
  spdlog::info(
      "job '{}' released: its copies in memory through step {} no longer count ({} memory-only "
      "step(s) not restorable any more); {} node(s) told to drop them: {}",
      job, through, memory_only, told, reason);
  return e.released();
}

Result<ckptd::v1::JobReleased> CoordinatorCore::ReleaseJob(const std::string& job) {
  RETURN_IF_ERROR(ValidateJobName(job));
  MutexLock lock(mu_);
  auto j = jobs_.find(job);
  if (j == jobs_.end()) return NotFound("job '" + job + "' is not known to this coordinator");
  if (!j->second.registrations.empty()) {
    return FailedPrecondition("job '" + job + "' has " +
                              std::to_string(j->second.registrations.size()) +
                              " rank(s) registered: its trainers run, and their restores may "
                              "need its copies in memory");
  }
  if (restore_points_.Pinned(job)) {
    return FailedPrecondition("job '" + job +
                              "' is restoring (its ranks asked for a restore point and have not "
                              "saved since): the restore may need its copies in memory");
  }
  return Release(job, j->second, "released by an operator");
}

Result<CoordinatorCore::MemoryStepView> CoordinatorCore::DescribeMemoryOnly(const std::string& job,
                                                                            uint64_t step) {
  MemoryStepView out;
  ASSIGN_OR_RETURN(out.manifest, StepManifest(job, step));
  MutexLock lock(mu_);
  const auto held = HeldInMemoryLocked(job, step, /*reachable=*/false);
  out.copies.resize(out.manifest->world_size());
  for (uint32_t r = 0; r < out.manifest->world_size(); ++r) {
    if (auto it = held.find(DataFileName(r)); it != held.end()) {
      for (const auto& [node, address] : it->second) out.copies[r].push_back(node);
    }
  }
  return out;
}

CoordinatorCore::Snapshot CoordinatorCore::TakeSnapshot() {
  Snapshot out;
  MutexLock lock(mu_);
  for (const auto& [name, j] : jobs_) {
    for (const auto& [n, s] : j.steps) {
      if (Terminal(s.state)) continue;
      out.steps.push_back(StepView{name, n, s.world_size, s.state, s.saved, s.captured, s.persisted,
                                   s.first_report});
    }
  }
  for (const auto& [name, j] : jobs_) {
    if (j.world_size == 0) continue;
    PlanView v;
    v.job = name;
    v.world_size = j.world_size;
    v.ranks_registered = static_cast<uint32_t>(j.registrations.size());
    v.version = j.plan_version;
    v.in_force = j.plan && !j.plan_revoked && !j.plan_dirty;
    v.ranks_waiting = j.waiting;
    if (j.plan) {
      v.unique_bytes = j.plan->unique_bytes;
      v.registered_bytes = j.plan->registered_bytes;
      v.distinct_layouts = j.plan->distinct_layouts;
      v.distinct_shards = j.plan->distinct_shards;
    }
    out.plans.push_back(std::move(v));
  }
  out.layouts_known = layouts_.live_layouts();
  for (const auto& [id, node] : nodes_) {
    NodeView v;
    v.node_id = id;
    v.attached = node.sink != nullptr;
    v.lease_expires = node.lost_at;
    v.epoch = node.epoch;
    v.lost = node.lost;
    for (const auto& [name, j] : jobs_) {
      if (j.nodes.count(id) != 0) v.jobs.push_back(name);
    }
    out.nodes.push_back(std::move(v));
  }
  return out;
}

Result<std::optional<uint64_t>> CoordinatorCore::Latest(const std::string& job) {
  RETURN_IF_ERROR(ValidateJobName(job));
  ASSIGN_OR_RETURN(auto committed, commit_->Latest(job));
  MutexLock lock(mu_);
  return RestorableNow(job, committed);
}

Result<std::optional<uint64_t>> CoordinatorCore::RestorePoint(const std::string& job, uint32_t rank,
                                                              uint32_t world_size,
                                                              const std::string& session) {
  RETURN_IF_ERROR(ValidateJobName(job));
  if (world_size == 0 || rank >= world_size) {
    return InvalidArgument("restore point of job '" + job + "': rank " + std::to_string(rank) +
                           " is not below world size " + std::to_string(world_size));
  }
  {
    MutexLock lock(mu_);
    if (auto pinned = restore_points_.Find(job, rank, world_size, session)) return *pinned;
  }
  // Resolved outside the lock (a storage read); a concurrent first answer wins in Pin.
  ASSIGN_OR_RETURN(auto latest, commit_->Latest(job));
  MutexLock lock(mu_);
  std::set<uint64_t> known;
  if (auto j = jobs_.find(job); j != jobs_.end()) {
    NoteActivity(j->second);
    for (const auto& [n, s] : j->second.steps) known.insert(n);
  }
  return restore_points_.Pin(job, rank, world_size, session, RestorableNow(job, latest),
                             std::move(known));
}

Result<std::vector<uint64_t>> CoordinatorCore::List(const std::string& job) {
  RETURN_IF_ERROR(ValidateJobName(job));
  return commit_->List(job);
}

std::shared_ptr<const WriterAssignment> CoordinatorCore::CurrentPlan(const std::string& job) {
  MutexLock lock(mu_);
  auto j = jobs_.find(job);
  if (j == jobs_.end()) return nullptr;
  return j->second.plan;
}

void CoordinatorCore::WaitIdle() {
  MutexLock lock(mu_);
  cv_.Wait(mu_, [&]() REQUIRES(mu_) { return commits_in_flight_ == 0 && plans_in_flight_ == 0; });
}

}  // namespace ckpt
