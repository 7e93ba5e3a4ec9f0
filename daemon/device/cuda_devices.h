// CudaDevices: the daemon's GPUs, as the CUDA backend uses them (docs/design.md §3.2, and
// §3.3 for the CUDA rules).
//
// At start the daemon only enumerates devices and their UUIDs — no context is created. A GPU is
// *activated* the first time a client names it (a registration or a save's event): that creates
// its primary context, one low-priority non-blocking copy stream, and — on the first activation
// of any GPU — page-locks the host pool with cudaHostRegister(Portable), so every later D2H copy
// is a direct DMA into pool slots (~1 s per 8 GiB, once). A GPU no client uses never gets a
// context (each costs hundreds of MiB of GPU memory).
//
// Each activated GPU is a CopyQueue: the capture engine enqueues chunk copies on its stream and
// records fences (events from a small per-device free list) after each pool slot.
//
// Legacy IPC handles may be opened only once per process, so opened allocations are shared
// daemon-wide by (device, handle bytes) while any client's cache holds them (weak references
// here); VMM imports are per client.
//
// Thread safety: all methods are safe from any thread. Must outlive every session, plan and
// capture job (main declares it before the io_context), and die before the host pool.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/mutex.h"
#include "daemon/device/cuda_api.h"
#include "daemon/shard_memory.h"

namespace ckpt {

class HostPool;

namespace device {

class CudaDevices;

// One activated GPU: its copy stream and fence events.
class CudaDevice final : public CopyQueue {
 public:
  CudaDevice(CudaDevices* owner, int ordinal, std::string uuid, StreamHandle stream)
      : owner_(owner), ordinal_(ordinal), uuid_(std::move(uuid)), stream_(stream) {}
  ~CudaDevice() override;

  int ordinal() const { return ordinal_; }
  const std::string& uuid() const { return uuid_; }
  StreamHandle stream() const { return stream_; }
  CudaApi& api() const;

  Result<std::unique_ptr<CopyFence>> Record() override;
  // Copies enqueued on the stream from now on wait until `event` (a client's) has completed.
  Status WaitFor(EventHandle event);
  // Records this device's interprocess "loaded" event on the copy stream and returns its
  // handle: a client waiting on it sees every copy enqueued before (the load's H2D copies).
  Result<std::string> SignalLoaded();

  // Fence events are reused: taken here, given back by the fence after its wait.
  Result<EventHandle> TakeEvent();
  void ReturnEvent(EventHandle event);

 private:
  CudaDevices* owner_;
  const int ordinal_;
  const std::string uuid_;
  const StreamHandle stream_;
  Mutex mu_;
  std::vector<EventHandle> free_events_ GUARDED_BY(mu_);
  EventHandle loaded_event_ GUARDED_BY(mu_) = nullptr;  // created on first use
};

// Memory of another process opened in the daemon: closed (cudaIpcCloseMemHandle / unmap) when
// the last user lets go.
class DeviceAllocation {
 public:
  enum class Route { kLegacyIpc, kVmm };
  DeviceAllocation(CudaDevice* device, Route route, DevicePtr base, uint64_t size)
      : device_(device), route_(route), base_(base), size_(size) {}
  ~DeviceAllocation();
  DeviceAllocation(const DeviceAllocation&) = delete;
  DeviceAllocation& operator=(const DeviceAllocation&) = delete;

  CudaDevice* device() const { return device_; }
  Route route() const { return route_; }
  DevicePtr base() const { return base_; }
  uint64_t size() const { return size_; }

 private:
  CudaDevice* device_;
  Route route_;
  DevicePtr base_;
  uint64_t size_;
};

class CudaDevices {
 public:
  // Enumerates the GPUs. Returns nullptr (not an error) when `api` is null or sees no device:
  // the daemon then runs host memory only. `pool` is registered on first activation.
  static Result<std::unique_ptr<CudaDevices>> Create(std::unique_ptr<CudaApi> api, HostPool* pool);
  ~CudaDevices();
  CudaDevices(const CudaDevices&) = delete;
  CudaDevices& operator=(const CudaDevices&) = delete;

  CudaApi& api() const { return *api_; }
  size_t device_count() const { return uuids_.size(); }
  const std::vector<std::string>& uuids() const { return uuids_; }
  // Whether any GPU was activated (has a context); and which.
  std::vector<std::string> active_uuids() const;
  bool pool_registered() const;

  // The GPU with this UUID, activated on first use. kNotFound naming the visible GPUs when this
  // daemon cannot see it (another node's GPU, or hidden by CUDA_VISIBLE_DEVICES).
  Result<CudaDevice*> Activate(const std::string& uuid);

  // Opens a legacy IPC handle of `device`, or shares the daemon's live opening of it.
  Result<std::shared_ptr<DeviceAllocation>> OpenIpc(CudaDevice* device, const std::string& handle,
                                                    uint64_t size);

 private:
  CudaDevices(std::unique_ptr<CudaApi> api, HostPool* pool, std::vector<std::string> uuids)
      : api_(std::move(api)), pool_(pool), uuids_(std::move(uuids)) {}

  std::unique_ptr<CudaApi> api_;
  HostPool* pool_;
  const std::vector<std::string> uuids_;  // by ordinal
  mutable Mutex mu_;
  std::map<std::string, std::unique_ptr<CudaDevice>> active_ GUARDED_BY(mu_);  // by uuid
  int pool_registered_on_ GUARDED_BY(mu_) = -1;
  std::map<std::pair<int, std::string>, std::weak_ptr<DeviceAllocation>> ipc_open_ GUARDED_BY(mu_);
};

}  // namespace device
}  // namespace ckpt
