#include "daemon/coordinator/commit_engine.h"

#include <chrono>

#include "common/atomic_file.h"
#include "common/logging.h"
#include "common/manifest_io.h"
#include "common/manifest_merge.h"
#include "common/names.h"
#include "common/step_layout.h"

namespace ckpt {

Result<std::vector<std::string>> CommitEngine::RemoveUncommitted() {
  std::vector<std::string> removed;
  auto jobs = fs_->ListDir(config_.storage_root);
  if (!jobs.ok()) {
    if (jobs.status().code() == StatusCode::kNotFound) return removed;
    return jobs.status();
  }
  for (const auto& job : *jobs) {
    const std::string job_dir = JobDir(config_.storage_root, job);
    auto entries = fs_->ListDir(job_dir);
    if (!entries.ok()) continue;  // a plain file in the root: not ours
    for (const auto& name : *entries) {
      if (name.ends_with(".tmp")) {
        RETURN_IF_ERROR(fs_->RemoveAll(JoinPath(job_dir, name)));
        removed.push_back(JoinPath(job_dir, name));
      }
    }
    ASSIGN_OR_RETURN(auto steps, ListUncommittedSteps(fs_, job_dir));
    for (uint64_t step : steps) {
      const std::string dir = StepDir(config_.storage_root, job, step);
      RETURN_IF_ERROR(fs_->RemoveAll(dir));
      removed.push_back(dir);
    }
    if (!steps.empty()) RETURN_IF_ERROR(fs_->SyncDir(job_dir));
  }
  return removed;
}

Status CommitEngine::Commit(std::span<const ckptd::v1::NodeManifest> nodes,
                            const ManifestCheck& check) {
  MergeOnArena merge;
  for (const auto& n : nodes) RETURN_IF_ERROR(merge.merger().Add(n));
  RETURN_IF_ERROR(merge.merger().Finish());
  return CommitMerged(merge.manifest(), check);
}

Status CommitEngine::CheckCommittable(const ckptd::v1::Manifest& merged) {
  if (static_cast<uint32_t>(merged.ranks_size()) != merged.world_size()) {
    return FailedPrecondition(std::to_string(merged.ranks_size()) + " of " +
                              std::to_string(merged.world_size()) + " ranks reported");
  }
  return ValidateManifestForCommit(merged);
}

Status CommitEngine::CommitMerged(ckptd::v1::Manifest& manifest, const ManifestCheck& check) {
  const std::string job = manifest.job();
  const uint64_t step = manifest.step();
  const std::string ctx = "committing job '" + job + "' step " + std::to_string(step);
  manifest.set_created_unix_ms(
      static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                std::chrono::system_clock::now().time_since_epoch())
                                .count()));
  manifest.set_writer(config_.writer);
  RETURN_IF_ERROR(CheckCommittable(manifest), ctx);
  if (check) RETURN_IF_ERROR(check(manifest), ctx);

  const std::string job_dir = JobDir(config_.storage_root, job);
  const std::string step_dir = StepDir(config_.storage_root, job, step);
  // The data files and node manifests are durable; make their directory entries durable
  // before the MANIFEST can point at them.
  RETURN_IF_ERROR(fs_->SyncDir(step_dir), ctx);
  if (config_.on_point) config_.on_point("before-manifest");
  RETURN_IF_ERROR(WriteFileAtomically(fs_, JoinPath(step_dir, std::string(kManifestFileName)),
                                      EncodeManifest(manifest)),
                  ctx);
  // The step directory's own entry in the job directory.
  RETURN_IF_ERROR(fs_->SyncDir(job_dir), ctx);
  if (config_.on_point) config_.on_point("after-manifest");
  // LATEST only moves forward.
  ASSIGN_OR_RETURN(auto latest, ResolveLatest(fs_, job_dir), ctx);
  if (!latest || *latest <= step) {
    RETURN_IF_ERROR(WriteFileAtomically(fs_, JoinPath(job_dir, std::string(kLatestFileName)),
                                        std::to_string(step) + "\n"),
                    ctx);
  }
  if (config_.on_point) config_.on_point("after-latest");
  Status retention = ApplyRetention(job);
  if (!retention.ok()) {
    // The commit stands; a retention failure only leaves an old step behind.
    spdlog::warn("job '{}': retention after step {}: {}", job, step, retention.ToString());
  }
  return Status::Ok();
}

std::vector<uint64_t> CommitEngine::RetentionVictims(const std::vector<uint64_t>& committed,
                                                     const std::set<uint64_t>& pinned,
                                                     const std::set<uint64_t>& held, uint32_t keep,
                                                     uint32_t keep_every) {
  if (keep == 0 || committed.empty()) return {};
  // The rolling window: every committed step but the milestones and the pinned ones.
  std::vector<uint64_t> window;
  for (uint64_t step : committed) {
    const bool milestone = keep_every != 0 && step % keep_every == 0;
    if (!milestone && pinned.count(step) == 0) window.push_back(step);
  }
  if (window.size() <= keep) return {};
  size_t excess = window.size() - keep;
  std::vector<uint64_t> victims;
  for (uint64_t step : window) {
    if (excess == 0) break;
    if (step == committed.back()) break;  // never the newest committed step
    if (held.count(step) != 0) continue;  // being loaded: the next one goes instead
    victims.push_back(step);
    --excess;
  }
  return victims;
}

