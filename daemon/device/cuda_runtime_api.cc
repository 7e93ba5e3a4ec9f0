// The real CudaApi: the CUDA runtime (linked statically, CUDA::cudart_static) plus the few
// driver functions the runtime lacks (VMM import/map), reached through
// cudaGetDriverEntryPointByVersion — the daemon never links libcuda, so it starts on machines
// without a driver (BUILD-NOTES.md). Compiled only when CMake found the toolkit.
//
// Every call that needs a device first makes it current on the calling thread (cudaSetDevice
// is a cheap thread-local switch once the primary context exists). The primary context of a
// device is created by the first such call, which CudaDevices only makes for GPUs that have
// clients. Errors are classified once, in Classify().
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstring>
#include <mutex>

#include "daemon/device/cuda_api.h"

namespace ckpt::device {
namespace {

bool DeviceLost(cudaError_t e) {
  switch (e) {
    case cudaErrorDevicesUnavailable:
    case cudaErrorNoDevice:
    case cudaErrorECCUncorrectable:
    case cudaErrorNvlinkUncorrectable:
    case cudaErrorLaunchFailure:
    case cudaErrorIllegalAddress:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidPc:
    case cudaErrorSystemNotReady:
    case cudaErrorContextIsDestroyed:
    case cudaErrorInsufficientDriver:
    case cudaErrorStubLibrary:
      return true;
    default:
      return false;
  }
}

// `opening`: the call imports a handle a client sent, so an invalid-handle class of error means
// the handle is stale (its memory was freed, or it names another device).
Status Classify(cudaError_t e, std::string_view what, bool opening,
                const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  std::string msg = std::string(what) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) +
                    ") at " + file + ":" + std::to_string(line);
  if (e == cudaErrorMemoryAllocation) {
    return ResourceExhausted("out of GPU memory: " + msg);
  }
  if (DeviceLost(e)) return Unavailable("GPU lost or unusable: " + msg);
  if (opening) return FailedPrecondition("stale or invalid CUDA handle: " + msg);
  return Internal(msg);
}

Status ClassifyDriver(CUresult r, std::string_view what, bool opening,
                      const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  // Driver and runtime codes agree for the classes we distinguish.
  return Classify(static_cast<cudaError_t>(r), what, opening, file, line);
}

#define CKPT_CUDA_TRY(expr, what, opening)                     \
  do {                                                         \
    cudaError_t _e = (expr);                                   \
    if (_e != cudaSuccess) return Classify(_e, what, opening); \
  } while (0)

std::string FormatUuid(const unsigned char b[16]) {
  char out[64];
  std::snprintf(out, sizeof out,
                "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
                b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
                b[14], b[15]);
  return out;
}

// Driver entry points of the VMM import, resolved once on first use.
struct VmmDriver {
  decltype(&::cuMemImportFromShareableHandle) import_handle = nullptr;
  decltype(&::cuMemAddressReserve) reserve = nullptr;
  decltype(&::cuMemMap) map = nullptr;
  decltype(&::cuMemSetAccess) set_access = nullptr;
  decltype(&::cuMemUnmap) unmap = nullptr;
  decltype(&::cuMemAddressFree) address_free = nullptr;
  decltype(&::cuMemRelease) release = nullptr;
  Status loaded;
};

template <typename Fn>
Status Resolve(const char* symbol, Fn* out) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  cudaError_t e = cudaGetDriverEntryPointByVersion(symbol, &p, 12000, cudaEnableDefault, &found);
  if (e != cudaSuccess || found != cudaDriverEntryPointSuccess || p == nullptr) {
    return Unavailable(std::string("CUDA driver function ") + symbol +
                       " is not available (driver too old or missing)");
  }
  *out = reinterpret_cast<Fn>(p);
  return Status::Ok();
}

const VmmDriver& Vmm() {
  static VmmDriver d;
  static std::once_flag once;
  std::call_once(once, [] {
    Status s = Resolve("cuMemImportFromShareableHandle", &d.import_handle);
    if (s.ok()) s = Resolve("cuMemAddressReserve", &d.reserve);
    if (s.ok()) s = Resolve("cuMemMap", &d.map);
    if (s.ok()) s = Resolve("cuMemSetAccess", &d.set_access);
    if (s.ok()) s = Resolve("cuMemUnmap", &d.unmap);
    if (s.ok()) s = Resolve("cuMemAddressFree", &d.address_free);
    if (s.ok()) s = Resolve("cuMemRelease", &d.release);
    d.loaded = s;
  });
  return d;
}

class CudaRuntimeApi final : public CudaApi {
 public:
  Result<int> DeviceCount() override {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    // No driver or no GPU is a normal state of a CPU machine, not a failure.
    if (e == cudaErrorInsufficientDriver || e == cudaErrorNoDevice || e == cudaErrorStubLibrary) {
      return 0;
    }
    if (e != cudaSuccess) return Classify(e, "cudaGetDeviceCount", false);
    return n;
  }

