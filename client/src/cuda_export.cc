#include "client/src/cuda_export.h"

#include <cstdio>

#if CKPT_HAVE_CUDA
#include <cuda.h>
#include <dlfcn.h>

#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <type_traits>

#include "common/mutex.h"
#endif

namespace ckpt::detail {

#if CKPT_HAVE_CUDA
namespace {

// Driver functions, with the prototypes of the CUDA 12 ABI (requested from cuGetProcAddress by
// base name and version 12000, which returns the variant these header prototypes describe).
struct Driver {
  decltype(&::cuInit) init = nullptr;
  decltype(&::cuGetErrorName) error_name = nullptr;
  decltype(&::cuPointerGetAttribute) pointer_attribute = nullptr;
  decltype(&::cuMemGetAddressRange) address_range = nullptr;
  decltype(&::cuIpcGetMemHandle) ipc_mem_handle = nullptr;
  decltype(&::cuMemRetainAllocationHandle) retain_handle = nullptr;
  decltype(&::cuMemExportToShareableHandle) export_handle = nullptr;
  decltype(&::cuMemRelease) release = nullptr;
  decltype(&::cuDeviceGet) device_get = nullptr;
  decltype(&::cuDeviceGetUuid) device_uuid = nullptr;
  decltype(&::cuDevicePrimaryCtxRetain) primary_ctx = nullptr;
  decltype(&::cuCtxPushCurrent) push = nullptr;
  decltype(&::cuCtxPopCurrent) pop = nullptr;
  decltype(&::cuEventCreate) event_create = nullptr;
  decltype(&::cuEventRecord) event_record = nullptr;
  decltype(&::cuIpcGetEventHandle) ipc_event_handle = nullptr;
  decltype(&::cuIpcOpenEventHandle) ipc_open_event = nullptr;
  decltype(&::cuStreamWaitEvent) stream_wait = nullptr;
  decltype(&::cuStreamGetCtx) stream_ctx = nullptr;
};

std::string Uuid(const CUuuid& u) {
  const auto* b = reinterpret_cast<const unsigned char*>(u.bytes);
  char out[64];
  std::snprintf(out, sizeof out,
                "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
                b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
                b[14], b[15]);
  return out;
}

class DriverExporter final : public CudaExporter {
 public:
  static Result<std::unique_ptr<DriverExporter>> Load() {
    void* lib = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      return Unavailable(std::string("CUDA tensors need the NVIDIA driver, and libcuda.so.1 "
                                     "cannot be loaded: ") +
                         ::dlerror());
    }
    auto get_proc =
        reinterpret_cast<decltype(&::cuGetProcAddress)>(::dlsym(lib, "cuGetProcAddress_v2"));
    if (get_proc == nullptr) {
      return Unavailable(
          "the NVIDIA driver is too old for ckptd's CUDA route (needs a CUDA 12+ "
          "driver: cuGetProcAddress_v2 is missing)");
    }
    auto e = std::unique_ptr<DriverExporter>(new DriverExporter());
    Driver& d = e->d_;
    Status s;
    auto resolve = [&](const char* name, auto* fn) {
      if (!s.ok()) return;
      void* p = nullptr;
      CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
      if (get_proc(name, &p, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &found) != CUDA_SUCCESS ||
          found != CU_GET_PROC_ADDRESS_SUCCESS || p == nullptr) {
        s = Unavailable(std::string("CUDA driver function ") + name + " is not available");
        return;
      }
      *fn = reinterpret_cast<std::remove_reference_t<decltype(*fn)>>(p);
    };
    resolve("cuInit", &d.init);
    resolve("cuGetErrorName", &d.error_name);
    resolve("cuPointerGetAttribute", &d.pointer_attribute);
    resolve("cuMemGetAddressRange", &d.address_range);
    resolve("cuIpcGetMemHandle", &d.ipc_mem_handle);
    resolve("cuMemRetainAllocationHandle", &d.retain_handle);
    resolve("cuMemExportToShareableHandle", &d.export_handle);
    resolve("cuMemRelease", &d.release);
    resolve("cuDeviceGet", &d.device_get);
    resolve("cuDeviceGetUuid", &d.device_uuid);
    resolve("cuDevicePrimaryCtxRetain", &d.primary_ctx);
    resolve("cuCtxPushCurrent", &d.push);
    resolve("cuCtxPopCurrent", &d.pop);
    resolve("cuEventCreate", &d.event_create);
    resolve("cuEventRecord", &d.event_record);
    resolve("cuIpcGetEventHandle", &d.ipc_event_handle);
    resolve("cuIpcOpenEventHandle", &d.ipc_open_event);
    resolve("cuStreamWaitEvent", &d.stream_wait);
    resolve("cuStreamGetCtx", &d.stream_ctx);
    RETURN_IF_ERROR(s);
    if (CUresult r = d.init(0); r != CUDA_SUCCESS) {
      return Unavailable("the CUDA driver does not initialize (" + e->Name(r) + "): no usable GPU");
    }
    return e;
  }

