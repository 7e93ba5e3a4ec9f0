// ShardMemory: the memory of one registered shard, wherever it lives (the trainer's host memory
// mapped from an fd, or GPU memory opened from a CUDA IPC handle). The capture engine copies
// out of it into pool slots; the load path copies into it. All device specifics live behind
// this interface (docs/design.md §3), so everything else runs on machines without a GPU.
//
// Host memory is copied synchronously (CopyOut). Device memory is copied asynchronously: the
// capture engine enqueues CopyOutAsync on the shard's copy_queue() (one per GPU: its copy
// stream), records a CopyFence after each pool slot and hands the slot to the flush engine only
// once that fence is done — per-chunk completion by event, the flush side unchanged.
//
// Thread safety: CopyOut/CopyIn may run concurrently on distinct ranges.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "common/status.h"
#include "daemon/host_memory.h"

namespace ckpt {

// A point in a copy queue: done when every copy enqueued before it has finished.
class CopyFence {
 public:
  virtual ~CopyFence() = default;
  // Blocks until done. An error (device lost) means the copies before it did not complete.
  virtual Status Wait() = 0;
};

// Where asynchronous copies of device memory are enqueued (a GPU's copy stream).
class CopyQueue {
 public:
  virtual ~CopyQueue() = default;
  virtual Result<std::unique_ptr<CopyFence>> Record() = 0;
};

class ShardMemory {
 public:
  virtual ~ShardMemory() = default;
  virtual uint64_t size() const = 0;
  // Copies [offset, offset+size) of the shard to host memory `dst`; done when it returns.
  virtual Status CopyOut(uint64_t offset, std::byte* dst, uint64_t size) const = 0;
  // Copies host memory `src` into [offset, offset+size) of the shard; done when it returns.
  virtual Status CopyIn(uint64_t offset, const std::byte* src, uint64_t size) = 0;

  // Device memory: the queue CopyOutAsync enqueues on. nullptr for host memory.
  virtual CopyQueue* copy_queue() const { return nullptr; }
  // Enqueues the copy of CopyOut on copy_queue(): `dst` is written once a fence recorded on that
  // queue afterwards is done, and must stay valid until then. Synchronous for host memory.
  virtual Status CopyOutAsync(uint64_t offset, std::byte* dst, uint64_t size) const {
    return CopyOut(offset, dst, size);
  }
};

// A shard in a trainer's host memory: a range of a mapped shared-memory object.
class HostShardMemory final : public ShardMemory {
 public:
  HostShardMemory(std::shared_ptr<HostMapping> mapping, uint64_t offset, uint64_t size)
      : mapping_(std::move(mapping)), offset_(offset), size_(size) {}
  uint64_t size() const override { return size_; }
  Status CopyOut(uint64_t offset, std::byte* dst, uint64_t size) const override {
    return GuardedCopy(dst, mapping_->data() + offset_ + offset, size);
  }
  Status CopyIn(uint64_t offset, const std::byte* src, uint64_t size) override {
    if (!mapping_->writable()) {
      return PermissionDenied("the registered descriptor is read-only; cannot load into it");
    }
    return GuardedCopy(mapping_->data() + offset_ + offset, src, size);
  }

 private:
  std::shared_ptr<HostMapping> mapping_;
  uint64_t offset_;
  uint64_t size_;
};

}  // namespace ckpt
