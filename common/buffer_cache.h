// BufferCache: large I/O buffers kept between uses, so that a daemon moving checkpoint bytes
// call after call does not fault in and zero a fresh buffer each time.
//
// A fresh 16 MiB buffer costs ~4k page faults and a memset on the core it shares with capture;
// a cold load used to take 53k of them for 256 MiB, and a peer restore spent ~8 % of its CPU
// zeroing the buffers of its FETCHes on both ends (bench/README.md). Three users share one
// process-wide cache: the checkpoint reader's I/O threads, the data plane's FETCH replies
// (daemon/peer/peer_server.cc) and a load's staging and fetching (daemon/load_service.cc).
//
// Bounded: at most kMaxRetained buffers of at most kMaxRetainedBytes each are kept (128 MiB),
// so the cache is a fixed cost, never a leak that grows with load size; a larger buffer is
// freed when given back, and a Take finding none large enough allocates.
//
// Thread safety: Take and Give from any thread (one mutex, held for a scan of at most
// kMaxRetained entries; never while allocating).
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

#include "common/file_system.h"
#include "common/mutex.h"

namespace ckpt {

class BufferCache {
 public:
  static constexpr size_t kMaxRetained = 8;
  static constexpr size_t kMaxRetainedBytes = 16ull << 20;

  // The process-wide cache.
  static BufferCache& Shared();

  BufferCache() { free_.reserve(kMaxRetained); }  // Give never allocates

  // The smallest retained buffer of at least `size` bytes, or a new (zero-filled) one; throws
  // std::bad_alloc when there is no memory for it.
  AlignedBuffer Take(size_t size);
  // Keeps `b` for a later Take unless it is too large; when kMaxRetained are kept already, `b`
  // replaces the smallest of them if it is larger. Whatever is not kept is freed.
  void Give(AlignedBuffer b);

 private:
  Mutex mu_;
  std::vector<AlignedBuffer> free_ GUARDED_BY(mu_);
};

// A buffer borrowed from the shared cache, given back when this goes out of scope.
class BorrowedBuffer {
 public:
  BorrowedBuffer() = default;
  BorrowedBuffer(const BorrowedBuffer&) = delete;
  BorrowedBuffer& operator=(const BorrowedBuffer&) = delete;
  ~BorrowedBuffer() { BufferCache::Shared().Give(std::move(buffer_)); }

  // Makes the buffer at least `size` bytes, trading it for a larger one when it is shorter
  // (contents not kept); throws std::bad_alloc.
  void Reserve(size_t size) {
    if (buffer_.size() >= size) return;
    BufferCache::Shared().Give(std::move(buffer_));
    buffer_ = BufferCache::Shared().Take(size);
  }
  AlignedBuffer& buffer() { return buffer_; }
  std::byte* data() const { return buffer_.data(); }
  size_t size() const { return buffer_.size(); }

 private:
  AlignedBuffer buffer_;
};

}  // namespace ckpt
