// DeviceBackend: opens the memory a client registered (docs/design.md §3).
//
// One backend per kind of memory handle and per session: HostFdBackend maps host descriptors
// (memfd / POSIX shm), CudaBackend opens CUDA IPC handles and VMM fds. BuildCapturePlan asks the
// backend of each TensorSpec's memory kind for a ShardMemory; nothing outside the backends knows
// how the bytes are reached.
//
// Caching contract (docs/design.md §3.3): a backend opens each handle once per client and
// caches the opened mapping by the handle's identity — descriptor object (st_dev, st_ino) for
// fds, the handle bytes for CUDA IPC — never by address. DropUnused() after a registration closes
// what the new registration no longer uses; Clear() on disconnect forgets everything. A mapping
// that an in-flight capture or load still holds (shared_ptr) is closed only when they let go.
//
// Thread safety: a backend belongs to its session's loop; not thread safe. The ShardMemory
// objects it returns follow ShardMemory's rules.
#pragma once

#include <memory>
#include <span>
#include <string_view>

#include "ckptd/v1/local.pb.h"
#include "common/frame_io.h"
#include "common/status.h"
#include "daemon/shard_memory.h"

namespace ckpt {

class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;
  // "host-fd" or "cuda", for messages.
  virtual std::string_view kind() const = 0;
  // The memory of one registered tensor. `fds` are the descriptors received with the
  // registration (indexed by the spec's fd index). `expected_bytes` is the shard's size implied
  // by its geometry and dtype; the spec's length must equal it. Errors do not name the tensor
  // (the caller adds that).
  virtual Result<std::shared_ptr<ShardMemory>> Open(const ckptd::v1::TensorSpec& spec,
                                                    std::span<const UniqueFd> fds,
                                                    uint64_t expected_bytes) = 0;
  // Closes cached mappings no live ShardMemory uses any more.
  virtual void DropUnused() = 0;
  // The client is gone: forgets every cached mapping.
  virtual void Clear() = 0;
  // Mappings currently cached.
  virtual size_t cached() const = 0;
};

}  // namespace ckpt
