// CapturePlan: what one rank registered, validated, mapped and laid out — everything a save
// needs, computed once at registration and reused by every later save while the registration
// is unchanged (docs/design.md §2.2: "registering an unchanged set again is free").
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ckptd/v1/local.pb.h"
#include "common/data_layout.h"
#include "common/dtype.h"
#include "common/frame_io.h"
#include "common/geometry.h"
#include "daemon/device/device_backend.h"
#include "daemon/host_memory.h"
#include "daemon/shard_memory.h"

namespace ckpt {

struct RegisteredTensor {
  std::string name;
  DTypeInfo dtype;
  ShardGeometry geometry;
  std::shared_ptr<ShardMemory> memory;
  bool partial = false;  // saved in part on purpose (TensorSpec.partial)
  uint64_t bytes() const { return memory->size(); }
};

struct CapturePlan {
  std::vector<RegisteredTensor> tensors;
  // Registered but left to another rank holding an exact replica (the coordinator's writer
  // plan): listed in the node manifest so that the commit checks someone wrote them.
  std::vector<RegisteredTensor> skipped;
  // The registration whose writer plan gave `skipped` (ReportRegistrationRequest.registration_id;
  // NodeManifest.skipped_under), when the coordinator checks that registration's layout; 0 when
  // it does not (an older coordinator), and reports then list `skipped`.
  uint64_t skipped_under = 0;
  DataFileLayout layout;  // of the rank's data file; shard i is tensors[i]
  uint64_t total_bytes = 0;
  std::string fingerprint;  // equal fingerprints ⇔ same registration
};

// Limits on one registration.
inline constexpr size_t kMaxTensorsPerRegistration = 1'000'000;
inline constexpr size_t kMaxFdsPerRegistration = 65'536;

// The backends that open each kind of memory of one session; a null backend means that kind is
// not supported by this daemon (kUnimplemented naming the tensor).
struct MemoryBackends {
  DeviceBackend* host = nullptr;
  DeviceBackend* cuda = nullptr;
};

// Validates every spec (name, dtype, geometry inside the global shape, length = numel × element
// size, duplicate names) and opens its memory through the backend of its kind (which checks the
// byte range against the descriptor or allocation). Errors name the tensor. `fds` are the
// descriptors received with the registration, indexed by HostMemory.fd_index and
// CudaMemory.vmm_fd_index.
Result<std::shared_ptr<const CapturePlan>> BuildCapturePlan(
    std::span<const ckptd::v1::TensorSpec> specs, std::span<const UniqueFd> fds,
    const MemoryBackends& backends, const LayoutOptions& layout);
// Host memory only, mapped through `cache`.
Result<std::shared_ptr<const CapturePlan>> BuildCapturePlan(
    std::span<const ckptd::v1::TensorSpec> specs, std::span<const UniqueFd> fds,
    MappingCache& cache, const LayoutOptions& layout);

// The fingerprint BuildCapturePlan would compute, without mapping anything (cheap check for an
// unchanged re-registration).
Result<std::string> RegistrationFingerprint(std::span<const ckptd::v1::TensorSpec> specs,
                                            std::span<const UniqueFd> fds);

}  // namespace ckpt
