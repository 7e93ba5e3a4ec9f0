#include "daemon/admin/checkpoint_catalog.h"

#include "common/manifest_io.h"
#include "common/names.h"
#include "common/step_layout.h"

namespace ckpt {

Result<ckptd::v1::ListCheckpointsResponse> ListCommittedCheckpoints(FileSystem* fs,
                                                                    const std::string& root,
                                                                    const std::string& job) {
  RETURN_IF_ERROR(ValidateJobName(job), "list checkpoints");
  const std::string job_dir = JobDir(root, job);
  ckptd::v1::ListCheckpointsResponse out;
  ASSIGN_OR_RETURN(bool exists, fs->Exists(job_dir), "list checkpoints of job '" + job + "'");
  if (!exists) return out;  // a job that never committed has no checkpoints
  ASSIGN_OR_RETURN(auto steps, ListCommittedSteps(fs, job_dir),
                   "list checkpoints of job '" + job + "'");
  for (uint64_t s : steps) {
    out.add_steps(s);
    ASSIGN_OR_RETURN(bool pinned, IsPinnedStep(fs, StepDir(root, job, s)),
                     "list checkpoints of job '" + job + "'");
    if (pinned) out.add_pinned(s);
  }
  ASSIGN_OR_RETURN(auto latest, ResolveLatest(fs, job_dir), "latest of job '" + job + "'");
  if (latest) out.set_latest(*latest);
  return out;
}

Result<ckptd::v1::DescribeCheckpointResponse> DescribeCommittedCheckpoint(FileSystem* fs,
                                                                          const std::string& root,
                                                                          const std::string& job,
                                                                          uint64_t step) {
  RETURN_IF_ERROR(ValidateJobName(job), "describe checkpoint");
  const std::string dir = StepDir(root, job, step);
  const std::string what = "job '" + job + "' step " + std::to_string(step);
  ASSIGN_OR_RETURN(bool committed, fs->Exists(JoinPath(dir, std::string(kManifestFileName))), what);
  if (!committed) return NotFound(what + " is not committed (no MANIFEST in " + dir + ")");
  ckptd::v1::DescribeCheckpointResponse out;
  ASSIGN_OR_RETURN(*out.mutable_manifest(), ReadManifest(fs, dir), what);
  out.set_path(dir);
  return out;
}

Result<ckptd::v1::PinCheckpointResponse> PinCheckpoint(CommitEngine* commit, const std::string& job,
                                                       uint64_t step) {
  RETURN_IF_ERROR(commit->PinForOperator(job, step));
  return ckptd::v1::PinCheckpointResponse();
}

Result<ckptd::v1::UnpinCheckpointResponse> UnpinCheckpoint(CommitEngine* commit,
                                                           const std::string& job, uint64_t step) {
  RETURN_IF_ERROR(commit->UnpinForOperator(job, step));
  return ckptd::v1::UnpinCheckpointResponse();
}

Result<ckptd::v1::DeleteCheckpointResponse> DeleteCheckpoint(CommitEngine* commit,
                                                             const std::string& job,
                                                             uint64_t step) {
  RETURN_IF_ERROR(commit->DeleteCommitted(job, step));
  ckptd::v1::DeleteCheckpointResponse out;
  out.set_path(StepDir(commit->config().storage_root, job, step));
  return out;
}

}  // namespace ckpt
