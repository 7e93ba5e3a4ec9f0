#include "daemon/capture_plan.h"

#include <sys/stat.h>

#include <unordered_set>

#include "common/manifest_io.h"
#include "common/names.h"
#include "daemon/device/host_fd_backend.h"

namespace ckpt {

Result<std::string> RegistrationFingerprint(std::span<const ckptd::v1::TensorSpec> specs,
                                            std::span<const UniqueFd> fds) {
  std::string fp;
  fp.reserve(specs.size() * 64);
  // Identity of a descriptor's object, not the descriptor number.
  auto object_identity = [&](const ckptd::v1::TensorSpec& spec,
                             uint32_t index) -> Result<std::string> {
    if (index >= fds.size()) {
      return InvalidArgument("tensor '" + EscapeForLog(spec.name()) + "' names descriptor " +
                             std::to_string(index) + " but only " + std::to_string(fds.size()) +
                             " were sent");
    }
    struct stat st;
    if (::fstat(fds[index].get(), &st) != 0) {
      return ErrnoStatus(errno,
                         "fstat of the descriptor of tensor '" + EscapeForLog(spec.name()) + "'");
    }
    return std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino) + ":" +
           std::to_string(st.st_size) + "|";
  };
  for (const auto& spec : specs) {
    ckptd::v1::TensorSpec copy = spec;
    if (copy.has_host()) {
      ASSIGN_OR_RETURN(std::string id, object_identity(spec, copy.host().fd_index()));
      copy.mutable_host()->set_fd_index(0);
      fp += id;
    } else if (copy.has_cuda() && copy.cuda().has_vmm_fd_index()) {
      ASSIGN_OR_RETURN(std::string id, object_identity(spec, copy.cuda().vmm_fd_index()));
      copy.mutable_cuda()->set_vmm_fd_index(0);
      fp += id;
    }
    fp += copy.SerializeAsString();
    fp += '\n';
  }
  return fp;
}

Result<std::shared_ptr<const CapturePlan>> BuildCapturePlan(
    std::span<const ckptd::v1::TensorSpec> specs, std::span<const UniqueFd> fds,
    const MemoryBackends& backends, const LayoutOptions& layout_options) {
  if (specs.size() > kMaxTensorsPerRegistration) {
    return InvalidArgument(std::to_string(specs.size()) +
                           " tensors in one registration; the limit is " +
                           std::to_string(kMaxTensorsPerRegistration));
  }
  if (fds.size() > kMaxFdsPerRegistration) {
    return InvalidArgument(std::to_string(fds.size()) +
                           " descriptors in one registration; the limit is " +
                           std::to_string(kMaxFdsPerRegistration));
  }
  auto plan = std::make_shared<CapturePlan>();
  ASSIGN_OR_RETURN(plan->fingerprint, RegistrationFingerprint(specs, fds));
  plan->tensors.reserve(specs.size());
  std::unordered_set<std::string_view> names;
  std::vector<uint64_t> sizes;
  sizes.reserve(specs.size());
  for (const auto& spec : specs) {
    RETURN_IF_ERROR(ValidateTensorName(spec.name()));
    const std::string ctx = "tensor '" + EscapeForLog(spec.name()) + "'";
    if (!names.insert(spec.name()).second) return InvalidArgument(ctx + " is registered twice");
    ASSIGN_OR_RETURN(DTypeInfo dtype, LookupDType(spec.dtype()), ctx);
    Shape shape(spec.global_shape().begin(), spec.global_shape().end());
    ASSIGN_OR_RETURN(ShardGeometry geometry, GeometryFromProto(spec.geometry(), shape), ctx);
    ASSIGN_OR_RETURN(const uint64_t expect, ByteSize(geometry.numel(), dtype), ctx);
    // The whole tensor's size must be countable too, or manifests and tools could not say it.
    RETURN_IF_ERROR(ByteSize(ShapeNumel(shape).value(), dtype).status(),
                    ctx + ": global shape " + geometry.ToString());
    DeviceBackend* backend = nullptr;
    uint64_t length = 0;
    if (spec.has_host()) {
      backend = backends.host;
      length = spec.host().length();
    } else if (spec.has_cuda()) {
      backend = backends.cuda;
      length = spec.cuda().length();
      if (backend == nullptr) {
        return Unimplemented(ctx +
                             ": CUDA memory needs the CUDA backend, and this daemon has "
                             "none (built without CUDA, or no GPU/driver on this machine)");
      }
    }
    if (backend == nullptr) {
      return Unimplemented(ctx + ": no memory handle, or a kind this daemon does not support");
    }
    if (length != expect) {
      return InvalidArgument(ctx + ": memory length " + std::to_string(length) + " but " +
                             geometry.ToString() + " of " + std::string(dtype.name) + " is " +
                             std::to_string(expect) + " bytes");
    }
    ASSIGN_OR_RETURN(std::shared_ptr<ShardMemory> memory, backend->Open(spec, fds, expect), ctx);
    sizes.push_back(expect);
    plan->total_bytes += expect;
    plan->tensors.push_back(RegisteredTensor{spec.name(), dtype, std::move(geometry),
                                             std::move(memory), spec.partial()});
  }
  ASSIGN_OR_RETURN(plan->layout, PlanDataFile(sizes, layout_options));
  return std::shared_ptr<const CapturePlan>(std::move(plan));
}

Result<std::shared_ptr<const CapturePlan>> BuildCapturePlan(
    std::span<const ckptd::v1::TensorSpec> specs, std::span<const UniqueFd> fds,
    MappingCache& cache, const LayoutOptions& layout) {
  HostFdBackend host(&cache);
  return BuildCapturePlan(specs, fds, MemoryBackends{&host, nullptr}, layout);
}

}  // namespace ckpt
