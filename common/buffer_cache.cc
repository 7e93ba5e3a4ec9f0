#include "common/buffer_cache.h"

#include <algorithm>

namespace ckpt {

BufferCache& BufferCache::Shared() {
  static BufferCache cache;
  return cache;
}

AlignedBuffer BufferCache::Take(size_t size) {
  {
    MutexLock lock(mu_);
    // The smallest that fits: a small request does not take a buffer a large one needs.
    auto best = free_.end();
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->size() >= size && (best == free_.end() || it->size() < best->size())) best = it;
    }
    if (best != free_.end()) {
      AlignedBuffer b = std::move(*best);
      free_.erase(best);
      return b;
    }
  }
  return AlignedBuffer(size);
}

void BufferCache::Give(AlignedBuffer b) {
  if (b.size() == 0 || b.size() > kMaxRetainedBytes) return;
  MutexLock lock(mu_);
  if (free_.size() < kMaxRetained) {
    free_.push_back(std::move(b));
    return;
  }
  // Full: keep the larger of `b` and the smallest kept, so that small buffers cannot crowd out
  // the large ones every reader needs. The loser is freed when `b` goes out of scope.
  auto smallest = std::min_element(
      free_.begin(), free_.end(), [](const auto& x, const auto& y) { return x.size() < y.size(); });
  if (smallest->size() < b.size()) std::swap(*smallest, b);
}

}  // namespace ckpt