Result<bool> CommitEngine::IsPinned(const std::string& job, uint64_t step) const {
  return IsPinnedStep(fs_, StepDir(config_.storage_root, job, step));
}

Status CommitEngine::RemoveStepDir(const std::string& job, uint64_t step) {
  const std::string dir = StepDir(config_.storage_root, job, step);
  RETURN_IF_ERROR(fs_->SyncDir(dir));
  return fs_->RemoveAll(dir);
}

Status CommitEngine::ApplyRetention(const std::string& job) {
  if (config_.keep == 0) return Status::Ok();
  const std::string job_dir = JobDir(config_.storage_root, job);
  const std::string ctx = "retention of job '" + job + "'";
  ASSIGN_OR_RETURN(auto committed, ListCommittedSteps(fs_, job_dir), ctx);
  if (committed.size() <= config_.keep) return Status::Ok();
  // The markers are read without the lock (one Exists per committed step, none of it on the
  // load path's mutex); a pin written since is seen by the re-check of the victims below.
  std::set<uint64_t> pinned;
  for (uint64_t step : committed) {
    ASSIGN_OR_RETURN(bool is_pinned, IsPinned(job, step), ctx);
    if (is_pinned) pinned.insert(step);
  }
  std::vector<uint64_t> victims;
  {
    // The MANIFEST removals are one step with the load holds (Pin/PinLatest) and the operator
    // pins (PinForOperator checks its step's MANIFEST under mu_ after writing the marker): a
    // step is held or pinned either before (it stays) or after (its MANIFEST is gone: the load
    // or the pin says so), never in between with the step's files going away under it.
    MutexLock lock(mu_);
    std::set<uint64_t> held;
    for (auto it = pins_.lower_bound({job, 0}); it != pins_.end() && it->first.first == job; ++it) {
      held.insert(it->first.second);
    }
    for (uint64_t step :
         RetentionVictims(committed, pinned, held, config_.keep, config_.keep_every)) {
      const std::string dir = StepDir(config_.storage_root, job, step);
      const std::string what = ctx + ", step " + std::to_string(step);
      ASSIGN_OR_RETURN(bool still_committed,
                       fs_->Exists(JoinPath(dir, std::string(kManifestFileName))), what);
      if (!still_committed) continue;  // deleted meanwhile: its remover removes the rest
      ASSIGN_OR_RETURN(bool pinned_now, IsPinned(job, step), what);
      if (pinned_now) continue;  // pinned since the markers were read
      // MANIFEST first: from then on the step is merely an uncommitted leftover.
      RETURN_IF_ERROR(fs_->Remove(JoinPath(dir, std::string(kManifestFileName))), what);
      victims.push_back(step);
    }
  }
  // Outside the lock: the MANIFEST is gone, so no load, pin or delete touches these any more.
  for (uint64_t step : victims) {
    RETURN_IF_ERROR(RemoveStepDir(job, step), ctx + ", step " + std::to_string(step));
    spdlog::info("job '{}': retention removed step {} (keep {}, keep-every {})", job, step,
                 config_.keep, config_.keep_every);
  }
  return victims.empty() ? Status::Ok() : fs_->SyncDir(job_dir);
}

Status CommitEngine::RequireCommitted(const std::string& job, uint64_t step, const std::string& dir,
                                      const std::string& what) {
  ASSIGN_OR_RETURN(bool committed, fs_->Exists(JoinPath(dir, std::string(kManifestFileName))),
                   what);
  if (!committed) {
    return NotFound(what + ": no committed step " + std::to_string(step) + " of job '" + job +
                    "' (no MANIFEST in " + dir + ")");
  }
  return Status::Ok();
}

Status CommitEngine::PinForOperator(const std::string& job, uint64_t step) {
  const std::string what = "pin of job '" + job + "' step " + std::to_string(step);
  RETURN_IF_ERROR(ValidateJobName(job), what);
  const std::string dir = StepDir(config_.storage_root, job, step);
  RETURN_IF_ERROR(RequireCommitted(job, step, dir, what));
  const std::string marker = JoinPath(dir, std::string(kPinnedFileName));
  const auto now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  // Written without the lock (two fsyncs); then, under mu_, the step must still be committed.
  // Retention re-reads a victim's marker under mu_ before removing its MANIFEST, so either it
  // saw the marker (the step stays) or the MANIFEST was gone before this check (the pin fails,
  // and its marker goes with the step's directory).
  RETURN_IF_ERROR(WriteFileAtomically(fs_, marker,
                                      "pinned by the operator at unix ms " +
                                          std::to_string(now_ms) + " (" + config_.writer + ")\n"),
                  what);
  {
    MutexLock lock(mu_);
    RETURN_IF_ERROR(RequireCommitted(job, step, dir, what));
  }
  spdlog::info("job '{}': step {} pinned by the operator", job, step);
  return Status::Ok();
}

