#include "daemon/device/cuda_devices.h"

#include "common/logging.h"
#include "common/units.h"
#include "daemon/host_pool.h"

namespace ckpt::device {
namespace {

// Waits on one recorded event, then gives the event back to its device.
class EventFence final : public CopyFence {
 public:
  EventFence(CudaDevice* device, EventHandle event) : device_(device), event_(event) {}
  ~EventFence() override {
    // An un-waited fence may still be pending on the GPU: wait before reuse (errors were
    // already reported by Wait, or nobody is interested any more).
    if (!waited_) device_->api().SynchronizeEvent(device_->ordinal(), event_).IgnoreError();
    device_->ReturnEvent(event_);
  }
  Status Wait() override {
    waited_ = true;
    return device_->api()
        .SynchronizeEvent(device_->ordinal(), event_)
        .WithContext("copy on GPU " + device_->uuid());
  }

 private:
  CudaDevice* device_;
  EventHandle event_;
  bool waited_ = false;
};

}  // namespace

CudaApi& CudaDevice::api() const { return owner_->api(); }

CudaDevice::~CudaDevice() {
  for (EventHandle e : free_events_) api().DestroyEvent(ordinal_, e);
  if (loaded_event_ != nullptr) api().DestroyEvent(ordinal_, loaded_event_);
  api().DestroyStream(ordinal_, stream_);
}

Result<EventHandle> CudaDevice::TakeEvent() {
  {
    MutexLock lock(mu_);
    if (!free_events_.empty()) {
      EventHandle e = free_events_.back();
      free_events_.pop_back();
      return e;
    }
  }
  return api().CreateEvent(ordinal_, /*interprocess=*/false);
}

void CudaDevice::ReturnEvent(EventHandle event) {
  MutexLock lock(mu_);
  free_events_.push_back(event);
}

Result<std::unique_ptr<CopyFence>> CudaDevice::Record() {
  ASSIGN_OR_RETURN(EventHandle e, TakeEvent(), "GPU " + uuid_);
  Status s = api().RecordEvent(ordinal_, e, stream_);
  if (!s.ok()) {
    ReturnEvent(e);
    return s.WithContext("GPU " + uuid_);
  }
  return std::unique_ptr<CopyFence>(std::make_unique<EventFence>(this, e));
}

Status CudaDevice::WaitFor(EventHandle event) {
  return api().StreamWaitEvent(ordinal_, stream_, event).WithContext("GPU " + uuid_);
}

Result<std::string> CudaDevice::SignalLoaded() {
  MutexLock lock(mu_);
  if (loaded_event_ == nullptr) {
    ASSIGN_OR_RETURN(loaded_event_, api().CreateEvent(ordinal_, /*interprocess=*/true),
                     "GPU " + uuid_);
  }
  RETURN_IF_ERROR(api().RecordEvent(ordinal_, loaded_event_, stream_), "GPU " + uuid_);
  return api().IpcEventHandle(ordinal_, loaded_event_);
}

DeviceAllocation::~DeviceAllocation() {
  CudaApi& api = device_->api();
  Status s = route_ == Route::kLegacyIpc ? api.CloseIpcMemHandle(device_->ordinal(), base_)
                                         : api.UnmapVmm(device_->ordinal(), base_, size_);
  if (!s.ok()) {
    spdlog::warn("closing a mapping of {} bytes on GPU {}: {}", size_, device_->uuid(),
                 s.ToString());
  }
}

Result<std::unique_ptr<CudaDevices>> CudaDevices::Create(std::unique_ptr<CudaApi> api,
                                                         HostPool* pool) {
  if (api == nullptr) return std::unique_ptr<CudaDevices>();
  ASSIGN_OR_RETURN(int count, api->DeviceCount(), "enumerating GPUs");
  if (count <= 0) return std::unique_ptr<CudaDevices>();
  std::vector<std::string> uuids;
  for (int i = 0; i < count; ++i) {
    ASSIGN_OR_RETURN(std::string uuid, api->DeviceUuid(i), "GPU " + std::to_string(i));
    uuids.push_back(std::move(uuid));
  }
  return std::unique_ptr<CudaDevices>(new CudaDevices(std::move(api), pool, std::move(uuids)));
}

CudaDevices::~CudaDevices() {
  MutexLock lock(mu_);
  if (pool_registered_on_ >= 0 && pool_ != nullptr) {
    api_->HostUnregister(pool_registered_on_, pool_->base()).IgnoreError();
  }
  active_.clear();
}

std::vector<std::string> CudaDevices::active_uuids() const {
  MutexLock lock(mu_);
  std::vector<std::string> out;
  for (const auto& [uuid, d] : active_) out.push_back(uuid);
  return out;
}

bool CudaDevices::pool_registered() const {
  MutexLock lock(mu_);
  return pool_registered_on_ >= 0;
}

Result<CudaDevice*> CudaDevices::Activate(const std::string& uuid) {
  MutexLock lock(mu_);
  auto it = active_.find(uuid);
  if (it != active_.end()) return it->second.get();
  int ordinal = -1;
  for (size_t i = 0; i < uuids_.size(); ++i) {
    if (uuids_[i] == uuid) ordinal = static_cast<int>(i);
  }
  if (ordinal < 0) {
    std::string visible;
    for (const auto& u : uuids_) visible += (visible.empty() ? "" : ", ") + u;
    return NotFound("GPU " + uuid + " is not visible to this daemon (it sees " + visible +
                    "); trainer and daemon must run on the same node and see the same GPUs");
  }
  // Creating the stream creates the device's primary context: the first cost of a GPU.
  ASSIGN_OR_RETURN(StreamHandle stream, api_->CreateCopyStream(ordinal), "activating GPU " + uuid);
  auto device = std::make_unique<CudaDevice>(this, ordinal, uuid, stream);
  spdlog::info("GPU {} (ordinal {}) activated: context and low-priority copy stream", uuid,
               ordinal);
  if (pool_registered_on_ < 0 && pool_ != nullptr) {
    Status s = api_->HostRegister(ordinal, pool_->base(), pool_->size_bytes());
    if (s.ok()) {
      pool_registered_on_ = ordinal;
      spdlog::info("host pool of {} registered with CUDA (page-locked for DMA)",
                   FormatBytes(pool_->size_bytes()));
    } else {
      // Copies still work (staged by the driver), only slower: say so, do not fail.
      spdlog::warn("cudaHostRegister of the host pool failed ({}); GPU copies will be staged",
                   s.ToString());
    }
  }
  CudaDevice* raw = device.get();
  active_.emplace(uuid, std::move(device));
  return raw;
}

Result<std::shared_ptr<DeviceAllocation>> CudaDevices::OpenIpc(CudaDevice* device,
                                                               const std::string& handle,
                                                               uint64_t size) {
  MutexLock lock(mu_);
  const auto key = std::make_pair(device->ordinal(), handle);
  auto it = ipc_open_.find(key);
  if (it != ipc_open_.end()) {
    if (auto live = it->second.lock()) return live;
  }
  ASSIGN_OR_RETURN(DevicePtr base, api_->OpenIpcMemHandle(device->ordinal(), handle),
                   "GPU " + device->uuid());
  auto alloc =
      std::make_shared<DeviceAllocation>(device, DeviceAllocation::Route::kLegacyIpc, base, size);
  std::erase_if(ipc_open_, [](const auto& kv) { return kv.second.expired(); });
  ipc_open_[key] = alloc;
  return alloc;
}

}  // namespace ckpt::device
