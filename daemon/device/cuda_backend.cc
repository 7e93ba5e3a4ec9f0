#include "daemon/device/cuda_backend.h"

#include <sys/stat.h>

#include <set>

#include "common/logging.h"

namespace ckpt::device {

Status CudaShardMemory::CopyOutAsync(uint64_t offset, std::byte* dst, uint64_t size) const {
  if (offset > size_ || size > size_ - offset) {
    return OutOfRange("copy of [" + std::to_string(offset) + ", +" + std::to_string(size) +
                      ") outside a GPU shard of " + std::to_string(size_) + " bytes");
  }
  CudaDevice* d = allocation_->device();
  return d->api().CopyDeviceToHostAsync(d->ordinal(), dst, allocation_->base() + offset_ + offset,
                                        size, d->stream());
}

Status CudaShardMemory::CopyOut(uint64_t offset, std::byte* dst, uint64_t size) const {
  RETURN_IF_ERROR(CopyOutAsync(offset, dst, size));
  ASSIGN_OR_RETURN(auto fence, allocation_->device()->Record());
  return fence->Wait();
}

Status CudaShardMemory::CopyIn(uint64_t offset, const std::byte* src, uint64_t size) {
  if (offset > size_ || size > size_ - offset) {
    return OutOfRange("copy of [" + std::to_string(offset) + ", +" + std::to_string(size) +
                      ") outside a GPU shard of " + std::to_string(size_) + " bytes");
  }
  CudaDevice* d = allocation_->device();
  RETURN_IF_ERROR(d->api().CopyHostToDeviceAsync(
      d->ordinal(), allocation_->base() + offset_ + offset, src, size, d->stream()));
  // `src` is the caller's buffer, reused as soon as this returns: wait for the copy.
  ASSIGN_OR_RETURN(auto fence, d->Record());
  return fence->Wait();
}

CudaBackend::~CudaBackend() { Clear(); }

Result<std::shared_ptr<ShardMemory>> CudaBackend::Open(const ckptd::v1::TensorSpec& spec,
                                                       std::span<const UniqueFd> fds,
                                                       uint64_t expected_bytes) {
  if (!spec.has_cuda()) return InvalidArgument("not CUDA memory");
  const ckptd::v1::CudaMemory& m = spec.cuda();
  if (m.length() != expected_bytes) {
    return InvalidArgument("memory length " + std::to_string(m.length()) +
                           " but its geometry "
                           "and dtype make " +
                           std::to_string(expected_bytes) + " bytes");
  }
  if (m.allocation_size() == 0 || m.offset() > m.allocation_size() ||
      m.length() > m.allocation_size() - m.offset()) {
    return OutOfRange(
        "bytes [" + std::to_string(m.offset()) + ", " + std::to_string(m.offset() + m.length()) +
        ") lie outside its GPU allocation of " + std::to_string(m.allocation_size()) + " bytes");
  }
  std::string key;
  if (m.handle_case() == ckptd::v1::CudaMemory::kIpcHandle) {
    if (m.ipc_handle().size() != kIpcHandleBytes) {
      return InvalidArgument("CUDA IPC handle of " + std::to_string(m.ipc_handle().size()) +
                             " bytes; expected " + std::to_string(kIpcHandleBytes));
    }
    key = "ipc:" + m.device_uuid() + ":" + m.ipc_handle();
  } else if (m.handle_case() == ckptd::v1::CudaMemory::kVmmFdIndex) {
    if (m.vmm_fd_index() >= fds.size()) {
      return InvalidArgument("names descriptor " + std::to_string(m.vmm_fd_index()) + " but only " +
                             std::to_string(fds.size()) + " were sent");
    }
    struct stat st;
    if (::fstat(fds[m.vmm_fd_index()].get(), &st) != 0) {
      return ErrnoStatus(errno, "fstat of a VMM allocation descriptor");
    }
    key = "vmm:" + m.device_uuid() + ":" + std::to_string(st.st_dev) + ":" +
          std::to_string(st.st_ino) + ":" + std::to_string(m.allocation_size());
  } else {
    return InvalidArgument("CUDA memory without a handle (neither ipc_handle nor vmm_fd_index)");
  }

  std::shared_ptr<DeviceAllocation> alloc;
  auto it = allocations_.find(key);
  if (it != allocations_.end()) {
    alloc = it->second;
    if (alloc->size() != m.allocation_size()) {
      return InvalidArgument("allocation size " + std::to_string(m.allocation_size()) +
                             " disagrees with " + std::to_string(alloc->size()) +
                             " sent before for the same handle");
    }
  } else {
    ASSIGN_OR_RETURN(CudaDevice * device, devices_->Activate(m.device_uuid()));
    if (m.handle_case() == ckptd::v1::CudaMemory::kIpcHandle) {
      ASSIGN_OR_RETURN(alloc, devices_->OpenIpc(device, m.ipc_handle(), m.allocation_size()));
    } else {
      ASSIGN_OR_RETURN(DevicePtr base,
                       devices_->api().ImportVmmFd(device->ordinal(), fds[m.vmm_fd_index()].get(),
                                                   m.allocation_size()),
                       "GPU " + device->uuid());
      alloc = std::make_shared<DeviceAllocation>(device, DeviceAllocation::Route::kVmm, base,
                                                 m.allocation_size());
    }
    allocations_.emplace(key, alloc);
  }
  return std::shared_ptr<ShardMemory>(
      std::make_shared<CudaShardMemory>(std::move(alloc), m.offset(), m.length()));
}

void CudaBackend::DropUnused() {
  std::erase_if(allocations_, [](const auto& kv) { return kv.second.use_count() == 1; });
}

void CudaBackend::Clear() {
  allocations_.clear();
  for (auto& [key, e] : events_) e.device->api().DestroyEvent(e.device->ordinal(), e.event);
  events_.clear();
}

Status CudaBackend::WaitForClientEvent(const ckptd::v1::CudaEvent& event) {
  if (event.ipc_event_handle().size() != kIpcHandleBytes) {
    return InvalidArgument("CUDA IPC event handle of " +
                           std::to_string(event.ipc_event_handle().size()) + " bytes; expected " +
                           std::to_string(kIpcHandleBytes));
  }
  const std::string key = event.device_uuid() + ":" + event.ipc_event_handle();
  auto it = events_.find(key);
  if (it == events_.end()) {
    ASSIGN_OR_RETURN(CudaDevice * device, devices_->Activate(event.device_uuid()));
    ASSIGN_OR_RETURN(
        EventHandle opened,
        devices_->api().OpenIpcEventHandle(device->ordinal(), event.ipc_event_handle()),
        "the save's event on GPU " + device->uuid());
    it = events_.emplace(key, OpenedEvent{device, opened}).first;
  }
  return it->second.device->WaitFor(it->second.event);
}

Result<std::vector<ckptd::v1::CudaEvent>> CudaBackend::SignalLoaded(
    const std::vector<const ShardMemory*>& memories) {
  std::set<CudaDevice*> devices;
  for (const ShardMemory* m : memories) {
    if (auto* cuda = dynamic_cast<const CudaShardMemory*>(m)) devices.insert(cuda->device());
  }
  std::vector<ckptd::v1::CudaEvent> out;
  for (CudaDevice* d : devices) {
    ASSIGN_OR_RETURN(std::string handle, d->SignalLoaded());
    ckptd::v1::CudaEvent e;
    e.set_device_uuid(d->uuid());
    e.set_ipc_event_handle(std::move(handle));
    out.push_back(std::move(e));
  }
  return out;
}

}  // namespace ckpt::device
