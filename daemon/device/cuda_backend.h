// CudaBackend: the DeviceBackend of CUDA memory, one per session (docs/design.md §3.2; the handoff
// is specified in proto/README.md §3).
//
//   register:  each CudaMemory names a GPU by UUID and one allocation, by a legacy IPC handle of
//              its base or by a VMM POSIX fd. The backend activates the GPU (CudaDevices), opens
//              the allocation once per (client, handle bytes) — VMM fds by their object — and
//              caches it; a shard is [offset, offset+length) of the allocation.
//   save:      the client recorded an interprocess event on its stream *before* sending the Save
//              frame. WaitForClientEvent opens that event (cached by handle bytes) and makes the
//              GPU's copy stream wait on it: every copy of the step enqueued afterwards runs
//              after the trainer's pending writes, with no host synchronize anywhere.
//   capture:   CudaShardMemory::CopyOutAsync enqueues D2H into pool slots on the copy stream;
//              the capture engine's fences complete each slot (shard_memory.h).
//   load:      CopyIn enqueues H2D and waits for it; SignalLoaded then records each GPU's
//              interprocess "loaded" event for the client to wait on.
//   end:       DropUnused after a re-registration closes allocations no tensor uses; Clear on
//              disconnect closes the rest and the client's events (captures in flight keep
//              what they hold until they finish).
//
// Thread safety: the session's loop owns the backend; the ShardMemory objects are thread safe.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "daemon/device/cuda_devices.h"
#include "daemon/device/device_backend.h"

namespace ckpt::device {

// [offset, offset+size) of an opened allocation.
class CudaShardMemory final : public ShardMemory {
 public:
  CudaShardMemory(std::shared_ptr<DeviceAllocation> allocation, uint64_t offset, uint64_t size)
      : allocation_(std::move(allocation)), offset_(offset), size_(size) {}
  uint64_t size() const override { return size_; }
  Status CopyOut(uint64_t offset, std::byte* dst, uint64_t size) const override;
  Status CopyIn(uint64_t offset, const std::byte* src, uint64_t size) override;
  CopyQueue* copy_queue() const override { return allocation_->device(); }
  Status CopyOutAsync(uint64_t offset, std::byte* dst, uint64_t size) const override;
  CudaDevice* device() const { return allocation_->device(); }

 private:
  std::shared_ptr<DeviceAllocation> allocation_;
  uint64_t offset_;
  uint64_t size_;
};

class CudaBackend final : public DeviceBackend {
 public:
  explicit CudaBackend(CudaDevices* devices) : devices_(devices) {}
  ~CudaBackend() override;

  std::string_view kind() const override { return "cuda"; }
  Result<std::shared_ptr<ShardMemory>> Open(const ckptd::v1::TensorSpec& spec,
                                            std::span<const UniqueFd> fds,
                                            uint64_t expected_bytes) override;
  void DropUnused() override;
  void Clear() override;
  size_t cached() const override { return allocations_.size(); }
  size_t cached_events() const { return events_.size(); }

  // Makes the GPU's copy stream wait for the client's event (see the file comment). Errors:
  // kNotFound for an unknown GPU, kFailedPrecondition for a stale event handle.
  Status WaitForClientEvent(const ckptd::v1::CudaEvent& event);

  // Records the "loaded" event of every GPU holding memory of `memories` and returns their
  // handles, for a LoadReply.
  static Result<std::vector<ckptd::v1::CudaEvent>> SignalLoaded(
      const std::vector<const ShardMemory*>& memories);

 private:
  struct OpenedEvent {
    CudaDevice* device;
    EventHandle event;
  };
  CudaDevices* devices_;
  // Key: "ipc:" + uuid + handle bytes, or "vmm:" + uuid + object identity + size.
  std::map<std::string, std::shared_ptr<DeviceAllocation>> allocations_;
  std::map<std::string, OpenedEvent> events_;  // by uuid + handle bytes
};

}  // namespace ckpt::device