  Result<CudaExport> Export(const void* ptr, uint64_t nbytes) override {
    const auto dptr = reinterpret_cast<CUdeviceptr>(ptr);
    int ordinal = -1;
    if (CUresult r = d_.pointer_attribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, dptr);
        r != CUDA_SUCCESS) {
      return InvalidArgument("pointer " + Hex(dptr) +
                             " is not CUDA device memory of this "
                             "process (" +
                             Name(r) + ")");
    }
    ASSIGN_OR_RETURN(Device * dev, DeviceFor(ordinal));
    ContextScope scope(this, dev->ctx);
    RETURN_IF_ERROR(scope.status);
    CudaExport out;
    out.device = ordinal;
    out.device_uuid = dev->uuid;
    CUdeviceptr base = 0;
    size_t size = 0;
    if (CUresult r = d_.address_range(&base, &size, dptr); r != CUDA_SUCCESS) {
      return Error(r, "cuMemGetAddressRange of " + Hex(dptr));
    }
    out.allocation_size = size;
    out.offset = dptr - base;
    if (out.offset + nbytes > size) {
      return Unimplemented("tensor at " + Hex(dptr) + " (" + std::to_string(nbytes) +
                           " bytes) extends past its allocation of " + std::to_string(size) +
                           " bytes (a VMM segment made of several physical allocations is not "
                           "supported yet)");
    }
    int legacy = 0;
    d_.pointer_attribute(&legacy, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, dptr);
    if (legacy != 0) {
      CUipcMemHandle h;
      if (CUresult r = d_.ipc_mem_handle(&h, base); r != CUDA_SUCCESS) {
        return Error(r, "cuIpcGetMemHandle of allocation base " + Hex(base));
      }
      out.ipc_handle.assign(reinterpret_cast<const char*>(&h), sizeof h);
      return out;
    }
    uint64_t allowed = 0;
    d_.pointer_attribute(&allowed, CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES, dptr);
    if ((allowed & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) == 0) {
      return InvalidArgument("GPU memory at " + Hex(dptr) +
                             " can be shared neither by legacy "
                             "IPC nor as a POSIX fd (a VMM allocation created without "
                             "CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)");
    }
    CUmemGenericAllocationHandle handle;
    if (CUresult r = d_.retain_handle(&handle, reinterpret_cast<void*>(dptr)); r != CUDA_SUCCESS) {
      return Error(r, "cuMemRetainAllocationHandle of " + Hex(dptr));
    }
    int fd = -1;
    CUresult r = d_.export_handle(&fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    d_.release(handle);  // drops the reference the retain took
    if (r != CUDA_SUCCESS) return Error(r, "cuMemExportToShareableHandle");
    out.vmm = true;
    out.vmm_fd = UniqueFd(fd);
    return out;
  }

  Result<std::string> RecordSaveEvent(int device, void* stream) override {
    ASSIGN_OR_RETURN(Device * dev, DeviceFor(device));
    ContextScope scope(this, dev->ctx);
    RETURN_IF_ERROR(scope.status);
    MutexLock lock(dev->mu);
    if (dev->save_event == nullptr) {
      CUevent e = nullptr;
      if (CUresult r = d_.event_create(&e, CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING);
          r != CUDA_SUCCESS) {
        return Error(r, "cuEventCreate(interprocess) on GPU " + dev->uuid);
      }
      CUipcEventHandle h;
      if (CUresult r2 = d_.ipc_event_handle(&h, e); r2 != CUDA_SUCCESS) {
        return Error(r2, "cuIpcGetEventHandle on GPU " + dev->uuid);
      }
      dev->save_event = e;
      dev->save_handle.assign(reinterpret_cast<const char*>(&h), sizeof h);
    }
    CUstream s = StreamOn(dev, stream);
    if (CUresult r = d_.event_record(dev->save_event, s); r != CUDA_SUCCESS) {
      return Error(r, "cuEventRecord on GPU " + dev->uuid);
    }
    return dev->save_handle;
  }

