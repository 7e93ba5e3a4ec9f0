#include "client/python/offline_writer.h"

#include <chrono>
#include <memory>
#include <vector>

#include "ckptd/v1/manifest.pb.h"
#include "common/atomic_file.h"
#include "common/data_layout.h"
#include "common/data_writer.h"
#include "common/dtype.h"
#include "common/manifest_io.h"
#include "common/names.h"
#include "common/step_layout.h"

namespace ckpt::python {
namespace {

// Refuses a step that is committed or older than the newest committed one, and a step directory
// someone else is writing (or left behind).
Status CheckStepIsNew(FileSystem* fs, const std::string& job_dir, const std::string& step_dir,
                      uint64_t step) {
  ASSIGN_OR_RETURN(std::vector<uint64_t> committed, ListCommittedSteps(fs, job_dir));
  if (!committed.empty() && committed.back() >= step) {
    return FailedPrecondition("the job already has committed step " +
                              std::to_string(committed.back()) +
                              ": a step is never written again, and a new step must come after "
                              "the newest committed one");
  }
  ASSIGN_OR_RETURN(bool exists, fs->Exists(step_dir));
  if (exists) {
    return FailedPrecondition("step directory " + step_dir +
                              " exists without a MANIFEST (a save in flight, or a leftover): "
                              "remove it first");
  }
  return Status::Ok();
}

// The manifest entry of every tensor, stored whole by rank 0 (offsets and checksums come later).
Result<ckptd::v1::Manifest> DescribeTensors(const std::string& job, uint64_t step,
                                            std::span<const OfflineTensor> tensors,
                                            const std::string& extra, const std::string& writer) {
  ckptd::v1::Manifest m;
  m.set_format_version(kFormatVersion);
  m.set_job(job);
  m.set_step(step);
  m.set_world_size(1);
  m.set_writer(writer);
  m.set_created_unix_ms(
      static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                std::chrono::system_clock::now().time_since_epoch())
                                .count()));
  for (const OfflineTensor& t : tensors) {
    const std::string what = "tensor '" + EscapeForLog(t.name) + "'";
    RETURN_IF_ERROR(ValidateTensorName(t.name));
    ASSIGN_OR_RETURN(DTypeInfo dtype, LookupDType(t.dtype), what);
    ASSIGN_OR_RETURN(uint64_t numel, ShapeNumel(t.shape), what);
    ASSIGN_OR_RETURN(uint64_t bytes, ByteSize(numel, dtype), what);
    if (bytes != t.nbytes || (bytes > 0 && t.data == nullptr)) {
      return InvalidArgument(what + ": " + std::to_string(t.nbytes) + " bytes given for " +
                             std::to_string(bytes) + " bytes of " + t.dtype + " data");
    }
    ASSIGN_OR_RETURN(ShardGeometry whole, ShardGeometry::Full(t.shape), what);
    auto* entry = m.add_tensors();
    entry->set_name(t.name);
    entry->set_dtype(t.dtype);
    for (uint64_t d : t.shape) entry->add_global_shape(d);
    auto* shard = entry->add_shards();
    *shard->mutable_geometry() = GeometryToProto(whole);
    shard->set_file(DataFileName(0));
    shard->set_writer_rank(0);
  }
  auto* rank = m.add_ranks();
  rank->set_rank(0);
  rank->set_node_id("offline");
  rank->set_extra(extra);
  return m;
}

// Writes the data file as the daemon lays it out and fills in each shard's offset, length and
// piece checksums.
Status WriteDataFile(FileSystem* fs, const std::string& path,
                     std::span<const OfflineTensor> tensors, ckptd::v1::Manifest& m) {
  std::vector<ShardSource> sources;
  for (const OfflineTensor& t : tensors) sources.push_back({t.data, t.nbytes});
  ASSIGN_OR_RETURN(std::vector<WrittenShard> written,
                   WriteDataFileFromMemory(fs, path, sources, LayoutOptions()));
  for (size_t i = 0; i < tensors.size(); ++i) {
    auto* shard = m.mutable_tensors(static_cast<int>(i))->mutable_shards(0);
    shard->set_offset(written[i].offset);
    shard->set_length(written[i].length);
    shard->set_chunk_size(written[i].chunk_size);
    for (uint64_t x : written[i].chunk_xxh3) shard->add_chunk_xxh3(x);
  }
  return Status::Ok();
}

}  // namespace

Status WriteOfflineCheckpoint(FileSystem* fs, const std::string& root, const std::string& job,
                              uint64_t step, std::span<const OfflineTensor> tensors,
                              const std::string& extra, const std::string& writer) {
  RETURN_IF_ERROR(ValidateJobName(job));
  const std::string ctx = "writing job '" + job + "' step " + std::to_string(step);
  const std::string job_dir = JobDir(root, job);
  const std::string step_dir = StepDir(root, job, step);
  RETURN_IF_ERROR(CheckStepIsNew(fs, job_dir, step_dir, step), ctx);
  ASSIGN_OR_RETURN(ckptd::v1::Manifest m, DescribeTensors(job, step, tensors, extra, writer), ctx);

  RETURN_IF_ERROR(fs->CreateDirs(step_dir), ctx);
  auto write = [&]() -> Status {
    // The job directory may be new: its entry in the root, and the step's in the job directory.
    RETURN_IF_ERROR(fs->SyncDir(root));
    RETURN_IF_ERROR(fs->SyncDir(job_dir));
    RETURN_IF_ERROR(WriteDataFile(fs, JoinPath(step_dir, DataFileName(0)), tensors, m));
    RETURN_IF_ERROR(ValidateManifestForCommit(m));
    // The data file's directory entry is durable before the MANIFEST can point at it.
    return fs->SyncDir(step_dir);
  };
  if (Status s = write(); !s.ok()) {
    fs->RemoveAll(step_dir).IgnoreError();
    return std::move(s).WithContext(ctx);
  }
  // The commit marker: temp file, fdatasync, rename, directory fsync.
  RETURN_IF_ERROR(WriteFileAtomically(fs, JoinPath(step_dir, std::string(kManifestFileName)),
                                      EncodeManifest(m)),
                  ctx);
  RETURN_IF_ERROR(fs->SyncDir(job_dir), ctx);
  // LATEST only moves forward (CheckStepIsNew made this the newest committed step).
  RETURN_IF_ERROR(WriteFileAtomically(fs, JoinPath(job_dir, std::string(kLatestFileName)),
                                      std::to_string(step) + "\n"),
                  ctx);
  return Status::Ok();
}

}  // namespace ckpt::python
