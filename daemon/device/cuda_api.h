// CudaApi: the daemon's only door to CUDA (docs/design.md §10.6, §3.3).
//
// Every CUDA runtime or driver call the daemon makes goes through this interface, so that
//   * the daemon builds and runs on machines without a GPU or driver (the real implementation
//     links cudart statically and reaches driver functions only through
//     cudaGetDriverEntryPointByVersion — never -lcuda);
//   * the CUDA backend's logic (mapping cache, event ordering, chunk completion, cleanup, error
//     paths) is tested on CPU machines with a fake (tests/unit/device/fake_cuda_api.h).
//
// The interface is deliberately thin: one method per CUDA operation, in the daemon's terms
// (device ordinals resolved from UUIDs by the caller, handles as raw bytes). Policy lives in
// CudaDevices / CudaBackend, never here.
//
// Errors are mapped once, in the real implementation, onto three classes a client can act on:
//   kFailedPrecondition  "stale handle": the handle does not name live memory of that trainer
//                        (freed, wrong device, already opened elsewhere);
//   kResourceExhausted   out of GPU memory or address space while mapping;
//   kUnavailable         the device is lost or unusable (Xid, ECC, driver gone);
// anything else is kInternal. Messages carry the CUDA error name, the operation and file:line.
//
// Thread safety: implementations must allow concurrent calls from any thread (the real one sets
// the calling thread's device before each call that needs one).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "common/status.h"

namespace ckpt::device {

// A device address in the daemon's address space.
using DevicePtr = uint64_t;
// Opaque runtime objects (cudaStream_t / cudaEvent_t in the real implementation).
using StreamHandle = void*;
using EventHandle = void*;

// Size of cudaIpcMemHandle_t and cudaIpcEventHandle_t.
inline constexpr size_t kIpcHandleBytes = 64;

class CudaApi {
 public:
  virtual ~CudaApi() = default;

  // Number of usable devices; 0 (not an error) when there is no driver or no device.
  virtual Result<int> DeviceCount() = 0;
  // "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" of a device. Creates no context.
  virtual Result<std::string> DeviceUuid(int device) = 0;

  // Legacy IPC: opens a cudaIpcMemHandle_t (kIpcHandleBytes) of another process's allocation.
  virtual Result<DevicePtr> OpenIpcMemHandle(int device, std::string_view handle) = 0;
  virtual Status CloseIpcMemHandle(int device, DevicePtr ptr) = 0;
  // VMM: imports a POSIX-fd shareable handle (the fd is not kept) and maps `size` bytes of it
  // read-write on `device`.
  virtual Result<DevicePtr> ImportVmmFd(int device, int fd, uint64_t size) = 0;
  virtual Status UnmapVmm(int device, DevicePtr ptr, uint64_t size) = 0;

  // A non-blocking stream of the lowest priority (checkpoint copies yield to training work).
  virtual Result<StreamHandle> CreateCopyStream(int device) = 0;
  virtual void DestroyStream(int device, StreamHandle stream) = 0;

  // Events: timing disabled, blocking sync (a waiting thread sleeps instead of spinning);
  // `interprocess` adds cudaEventInterprocess.
  virtual Result<EventHandle> CreateEvent(int device, bool interprocess) = 0;
  virtual void DestroyEvent(int device, EventHandle event) = 0;
  virtual Result<std::string> IpcEventHandle(int device, EventHandle event) = 0;
  virtual Result<EventHandle> OpenIpcEventHandle(int device, std::string_view handle) = 0;
  virtual Status RecordEvent(int device, EventHandle event, StreamHandle stream) = 0;
  virtual Status StreamWaitEvent(int device, StreamHandle stream, EventHandle event) = 0;
  // Blocks until the event's work is done.
  virtual Status SynchronizeEvent(int device, EventHandle event) = 0;

  virtual Status CopyDeviceToHostAsync(int device, void* dst, DevicePtr src, uint64_t bytes,
                                       StreamHandle stream) = 0;
  virtual Status CopyHostToDeviceAsync(int device, DevicePtr dst, const void* src, uint64_t bytes,
                                       StreamHandle stream) = 0;

  // Page-locks host memory for every context (cudaHostRegisterPortable) so DMA reaches it
  // directly; needs a context on `device`.
  virtual Status HostRegister(int device, void* ptr, uint64_t bytes) = 0;
  virtual Status HostUnregister(int device, void* ptr) = 0;
};

// The real implementation, or nullptr when this build has no CUDA backend (CKPT_WITH_CUDA=OFF or
// no toolkit at build time). Loading it never fails on machines without a driver: DeviceCount
// then returns 0.
std::unique_ptr<CudaApi> CreateCudaRuntimeApi();

// True when the daemon was built with the CUDA backend.
bool CudaBackendCompiledIn();

}  // namespace ckpt::device