Status CommitEngine::UnpinForOperator(const std::string& job, uint64_t step) {
  const std::string what = "unpin of job '" + job + "' step " + std::to_string(step);
  RETURN_IF_ERROR(ValidateJobName(job), what);
  const std::string dir = StepDir(config_.storage_root, job, step);
  MutexLock lock(mu_);
  RETURN_IF_ERROR(RequireCommitted(job, step, dir, what));
  ASSIGN_OR_RETURN(bool pinned, IsPinned(job, step), what);
  if (!pinned) return FailedPrecondition(what + ": the step is not pinned");
  RETURN_IF_ERROR(fs_->Remove(JoinPath(dir, std::string(kPinnedFileName))), what);
  RETURN_IF_ERROR(fs_->SyncDir(dir), what);
  spdlog::info("job '{}': step {} unpinned by the operator", job, step);
  return Status::Ok();
}

Status CommitEngine::DeleteCommitted(const std::string& job, uint64_t step) {
  const std::string what = "delete of job '" + job + "' step " + std::to_string(step);
  RETURN_IF_ERROR(ValidateJobName(job), what);
  const std::string job_dir = JobDir(config_.storage_root, job);
  const std::string dir = StepDir(config_.storage_root, job, step);
  // Before the lock: a step that is not the newest now never becomes the newest.
  ASSIGN_OR_RETURN(auto steps, ListCommittedSteps(fs_, job_dir), what);
  {
    MutexLock lock(mu_);
    ASSIGN_OR_RETURN(bool committed, fs_->Exists(JoinPath(dir, std::string(kManifestFileName))),
                     what);
    if (!committed) {
      ASSIGN_OR_RETURN(bool exists, fs_->Exists(dir), what);
      if (!exists) return NotFound(what + ": no such step (" + dir + " does not exist)");
      return FailedPrecondition(what +
                                ": the step is not committed (in flight, or being "
                                "removed); only committed steps can be deleted");
    }
    if (!steps.empty() && steps.back() == step) {
      return FailedPrecondition(what +
                                ": it is the newest committed step of the job, which is "
                                "never deleted (restores would fall back to an older one)");
    }
    ASSIGN_OR_RETURN(bool pinned, IsPinned(job, step), what);
    if (pinned) return FailedPrecondition(what + ": the step is pinned; unpin it first");
    if (pins_.count({job, step}) != 0) {
      return FailedPrecondition(what + ": a load is reading the step; try again once it ended");
    }
    // MANIFEST first: from then on the step is merely an uncommitted leftover.
    RETURN_IF_ERROR(fs_->Remove(JoinPath(dir, std::string(kManifestFileName))), what);
  }
  RETURN_IF_ERROR(RemoveStepDir(job, step), what);
  RETURN_IF_ERROR(fs_->SyncDir(job_dir), what);
  spdlog::info("job '{}': step {} deleted by the operator", job, step);
  return Status::Ok();
}

Result<std::vector<uint64_t>> CommitEngine::ListPinned(const std::string& job) const {
  RETURN_IF_ERROR(ValidateJobName(job), "pinned steps of job '" + job + "'");
  std::vector<uint64_t> out;
  ASSIGN_OR_RETURN(auto steps, ListCommittedSteps(fs_, JobDir(config_.storage_root, job)));
  for (uint64_t step : steps) {
    ASSIGN_OR_RETURN(bool pinned, IsPinned(job, step));
    if (pinned) out.push_back(step);
  }
  return out;
}

Status CommitEngine::RemoveStep(const std::string& job, uint64_t step) {
  const std::string dir = StepDir(config_.storage_root, job, step);
  ASSIGN_OR_RETURN(bool committed, fs_->Exists(JoinPath(dir, std::string(kManifestFileName))));
  if (committed) {
    return FailedPrecondition("job '" + job + "' step " + std::to_string(step) +
                              " is committed; refusing to remove it as a failed step");
  }
  return fs_->RemoveAll(dir);
}

Result<std::optional<uint64_t>> CommitEngine::Latest(const std::string& job) const {
  return ResolveReadableLatest(fs_, JobDir(config_.storage_root, job));
}

Result<std::vector<uint64_t>> CommitEngine::List(const std::string& job) const {
  return ListCommittedSteps(fs_, JobDir(config_.storage_root, job));
}

Result<std::optional<uint64_t>> CommitEngine::PinLatest(const std::string& job) {
  MutexLock lock(mu_);
  ASSIGN_OR_RETURN(auto latest, ResolveReadableLatest(fs_, JobDir(config_.storage_root, job)));
  if (latest) ++pins_[{job, *latest}];
  return latest;
}

void CommitEngine::Pin(const std::string& job, uint64_t step) {
  MutexLock lock(mu_);
  ++pins_[{job, step}];
}

void CommitEngine::Unpin(const std::string& job, uint64_t step) {
  MutexLock lock(mu_);
  auto it = pins_.find({job, step});
  if (it != pins_.end() && --it->second == 0) pins_.erase(it);
}

}  // namespace ckpt