  Result<std::string> DeviceUuid(int device) override {
    cudaDeviceProp prop;
    CKPT_CUDA_TRY(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties", false);
    return FormatUuid(reinterpret_cast<const unsigned char*>(prop.uuid.bytes));
  }

  Result<DevicePtr> OpenIpcMemHandle(int device, std::string_view handle) override {
    if (handle.size() != sizeof(cudaIpcMemHandle_t)) {
      return InvalidArgument("CUDA IPC memory handle of " + std::to_string(handle.size()) +
                             " bytes; expected " + std::to_string(sizeof(cudaIpcMemHandle_t)));
    }
    CKPT_CUDA_TRY(cudaSetDevice(device), "cudaSetDevice", false);
    cudaIpcMemHandle_t h;
    std::memcpy(&h, handle.data(), sizeof h);
    void* p = nullptr;
    CKPT_CUDA_TRY(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess),
                  "cudaIpcOpenMemHandle", true);
    return reinterpret_cast<DevicePtr>(p);
  }

  Status CloseIpcMemHandle(int device, DevicePtr ptr) override {
    CKPT_CUDA_TRY(cudaSetDevice(device), "cudaSetDevice", false);
    CKPT_CUDA_TRY(cudaIpcCloseMemHandle(reinterpret_cast<void*>(ptr)), "cudaIpcCloseMemHandle",
                  false);
    return Status::Ok();
  }

  Result<DevicePtr> ImportVmmFd(int device, int fd, uint64_t size) override {
    const VmmDriver& d = Vmm();
    RETURN_IF_ERROR(d.loaded);
    CKPT_CUDA_TRY(cudaSetDevice(device), "cudaSetDevice", false);
    CKPT_CUDA_TRY(cudaFree(nullptr), "creating the primary context", false);
    CUmemGenericAllocationHandle handle;
    CUresult r = d.import_handle(&handle, reinterpret_cast<void*>(static_cast<intptr_t>(fd)),
                                 CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    if (r != CUDA_SUCCESS) return ClassifyDriver(r, "cuMemImportFromShareableHandle", true);
    CUdeviceptr ptr = 0;
    r = d.reserve(&ptr, size, 0, 0, 0);
    if (r != CUDA_SUCCESS) {
      d.release(handle);
      return ClassifyDriver(r, "cuMemAddressReserve of " + std::to_string(size) + " bytes", false);
    }
    r = d.map(ptr, size, 0, handle, 0);
    // The mapping keeps the physical memory alive; our reference to the handle can go.
    d.release(handle);
    if (r != CUDA_SUCCESS) {
      d.address_free(ptr, size);
      return ClassifyDriver(r, "cuMemMap of " + std::to_string(size) + " bytes", true);
    }
    CUmemAccessDesc access = {};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = device;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    r = d.set_access(ptr, size, &access, 1);
    if (r != CUDA_SUCCESS) {
      d.unmap(ptr, size);
      d.address_free(ptr, size);
      return ClassifyDriver(r, "cuMemSetAccess", true);
    }
    return static_cast<DevicePtr>(ptr);
  }

  Status UnmapVmm(int device, DevicePtr ptr, uint64_t size) override {
    const VmmDriver& d = Vmm();
    RETURN_IF_ERROR(d.loaded);
    CKPT_CUDA_TRY(cudaSetDevice(device), "cudaSetDevice", false);
    CUresult r = d.unmap(static_cast<CUdeviceptr>(ptr), size);
    if (r != CUDA_SUCCESS) return ClassifyDriver(r, "cuMemUnmap", false);
    r = d.address_free(static_cast<CUdeviceptr>(ptr), size);
    if (r != CUDA_SUCCESS) return ClassifyDriver(r, "cuMemAddressFree", false);
    return Status::Ok();
  }

  Result<StreamHandle> CreateCopyStream(int device) override {
    CKPT_CUDA_TRY(cudaSetDevice(device), "cudaSetDevice", false);
    int least = 0, greatest = 0;
    CKPT_CUDA_TRY(cudaDeviceGetStreamPriorityRange(&least, &greatest),
                  "cudaDeviceGetStreamPriorityRange", false);
    cudaStream_t s = nullptr;
    // `least` is the numerically largest value: the lowest priority.
    CKPT_CUDA_TRY(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, least),
                  "cudaStreamCreateWithPriority", false);
    return static_cast<StreamHandle>(s);
  }

  void DestroyStream(int device, StreamHandle stream) override {
    if (cudaSetDevice(device) == cudaSuccess) cudaStreamDestroy(static_cast<cudaStream_t>(stream));
  }

