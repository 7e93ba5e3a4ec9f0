#include "common/buffer_cache.h"

namespace ckpt {

BufferCache& BufferCache::Shared() {
  static BufferCache cache;
  return cache;
}

AlignedBuffer BufferCache::Take(size_t size) {
  {
    MutexLock lock(mu_);
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->size() >= size) {
        AlignedBuffer b = std::move(*it);
        free_.erase(it);
        return b;
      }
    }
  }
  return AlignedBuffer(size);
}

void BufferCache::Give(AlignedBuffer b) {
  if (b.size() == 0 || b.size() > kMaxRetainedBytes) return;
  MutexLock lock(mu_);
  if (free_.size() < kMaxRetained) free_.push_back(std::move(b));
}

}  // namespace ckpt
