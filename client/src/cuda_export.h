// CudaExporter: the client's side of the CUDA handoff (docs/design.md §3.2, proto/README.md §3).
//
// The client library must load into any trainer — with or without a GPU, next to whatever CUDA
// runtime the trainer uses (PyTorch ships its own) — so it never links CUDA: the driver is
// opened with dlopen("libcuda.so.1") on first use and every function is looked up through
// cuGetProcAddress. Only the driver API is used; the trainer's runtime and ours never meet.
//
//   Export(ptr, nbytes): finds the allocation holding ptr (cuMemGetAddressRange) and picks the
//     route from its attributes: a legacy IPC handle of the allocation *base* when the memory is
//     legacy-IPC capable (cudaMalloc / PyTorch's default allocator); else, for VMM memory that
//     allows POSIX-fd export (PyTorch expandable segments), cuMemRetainAllocationHandle +
//     cuMemExportToShareableHandle → an fd for SCM_RIGHTS. The GPU is named by UUID.
//   RecordSaveEvent(device, stream): records this process's interprocess event of that GPU
//     (created once, cudaEventInterprocess | DisableTiming) on `stream` and returns its handle;
//     the Save frame carrying it is sent after the record (a wait on an unrecorded event would
//     return at once).
//   WaitLoaded(uuid, handle, stream): makes `stream` wait on the daemon's "loaded" event.
//
// Calls run in the device's primary context (pushed and popped around each call), which is the
// context PyTorch and the runtime API use. Errors: kUnavailable when there is no driver;
// kInvalidArgument for pointers that are not device memory of this process or cannot be
// shared; kUnimplemented for a VMM tensor that spans several physical allocations.
//
// Thread safety: all methods are safe from any thread.
#pragma once

#include <cstdint>
#include <string>

#include "common/frame_io.h"
#include "common/status.h"

namespace ckpt::detail {

struct CudaExport {
  std::string device_uuid;
  int device = -1;  // ordinal in this process (for events)
  bool vmm = false;
  std::string ipc_handle;  // legacy route: 64 bytes
  UniqueFd vmm_fd;         // VMM route: the exported POSIX fd (owned)
  uint64_t allocation_size = 0;
  uint64_t offset = 0;  // of ptr from the allocation base
};

class CudaExporter {
 public:
  // The process-wide exporter; kUnavailable (with the reason) when no CUDA driver can be loaded
  // or this client was built without CUDA headers.
  static Result<CudaExporter*> Get();

  virtual ~CudaExporter() = default;
  virtual Result<CudaExport> Export(const void* ptr, uint64_t nbytes) = 0;
  virtual Result<std::string> RecordSaveEvent(int device, void* stream) = 0;
  virtual Status WaitLoaded(const std::string& device_uuid, const std::string& handle,
                            void* stream) = 0;
};

}  // namespace ckpt::detail
