// CudaBackend and CudaDevices (daemon/device/) with the fake driver: the mapping cache and its
// invalidation, contexts only on GPUs with clients, pool registration, disconnect cleanup and the
// per-client errors (stale handle, unknown GPU, out of memory, device lost, bad sizes).
#include "daemon/device/cuda_backend.h"

#include <unistd.h>

#include <cstring>

#include "daemon/capture_plan.h"
#include "daemon/device/host_fd_backend.h"
#include "daemon/host_pool.h"
#include "tests/test_util.h"
#include "tests/unit/device/fake_cuda_api.h"

namespace ckpt::device {
namespace {

using Catch::Matchers::Contains;
using testing::FakeCudaApi;
namespace pb = ckptd::v1;

const LayoutOptions kLayout{.checksum_chunk = 4096, .slot_size = 16384};

struct Rig {
  FakeCudaApi* fake = nullptr;
  std::unique_ptr<HostPool> pool;
  std::unique_ptr<CudaDevices> devices;

  explicit Rig(int gpus = 2) {
    auto api = std::make_unique<FakeCudaApi>(gpus);
    fake = api.get();
    auto p = HostPool::Create({1 << 20, 16384, false});
    REQUIRE_OK(p);
    pool = std::move(p).value();
    auto d = CudaDevices::Create(std::move(api), pool.get());
    REQUIRE_OK(d);
    devices = std::move(d).value();
    REQUIRE(devices != nullptr);
  }
  std::string uuid(int i) const { return devices->uuids().at(i); }
};

pb::TensorSpec CudaSpec(const std::string& name, uint64_t numel_f32, const std::string& uuid,
                        const std::string& handle, uint64_t alloc_size, uint64_t offset) {
  pb::TensorSpec s;
  s.set_name(name);
  s.set_dtype("float32");
  s.add_global_shape(numel_f32);
  auto* box = s.mutable_geometry()->mutable_box();
  box->add_offsets(0);
  box->add_lengths(numel_f32);
  auto* c = s.mutable_cuda();
  c->set_ipc_handle(handle);
  c->set_allocation_size(alloc_size);
  c->set_offset(offset);
  c->set_length(numel_f32 * 4);
  c->set_device_uuid(uuid);
  return s;
}

Result<std::shared_ptr<const CapturePlan>> Build(const std::vector<pb::TensorSpec>& specs,
                                                 CudaBackend& cuda,
                                                 std::span<const UniqueFd> fds = {}) {
  HostFdBackend host;
  return BuildCapturePlan(specs, fds, MemoryBackends{&host, &cuda}, kLayout);
}

TEST_CASE("CudaDevices enumerates GPUs without creating any context", "[device]") {
  Rig rig;
  CHECK(rig.devices->device_count() == 2);
  CHECK(rig.fake->contexts(0) == 0);
  CHECK(rig.fake->contexts(1) == 0);
  CHECK(rig.fake->host_registers() == 0);
  CHECK(rig.devices->active_uuids().empty());
}

TEST_CASE("CudaDevices::Create returns no backend when the runtime sees no GPU", "[device]") {
  auto none = CudaDevices::Create(std::make_unique<FakeCudaApi>(0), nullptr);
  REQUIRE_OK(none);
  CHECK(*none == nullptr);
  auto no_api = CudaDevices::Create(nullptr, nullptr);
  REQUIRE_OK(no_api);
  CHECK(*no_api == nullptr);
}

TEST_CASE(
    "A GPU gets a context, a copy stream and the pool registration only when a client "
    "names it",
    "[device]") {
  Rig rig;
  const std::string h = rig.fake->NewIpcAllocation(1, 1 << 16);
  CudaBackend backend(rig.devices.get());
  auto plan = Build({CudaSpec("w", 1024, rig.uuid(1), h, 1 << 16, 0)}, backend);
  REQUIRE_OK(plan);
  CHECK(rig.fake->contexts(0) == 0);
  CHECK(rig.fake->contexts(1) == 1);
  CHECK(rig.fake->host_registers() == 1);
  CHECK(rig.devices->pool_registered());
  CHECK(rig.devices->active_uuids() == std::vector<std::string>{rig.uuid(1)});

  // A second GPU: its own context, but the pool stays registered once (portable).
  const std::string h0 = rig.fake->NewIpcAllocation(0, 1 << 16);
  REQUIRE_OK(Build({CudaSpec("w", 1024, rig.uuid(1), h, 1 << 16, 0),
                    CudaSpec("v", 1024, rig.uuid(0), h0, 1 << 16, 0)},
                   backend));
  CHECK(rig.fake->contexts(0) == 1);
  CHECK(rig.fake->contexts(1) == 1);
  CHECK(rig.fake->host_registers() == 1);
}

TEST_CASE(
    "Mappings are opened once per handle, reused on re-registration and closed when no "
    "tensor uses them",
    "[device]") {
  Rig rig;
  const std::string a = rig.fake->NewIpcAllocation(0, 1 << 16);
  CudaBackend backend(rig.devices.get());
  // Two tensors inside one allocation: one open.
  auto plan = Build({CudaSpec("x", 1024, rig.uuid(0), a, 1 << 16, 0),
                     CudaSpec("y", 1024, rig.uuid(0), a, 1 << 16, 8192)},
                    backend);
  REQUIRE_OK(plan);
  CHECK(rig.fake->ipc_opens() == 1);
  CHECK(backend.cached() == 1);

  // The same registration again: the cache answers, nothing is opened.
  auto again = Build({CudaSpec("x", 1024, rig.uuid(0), a, 1 << 16, 0)}, backend);
  REQUIRE_OK(again);
  CHECK(rig.fake->ipc_opens() == 1);

  // The trainer freed and re-allocated: a new handle (maybe at the same address) is a new
  // mapping; the old one closes once no plan holds it.
  const std::string b = rig.fake->NewIpcAllocation(0, 1 << 16);
  auto replaced = Build({CudaSpec("x", 1024, rig.uuid(0), b, 1 << 16, 0)}, backend);
  REQUIRE_OK(replaced);
  CHECK(rig.fake->ipc_opens() == 2);
  plan = Status(StatusCode::kCancelled, "dropped");
  again = Status(StatusCode::kCancelled, "dropped");
  backend.DropUnused();
  CHECK(rig.fake->ipc_closes() == 1);
  CHECK(backend.cached() == 1);
}

TEST_CASE(
    "Disconnect clears the client's cache, a capture still holding a mapping keeps it open "
    "until it finishes",
    "[device]") {
  Rig rig;
  const std::string a = rig.fake->NewIpcAllocation(0, 1 << 16);
  auto backend = std::make_unique<CudaBackend>(rig.devices.get());
  auto plan = Build({CudaSpec("x", 1024, rig.uuid(0), a, 1 << 16, 0)}, *backend);
  REQUIRE_OK(plan);
  std::shared_ptr<const CapturePlan> in_flight = *plan;  // as a capture job holds it
  plan = Status(StatusCode::kCancelled, "dropped");
  backend->Clear();
  backend.reset();
  CHECK(rig.fake->ipc_closes() == 0);
  in_flight.reset();
  CHECK(rig.fake->ipc_closes() == 1);
}

TEST_CASE("One legacy handle registered by two clients is opened once per process", "[device]") {
  Rig rig;
  const std::string a = rig.fake->NewIpcAllocation(0, 1 << 16);
  CudaBackend first(rig.devices.get()), second(rig.devices.get());
  auto p1 = Build({CudaSpec("x", 1024, rig.uuid(0), a, 1 << 16, 0)}, first);
  auto p2 = Build({CudaSpec("x", 1024, rig.uuid(0), a, 1 << 16, 4096)}, second);
  REQUIRE_OK(p1);
  REQUIRE_OK(p2);
  CHECK(rig.fake->ipc_opens() == 1);
  first.Clear();
  p1 = Status(StatusCode::kCancelled, "dropped");
  CHECK(rig.fake->ipc_closes() == 0);  // the second client still uses it
  second.Clear();
  p2 = Status(StatusCode::kCancelled, "dropped");
  CHECK(rig.fake->ipc_closes() == 1);
}

TEST_CASE("The VMM route imports the fd once per exported object and unmaps on release",
          "[device]") {
  Rig rig;
  const int fd = rig.fake->NewVmmAllocation(1, 1 << 16, std::byte{7});
  std::vector<UniqueFd> fds;
  fds.emplace_back(::dup(fd));
  fds.emplace_back(::dup(fd));  // the same object under a second descriptor number
  auto spec = [&](const std::string& name, uint32_t index, uint64_t offset) {
    auto s = CudaSpec(name, 1024, rig.uuid(1), "", 1 << 16, offset);
    s.mutable_cuda()->set_vmm_fd_index(index);
    return s;
  };
  auto backend = std::make_unique<CudaBackend>(rig.devices.get());
  auto plan = Build({spec("x", 0, 0), spec("y", 1, 4096)}, *backend, fds);
  REQUIRE_OK(plan);
  CHECK(rig.fake->vmm_imports() == 1);
  std::vector<std::byte> out(4096);
  REQUIRE_OK((*plan)->tensors[1].memory->CopyOut(0, out.data(), out.size()));
  CHECK(out[0] == std::byte{7});
  plan = Status(StatusCode::kCancelled, "dropped");
  backend.reset();
  CHECK(rig.fake->vmm_unmaps() == 1);
  ::close(fd);
}

TEST_CASE("CUDA registration errors are clear, per client and name the tensor", "[device]") {
  Rig rig;
  const std::string a = rig.fake->NewIpcAllocation(0, 1 << 16);
  CudaBackend backend(rig.devices.get());

  SECTION("stale handle (freed memory)") {
    rig.fake->Free(a);
    auto plan = Build({CudaSpec("gone", 1024, rig.uuid(0), a, 1 << 16, 0)}, backend);
    REQUIRE_FALSE(plan.ok());
    CHECK(plan.status().code() == StatusCode::kFailedPrecondition);
    CHECK_THAT(plan.status().message(), Contains("tensor 'gone'") && Contains("stale"));
  }
  SECTION("a GPU this daemon cannot see") {
    auto plan = Build(
        {CudaSpec("w", 1024, "GPU-ffffffff-0000-0000-0000-000000000000", a, 1 << 16, 0)}, backend);
    REQUIRE_FALSE(plan.ok());
    CHECK(plan.status().code() == StatusCode::kNotFound);
    CHECK_THAT(plan.status().message(),
               Contains("tensor 'w'") && Contains("GPU-ffffffff") && Contains(rig.uuid(0)));
    CHECK(rig.fake->contexts(0) == 0);
  }
  SECTION("out of GPU memory while mapping") {
    rig.fake->FailNextMappingWithOom();
    auto plan = Build({CudaSpec("big", 1024, rig.uuid(0), a, 1 << 16, 0)}, backend);
    REQUIRE_FALSE(plan.ok());
    CHECK(plan.status().code() == StatusCode::kResourceExhausted);
    CHECK_THAT(plan.status().message(), Contains("tensor 'big'") && Contains("out of GPU memory"));
  }
  SECTION("device lost") {
    rig.fake->SetDeviceLost(0);
    auto plan = Build({CudaSpec("w", 1024, rig.uuid(0), a, 1 << 16, 0)}, backend);
    REQUIRE_FALSE(plan.ok());
    CHECK(plan.status().code() == StatusCode::kUnavailable);
    CHECK_THAT(plan.status().message(), Contains("tensor 'w'") && Contains("GPU lost"));
  }
  SECTION("shard outside its allocation") {
    auto plan = Build({CudaSpec("w", 1024, rig.uuid(0), a, 1 << 16, (1 << 16) - 100)}, backend);
    REQUIRE_FALSE(plan.ok());
    CHECK(plan.status().code() == StatusCode::kOutOfRange);
    CHECK_THAT(plan.status().message(), Contains("tensor 'w'") && Contains("65536"));
  }
  SECTION("handle of the wrong size") {
    auto plan = Build({CudaSpec("w", 1024, rig.uuid(0), "short", 1 << 16, 0)}, backend);
    REQUIRE_FALSE(plan.ok());
    CHECK(plan.status().code() == StatusCode::kInvalidArgument);
    CHECK_THAT(plan.status().message(), Contains("tensor 'w'") && Contains("64"));
  }
  SECTION("no handle at all") {
    auto s = CudaSpec("w", 1024, rig.uuid(0), a, 1 << 16, 0);
    s.mutable_cuda()->clear_ipc_handle();
    auto plan = Build({s}, backend);
    REQUIRE_FALSE(plan.ok());
    CHECK(plan.status().code() == StatusCode::kInvalidArgument);
  }
  SECTION("VMM fd index past the descriptors") {
    auto s = CudaSpec("w", 1024, rig.uuid(0), "", 1 << 16, 0);
    s.mutable_cuda()->set_vmm_fd_index(3);
    auto plan = Build({s}, backend);
    REQUIRE_FALSE(plan.ok());
    CHECK_THAT(plan.status().message(), Contains("tensor 'w'") && Contains("descriptor 3"));
  }
  CHECK(backend.cached() == 0);
}

TEST_CASE("CUDA memory is refused with UNIMPLEMENTED by a daemon without the backend", "[device]") {
  HostFdBackend host;
  auto plan = BuildCapturePlan(
      std::vector<pb::TensorSpec>{CudaSpec("w", 16, "GPU-x", std::string(64, 'h'), 64, 0)}, {},
      MemoryBackends{&host, nullptr}, kLayout);
  REQUIRE_FALSE(plan.ok());
  CHECK(plan.status().code() == StatusCode::kUnimplemented);
  CHECK_THAT(plan.status().message(), Contains("tensor 'w'") && Contains("CUDA backend"));
}

TEST_CASE("A save's event handle is opened once per client and stale handles are refused",
          "[device]") {
  Rig rig;
  CudaBackend backend(rig.devices.get());
  StreamHandle trainer = rig.fake->TrainerStream(0);
  EventHandle event = nullptr;
  pb::CudaEvent e;
  e.set_device_uuid(rig.uuid(0));
  e.set_ipc_event_handle(rig.fake->RecordTrainerEvent(0, trainer, &event));
  REQUIRE_OK(backend.WaitForClientEvent(e));
  REQUIRE_OK(backend.WaitForClientEvent(e));
  CHECK(rig.fake->ipc_event_opens() == 1);
  CHECK(backend.cached_events() == 1);

  pb::CudaEvent stale = e;
  stale.set_ipc_event_handle(std::string(64, 'z'));
  Status st = backend.WaitForClientEvent(stale);
  CHECK(st.code() == StatusCode::kFailedPrecondition);
  CHECK_THAT(st.message(), Contains("event") && Contains(rig.uuid(0)));

  pb::CudaEvent short_handle = e;
  short_handle.set_ipc_event_handle("abc");
  CHECK(backend.WaitForClientEvent(short_handle).code() == StatusCode::kInvalidArgument);

  const int live = rig.fake->live_events();
  backend.Clear();
  CHECK(backend.cached_events() == 0);
  CHECK(rig.fake->live_events() == live - 1);
  rig.fake->DestroyEvent(0, event);  // the trainer's own event, as the trainer would at exit
}

}  // namespace
}  // namespace ckpt::device
