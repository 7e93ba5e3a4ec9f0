// ShardMemory: the memory of one registered shard, wherever it lives (the trainer's host memory
// mapped from an fd, or GPU memory opened from a CUDA IPC handle). The capture engine copies
// out of it into pool slots; the load path copies into it. All device specifics live behind
// this interface (DESIGN.md §3), so everything else runs on machines without a GPU.
//
// Thread safety: CopyOut/CopyIn may run concurrently on distinct ranges.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "common/status.h"
#include "daemon/host_memory.h"

namespace ckpt {

class ShardMemory {
 public:
  virtual ~ShardMemory() = default;
  virtual uint64_t size() const = 0;
  // Copies [offset, offset+size) of the shard to host memory `dst`.
  virtual Status CopyOut(uint64_t offset, std::byte* dst, uint64_t size) const = 0;
  // Copies host memory `src` into [offset, offset+size) of the shard.
  virtual Status CopyIn(uint64_t offset, const std::byte* src, uint64_t size) = 0;
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