  Status WaitLoaded(const std::string& device_uuid, const std::string& handle,
                    void* stream) override {
    Device* dev = nullptr;
    for (int i = 0; dev == nullptr && i < 64; ++i) {
      auto d = DeviceFor(i);
      if (!d.ok()) break;
      if ((*d)->uuid == device_uuid) dev = *d;
    }
    if (dev == nullptr)
      return NotFound("GPU " + device_uuid + " named by ckptd is not visible here");
    if (handle.size() != sizeof(CUipcEventHandle)) {
      return InvalidArgument("ckptd sent an event handle of " + std::to_string(handle.size()) +
                             " bytes");
    }
    ContextScope scope(this, dev->ctx);
    RETURN_IF_ERROR(scope.status);
    MutexLock lock(dev->mu);
    auto it = dev->loaded_events.find(handle);
    if (it == dev->loaded_events.end()) {
      CUipcEventHandle h;
      std::memcpy(&h, handle.data(), sizeof h);
      CUevent e = nullptr;
      if (CUresult r = d_.ipc_open_event(&e, h); r != CUDA_SUCCESS) {
        return Error(r, "cuIpcOpenEventHandle of ckptd's load event on GPU " + dev->uuid);
      }
      it = dev->loaded_events.emplace(handle, e).first;
    }
    if (CUresult r = d_.stream_wait(StreamOn(dev, stream), it->second, 0); r != CUDA_SUCCESS) {
      return Error(r, "cuStreamWaitEvent on GPU " + dev->uuid);
    }
    return Status::Ok();
  }

 private:
  struct Device {
    CUcontext ctx = nullptr;
    std::string uuid;
    Mutex mu;
    CUevent save_event GUARDED_BY(mu) = nullptr;
    std::string save_handle GUARDED_BY(mu);
    std::map<std::string, CUevent> loaded_events GUARDED_BY(mu);
  };
  // Pushes a context for the scope of one call.
  struct ContextScope {
    ContextScope(DriverExporter* e, CUcontext ctx) : exporter(e) {
      if (CUresult r = e->d_.push(ctx); r != CUDA_SUCCESS) {
        status = e->Error(r, "cuCtxPushCurrent");
      } else {
        pushed = true;
      }
    }
    ~ContextScope() {
      CUcontext ignored;
      if (pushed) exporter->d_.pop(&ignored);
    }
    DriverExporter* exporter;
    bool pushed = false;
    Status status;
  };

  Result<Device*> DeviceFor(int ordinal) {
    MutexLock lock(mu_);
    auto it = devices_.find(ordinal);
    if (it != devices_.end()) return it->second.get();
    CUdevice dev;
    if (CUresult r = d_.device_get(&dev, ordinal); r != CUDA_SUCCESS) {
      return Error(r, "cuDeviceGet(" + std::to_string(ordinal) + ")");
    }
    auto device = std::make_unique<Device>();
    CUuuid uuid;
    if (CUresult r = d_.device_uuid(&uuid, dev); r != CUDA_SUCCESS)
      return Error(r, "cuDeviceGetUuid");
    device->uuid = Uuid(uuid);
    // The primary context: the one the CUDA runtime (and so PyTorch) uses. Retained for the
    // life of the process.
    if (CUresult r = d_.primary_ctx(&device->ctx, dev); r != CUDA_SUCCESS) {
      return Error(r, "cuDevicePrimaryCtxRetain");
    }
    Device* raw = device.get();
    devices_.emplace(ordinal, std::move(device));
    return raw;
  }

  // `stream` if it belongs to the device's context, else the device's legacy default stream.
  CUstream StreamOn(Device* dev, void* stream) {
    auto s = static_cast<CUstream>(stream);
    if (s == nullptr) return nullptr;
    CUcontext ctx = nullptr;
    if (d_.stream_ctx(s, &ctx) != CUDA_SUCCESS || ctx != dev->ctx) return nullptr;
    return s;
  }

  std::string Name(CUresult r) const {
    const char* name = nullptr;
    if (d_.error_name != nullptr && d_.error_name(r, &name) == CUDA_SUCCESS && name != nullptr) {
      return name;
    }
    return "CUresult " + std::to_string(static_cast<int>(r));
  }
  Status Error(CUresult r, const std::string& what) const {
    return Internal(what + " failed: " + Name(r));
  }
  static std::string Hex(uint64_t v) {
    char b[32];
    std::snprintf(b, sizeof b, "0x%llx", static_cast<unsigned long long>(v));
    return b;
  }

  Driver d_;
  Mutex mu_;
  std::map<int, std::unique_ptr<Device>> devices_ GUARDED_BY(mu_);
};

}  // namespace

Result<CudaExporter*> CudaExporter::Get() {
  static std::once_flag once;
  static std::unique_ptr<DriverExporter> exporter;
  static Status error;
  std::call_once(once, [] {
    auto loaded = DriverExporter::Load();
    if (loaded.ok()) {
      exporter = std::move(loaded).value();
    } else {
      error = loaded.status();
    }
  });
  if (exporter == nullptr) return error;
  return static_cast<CudaExporter*>(exporter.get());
}

#else  // !CKPT_HAVE_CUDA

Result<CudaExporter*> CudaExporter::Get() {
  return Unimplemented(
      "this ckpt client was built without CUDA support (no CUDA toolkit at "
      "build time): CUDA tensors cannot be registered");
}

#endif

}  // namespace ckpt::detail