  Result<EventHandle> CreateEvent(int device, bool interprocess) override {
    CKPT_CUDA_TRY(cudaSetDevice(device), "cudaSetDevice", false);
    unsigned flags = cudaEventDisableTiming | cudaEventBlockingSync;
    if (interprocess) flags |= cudaEventInterprocess;
    cudaEvent_t e = nullptr;
    CKPT_CUDA_TRY(cudaEventCreateWithFlags(&e, flags), "cudaEventCreateWithFlags", false);
    return static_cast<EventHandle>(e);
  }

  void DestroyEvent(int device, EventHandle event) override {
    if (cudaSetDevice(device) == cudaSuccess) cudaEventDestroy(static_cast<cudaEvent_t>(event));
  }

  Result<std::string> IpcEventHandle(int device, EventHandle event) override {
    CKPT_CUDA_TRY(cudaSetDevice(device), "cudaSetDevice", false);
    cudaIpcEventHandle_t h;
    CKPT_CUDA_TRY(cudaIpcGetEventHandle(&h, static_cast<cudaEvent_t>(event)),
                  "cudaIpcGetEventHandle", false);
    return std::string(reinterpret_cast<const char*>(&h), sizeof h);
  }

  Result<EventHandle> OpenIpcEventHandle(int device, std::string_view handle) override {
    if (handle.size() != sizeof(cudaIpcEventHandle_t)) {
      return InvalidArgument("CUDA IPC event handle of " + std::to_string(handle.size()) +
                             " bytes; expected " + std::to_string(sizeof(cudaIpcEventHandle_t)));
    }
    CKPT_CUDA_TRY(cudaSetDevice(device), "cudaSetDevice", false);
    cudaIpcEventHandle_t h;
    std::memcpy(&h, handle.data(), sizeof h);
    cudaEvent_t e = nullptr;
    CKPT_CUDA_TRY(cudaIpcOpenEventHandle(&e, h), "cudaIpcOpenEventHandle", true);
    return static_cast<EventHandle>(e);
  }

  Status RecordEvent(int device, EventHandle event, StreamHandle stream) override {
    CKPT_CUDA_TRY(cudaSetDevice(device), "cudaSetDevice", false);
    CKPT_CUDA_TRY(
        cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream)),
        "cudaEventRecord", false);
    return Status::Ok();
  }

  Status StreamWaitEvent(int device, StreamHandle stream, EventHandle event) override {
    CKPT_CUDA_TRY(cudaSetDevice(device), "cudaSetDevice", false);
    CKPT_CUDA_TRY(
        cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(event), 0),
        "cudaStreamWaitEvent", false);
    return Status::Ok();
  }

  Status SynchronizeEvent(int device, EventHandle event) override {
    CKPT_CUDA_TRY(cudaSetDevice(device), "cudaSetDevice", false);
    CKPT_CUDA_TRY(cudaEventSynchronize(static_cast<cudaEvent_t>(event)), "cudaEventSynchronize",
                  false);
    return Status::Ok();
  }

  Status CopyDeviceToHostAsync(int device, void* dst, DevicePtr src, uint64_t bytes,
                               StreamHandle stream) override {
    CKPT_CUDA_TRY(cudaSetDevice(device), "cudaSetDevice", false);
    CKPT_CUDA_TRY(cudaMemcpyAsync(dst, reinterpret_cast<const void*>(src), bytes,
                                  cudaMemcpyDeviceToHost, static_cast<cudaStream_t>(stream)),
                  "cudaMemcpyAsync device to host", false);
    return Status::Ok();
  }

  Status CopyHostToDeviceAsync(int device, DevicePtr dst, const void* src, uint64_t bytes,
                               StreamHandle stream) override {
    CKPT_CUDA_TRY(cudaSetDevice(device), "cudaSetDevice", false);
    CKPT_CUDA_TRY(cudaMemcpyAsync(reinterpret_cast<void*>(dst), src, bytes, cudaMemcpyHostToDevice,
                                  static_cast<cudaStream_t>(stream)),
                  "cudaMemcpyAsync host to device", false);
    return Status::Ok();
  }

  Status HostRegister(int device, void* ptr, uint64_t bytes) override {
    CKPT_CUDA_TRY(cudaSetDevice(device), "cudaSetDevice", false);
    CKPT_CUDA_TRY(cudaHostRegister(ptr, bytes, cudaHostRegisterPortable), "cudaHostRegister",
                  false);
    return Status::Ok();
  }

  Status HostUnregister(int device, void* ptr) override {
    CKPT_CUDA_TRY(cudaSetDevice(device), "cudaSetDevice", false);
    CKPT_CUDA_TRY(cudaHostUnregister(ptr), "cudaHostUnregister", false);
    return Status::Ok();
  }
};

}  // namespace

std::unique_ptr<CudaApi> CreateCudaRuntimeApi() { return std::make_unique<CudaRuntimeApi>(); }
bool CudaBackendCompiledIn() { return true; }

}  // namespace ckpt::device
