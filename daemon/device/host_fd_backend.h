// HostFdBackend: the DeviceBackend of host memory shared by descriptor (docs/design.md §3.1):
// each distinct object is mapped once per session through a MappingCache (daemon/host_memory.h)
// and a shard is a byte range of it. The CPU path of every test runs through here.
#pragma once

#include "daemon/device/device_backend.h"
#include "daemon/host_memory.h"

namespace ckpt {

class HostFdBackend final : public DeviceBackend {
 public:
  HostFdBackend() = default;
  // Uses an outside cache (tests, older callers) instead of its own.
  explicit HostFdBackend(MappingCache* cache) : cache_(cache) {}

  std::string_view kind() const override { return "host-fd"; }
  Result<std::shared_ptr<ShardMemory>> Open(const ckptd::v1::TensorSpec& spec,
                                            std::span<const UniqueFd> fds,
                                            uint64_t expected_bytes) override;
  void DropUnused() override { cache_->DropUnused(); }
  void Clear() override { cache_->Clear(); }
  size_t cached() const override { return cache_->size(); }

 private:
  MappingCache own_;
  MappingCache* cache_ = &own_;
};

}  // namespace ckpt
