#include "daemon/device/host_fd_backend.h"

#include <string>

namespace ckpt {

Result<std::shared_ptr<ShardMemory>> HostFdBackend::Open(const ckptd::v1::TensorSpec& spec,
                                                         std::span<const UniqueFd> fds,
                                                         uint64_t expected_bytes) {
  if (!spec.has_host()) return InvalidArgument("not host memory");
  const auto& host = spec.host();
  if (host.length() != expected_bytes) {
    return InvalidArgument("memory length " + std::to_string(host.length()) +
                           " but its geometry "
                           "and dtype make " +
                           std::to_string(expected_bytes) + " bytes");
  }
  if (host.fd_index() >= fds.size()) {
    return InvalidArgument("names descriptor " + std::to_string(host.fd_index()) + " but only " +
                           std::to_string(fds.size()) + " were sent");
  }
  ASSIGN_OR_RETURN(auto mapping, cache_->Get(fds[host.fd_index()].get()));
  if (host.offset() > mapping->size() || host.length() > mapping->size() - host.offset()) {
    return OutOfRange("bytes [" + std::to_string(host.offset()) + ", " +
                      std::to_string(host.offset() + host.length()) +
                      ") lie outside its shared memory object of " +
                      std::to_string(mapping->size()) + " bytes");
  }
  return std::shared_ptr<ShardMemory>(
      std::make_shared<HostShardMemory>(std::move(mapping), host.offset(), host.length()));
}

}  // namespace ckpt
