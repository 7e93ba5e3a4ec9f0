#include "daemon/coordinator/commit_engine.h"

#include <chrono>

#include "common/atomic_file.h"
#include "common/logging.h"
#include "common/manifest_io.h"
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

Result<ckptd::v1::Manifest> CommitEngine::Commit(std::span<const ckptd::v1::NodeManifest> nodes,
                                                 const ManifestCheck& check) {
  ASSIGN_OR_RETURN(ckptd::v1::Manifest manifest, MergeNodeManifests(nodes));
  const std::string job = manifest.job();
  const uint64_t step = manifest.step();
  const std::string ctx = "committing job '" + job + "' step " + std::to_string(step);
  if (static_cast<uint32_t>(manifest.ranks_size()) != manifest.world_size()) {
    return FailedPrecondition(ctx + ": " + std::to_string(manifest.ranks_size()) + " of " +
                              std::to_string(manifest.world_size()) + " ranks reported");
  }
  manifest.set_created_unix_ms(
      static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                std::chrono::system_clock::now().time_since_epoch())
                                .count()));
  manifest.set_writer(config_.writer);
  RETURN_IF_ERROR(ValidateManifest(manifest), ctx);
  RETURN_IF_ERROR(CheckManifestCoverage(manifest), ctx);
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
  return manifest;
}

Status CommitEngine::ApplyRetention(const std::string& job) {
  if (config_.keep == 0) return Status::Ok();
  const std::string job_dir = JobDir(config_.storage_root, job);
  ASSIGN_OR_RETURN(auto committed, ListCommittedSteps(fs_, job_dir));
  if (committed.size() <= config_.keep) return Status::Ok();
  size_t excess = committed.size() - config_.keep;
  for (size_t i = 0; i + 1 < committed.size() && excess > 0; ++i) {  // never the newest
    const uint64_t step = committed[i];
    const std::string dir = StepDir(config_.storage_root, job, step);
    {
      // The pin check and the MANIFEST removal are one step for Pin/PinLatest: a load pins
      // either before (the step stays) or after (it finds no MANIFEST and says so), never in
      // between with the step's files going away under it.
      MutexLock lock(mu_);
      if (pins_.count({job, step}) != 0) continue;
      // MANIFEST first: from then on the step is merely an uncommitted leftover.
      RETURN_IF_ERROR(fs_->Remove(JoinPath(dir, std::string(kManifestFileName))));
    }
    RETURN_IF_ERROR(fs_->SyncDir(dir));
    RETURN_IF_ERROR(fs_->RemoveAll(dir));
    spdlog::info("job '{}': retention removed step {} (keep {})", job, step, config_.keep);
    --excess;
  }
  return fs_->SyncDir(job_dir);
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
