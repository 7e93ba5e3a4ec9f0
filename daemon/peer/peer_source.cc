#include "daemon/peer/peer_source.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "common/step_layout.h"
#include "daemon/hot_cache.h"
#include "daemon/peer/peer_store.h"

namespace ckpt::peer {

Status DaemonPeerSource::Read(const Region& region, std::byte* out) {
  if (store_ != nullptr && store_->Read(region, out)) return Status::Ok();
  if (wait_staged_) wait_staged_(region);
  if (hot_ == nullptr) return ReadStorage(region, out);
  // Window by window, what the cache holds is copied under a pin; the misses, joined where
  // they touch, are read from storage after the pin is let go, so a slow storage read never
  // keeps the step's slots from capture.
  std::vector<std::pair<uint64_t, uint64_t>> misses;   // [start, end) in the file
  const uint64_t end = region.offset + region.length;  // no overflow: ValidateRegion
  hot_->Pin(region.job, region.step);
  for (uint64_t pos = region.offset; pos < end;) {
    // `window_ - pos % window_` cannot overflow where `(pos / window_ + 1) * window_` could.
    const uint64_t n = window_ == 0 ? end - pos : std::min(end - pos, window_ - pos % window_);
    if (const std::byte* cached = hot_->Find(region.job, region.step, region.file, pos, n)) {
      std::memcpy(out + (pos - region.offset), cached, n);
    } else if (!misses.empty() && misses.back().second == pos) {
      misses.back().second = pos + n;
    } else {
      misses.emplace_back(pos, pos + n);
    }
    pos += n;
  }
  hot_->Unpin(region.job, region.step);
  for (const auto& [start, stop] : misses) {
    Region piece = region;
    piece.offset = start;
    piece.length = stop - start;
    RETURN_IF_ERROR(ReadStorage(piece, out + (start - region.offset)));
    if (on_storage_read_) on_storage_read_(region.job, piece.length);
    hot_->InsertRead(region.job, region.step, region.file, start, out + (start - region.offset),
                     piece.length);
  }
  return Status::Ok();
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
  if (region.length > size || region.offset > size - region.length) {
    return OutOfRange("peer: " + DescribeRegion(region) + " runs past the end of " + path + " (" +
                      std::to_string(size) + " bytes)");
  }
  RETURN_IF_ERROR((*file)->PReadAll(out, region.length, region.offset),
                  "peer: " + DescribeRegion(region));
  return Status::Ok();
}

}  // namespace ckpt::peer
