#include "daemon/capture_plan.h"

#include <sys/stat.h>

#include <unordered_set>

#include "common/manifest_io.h"
#include "common/names.h"

namespace ckpt {

Result<std::string> RegistrationFingerprint(std::span<const ckptd::v1::TensorSpec> specs,
                                            std::span<const UniqueFd> fds) {
  std::string fp;
  fp.reserve(specs.size() * 64);
  for (const auto& spec : specs) {
    ckptd::v1::TensorSpec copy = spec;
    if (copy.has_host()) {
      const uint32_t index = copy.host().fd_index();
      if (index >= fds.size()) {
        return InvalidArgument("tensor '" + EscapeForLog(spec.name()) + "' names descriptor " +
                               std::to_string(index) + " but only " + std::to_string(fds.size()) +
                               " were sent");
      }
      struct stat st;
      if (::fstat(fds[index].get(), &st) != 0) {
        return ErrnoStatus(errno, "fstat of the descriptor of tensor '" + EscapeForLog(spec.name()) + "'");
      }
      // Identity of the object, not the descriptor number.
      copy.mutable_host()->set_fd_index(0);
      fp += std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino) + ":" +
            std::to_string(st.st_size) + "|";
    }
    fp += copy.SerializeAsString();
    fp += '\n';
  }
  return fp;
}

Result<std::shared_ptr<const CapturePlan>> BuildCapturePlan(
    std::span<const ckptd::v1::TensorSpec> specs, std::span<const UniqueFd> fds,
    MappingCache& cache, const LayoutOptions& layout_options) {
  if (specs.size() > kMaxTensorsPerRegistration) {
    return InvalidArgument(std::to_string(specs.size()) + " tensors in one registration; the limit is " +
                           std::to_string(kMaxTensorsPerRegistration));
  }
  if (fds.size() > kMaxFdsPerRegistration) {
    return InvalidArgument(std::to_string(fds.size()) + " descriptors in one registration; the limit is " +
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
    if (!spec.has_host()) {
      return Unimplemented(ctx + ": only host memory is supported by this daemon build");
    }
    const auto& host = spec.host();
    if (host.length() != expect) {
      return InvalidArgument(ctx + ": memory length " + std::to_string(host.length()) + " but " +
                             geometry.ToString() + " of " + std::string(dtype.name) + " is " +
                             std::to_string(expect) + " bytes");
    }
    ASSIGN_OR_RETURN(auto mapping, cache.Get(fds[host.fd_index()].get()), ctx);
    if (host.offset() > mapping->size() || host.length() > mapping->size() - host.offset()) {
      return OutOfRange(ctx + ": bytes [" + std::to_string(host.offset()) + ", " +
                        std::to_string(host.offset() + host.length()) +
                        ") lie outside its shared memory object of " +
                        std::to_string(mapping->size()) + " bytes");
    }
    sizes.push_back(expect);
    plan->total_bytes += expect;
    plan->tensors.push_back(RegisteredTensor{
        spec.name(), dtype, std::move(geometry),
        std::make_shared<HostShardMemory>(std::move(mapping), host.offset(), host.length())});
  }
  ASSIGN_OR_RETURN(plan->layout, PlanDataFile(sizes, layout_options));
  return std::shared_ptr<const CapturePlan>(std::move(plan));
}

}  // namespace ckpt
