#include "daemon/peer/peer_source.h"

#include <algorithm>
#include <cstring>

#include "common/step_layout.h"
#include "daemon/hot_cache.h"
#include "daemon/peer/peer_store.h"

namespace ckpt::peer {

Status DaemonPeerSource::Read(const Region& region, std::byte* out) {
  if (store_ != nullptr && store_->Read(region, out)) return Status::Ok();
  if (hot_ == nullptr) return ReadStorage(region, out);
  // Window by window: what the cache holds is copied, the rest read from storage.
  hot_->Pin(region.job, region.step);
  Status status = Status::Ok();
  uint64_t pos = region.offset;
  const uint64_t end = region.offset + region.length;
  while (pos < end && status.ok()) {
    const uint64_t window_end = window_ == 0 ? end : std::min(end, (pos / window_ + 1) * window_);
    const uint64_t n = window_end - pos;
    std::byte* dst = out + (pos - region.offset);
    if (const std::byte* cached = hot_->Find(region.job, region.step, region.file, pos, n)) {
      std::memcpy(dst, cached, n);
    } else {
      Region piece = region;
      piece.offset = pos;
      piece.length = n;
      status = ReadStorage(piece, dst);
    }
    pos = window_end;
  }
  hot_->Unpin(region.job, region.step);
  return status;
}

Status DaemonPeerSource::ReadStorage(const Region& region, std::byte* out) {
  // The names were validated (ValidateRegion): one safe component each, so the path stays
  // inside the step directory.
  const std::string dir = StepDir(root_, region.job, region.step);
  const std::string path = JoinPath(dir, region.file);
  // Only committed steps: the file of a step still being written may hold preallocated zeros
  // where a write has not landed yet.
  ASSIGN_OR_RETURN(const bool committed, fs_->Exists(JoinPath(dir, std::string(kManifestFileName))),
                   "peer: " + DescribeRegion(region));
  if (!committed) {
    return NotFound("peer: " + DescribeRegion(region) +
                    ": not held in memory, and the step is not committed in storage");
  }
  auto file = fs_->Open(path, OpenOptions{});
  if (!file.ok()) {
    if (file.status().code() == StatusCode::kNotFound) {
      return NotFound("peer: " + DescribeRegion(region) +
                      ": not held in memory and not in storage");
    }
    return file.status().WithContext("peer: " + DescribeRegion(region));
  }
  ASSIGN_OR_RETURN(const uint64_t size, (*file)->Size(), "peer: " + DescribeRegion(region));
  if (region.offset + region.length > size) {
    return OutOfRange("peer: " + DescribeRegion(region) + " runs past the end of " + path + " (" +
                      std::to_string(size) + " bytes)");
  }
  RETURN_IF_ERROR((*file)->PReadAll(out, region.length, region.offset),
                  "peer: " + DescribeRegion(region));
  return Status::Ok();
}

}  // namespace ckpt::peer
