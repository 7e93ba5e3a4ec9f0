// The CUDA capture and load paths end to end inside one process, with the fake driver and the
// real CaptureEngine, FlushEngine, HostPool and data files: the event-ordering protocol (the
// daemon's copies run after the trainer's pending writes, with no host synchronize), chunked
// D2H with per-slot fences handed to the flush engine, a shard larger than the pool streaming
// through it, device loss mid-capture, and H2D load with the "loaded" event.
#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <future>
#include <iterator>
#include <random>

#include "common/checksum.h"
#include "common/file_system.h"
#include "daemon/capture_engine.h"
#include "daemon/capture_plan.h"
#include "daemon/device/cuda_backend.h"
#include "daemon/device/host_fd_backend.h"
#include "daemon/flush_engine.h"
#include "daemon/host_pool.h"
#include "tests/test_util.h"
#include "tests/unit/device/fake_cuda_api.h"

namespace ckpt::device {
namespace {

using Catch::Matchers::Contains;
using testing::FakeCudaApi;
namespace pb = ckptd::v1;

constexpr uint64_t kSlot = 16384;
const LayoutOptions kLayout{.checksum_chunk = 4096, .slot_size = kSlot};

pb::TensorSpec CudaSpec(const std::string& name, uint64_t bytes, const std::string& uuid,
                        const std::string& handle, uint64_t alloc_size, uint64_t offset) {
  pb::TensorSpec s;
  s.set_name(name);
  s.set_dtype("uint8");
  s.add_global_shape(bytes);
  auto* box = s.mutable_geometry()->mutable_box();
  box->add_offsets(0);
  box->add_lengths(bytes);
  auto* c = s.mutable_cuda();
  c->set_ipc_handle(handle);
  c->set_allocation_size(alloc_size);
  c->set_offset(offset);
  c->set_length(bytes);
  c->set_device_uuid(uuid);
  return s;
}

std::vector<std::byte> Random(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::byte> out(n);
  for (auto& b : out) b = static_cast<std::byte>(rng());
  return out;
}

std::vector<std::byte> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(raw.size());
  std::memcpy(out.data(), raw.data(), raw.size());
  return out;
}

// A daemon's capture side with the fake GPU: pool of `slots`, engines, one client backend.
struct Rig {
  ckpt::testing::TempDir dir;
  FakeCudaApi* fake = nullptr;
  std::unique_ptr<HostPool> pool;
  std::unique_ptr<CudaDevices> devices;
  std::unique_ptr<FlushEngine> flush;
  std::unique_ptr<CaptureEngine> capture;
  std::unique_ptr<CudaBackend> backend;

  explicit Rig(uint32_t slots) {
    auto api = std::make_unique<FakeCudaApi>(1);
    fake = api.get();
    auto p = HostPool::Create({slots * kSlot, kSlot, false});
    REQUIRE_OK(p);
    pool = std::move(p).value();
    auto d = CudaDevices::Create(std::move(api), pool.get());
    REQUIRE_OK(d);
    devices = std::move(d).value();
    flush = std::make_unique<FlushEngine>(FlushEngine::Config{2}, pool.get(), nullptr);
    capture = std::make_unique<CaptureEngine>(CaptureEngine::Config{1}, pool.get(), flush.get());
    flush->Start();
    capture->Start();
    backend = std::make_unique<CudaBackend>(devices.get());
  }
  ~Rig() {
    capture->Stop();
    flush->Stop();
    backend.reset();
  }
  std::string uuid() const { return devices->uuids().at(0); }

  struct Outcome {
    std::shared_ptr<CaptureJob> job;
    std::future<Status> captured;
    std::future<Status> persisted;
  };
  Outcome Submit(std::shared_ptr<const CapturePlan> plan, const std::string& name) {
    auto job = std::make_shared<CaptureJob>();
    job->job = "job";
    job->step = 1;
    job->plan = std::move(plan);
    job->step_dir = dir.path();
    job->data_path = dir / name;
    job->data_file = name;
    job->fs = PosixFileSystem();
    auto captured = std::make_shared<std::promise<Status>>();
    auto persisted = std::make_shared<std::promise<Status>>();
    job->on_captured = [captured](Status s) { captured->set_value(std::move(s)); };
    job->on_persisted = [persisted](Status s) { persisted->set_value(std::move(s)); };
    Outcome out{job, captured->get_future(), persisted->get_future()};
    capture->Submit(job);
    return out;
  }
};

TEST_CASE(
    "Capture copies wait on the trainer's event: the checkpoint holds the bytes the "
    "trainer's pending kernel wrote before save",
    "[device][cuda_capture]") {
  Rig rig(8);
  constexpr uint64_t kBytes = 3 * kSlot + 1000;
  const std::string handle = rig.fake->NewIpcAllocation(0, kBytes, std::byte{0xAA});
  auto alloc = rig.fake->ipc_allocation(handle);
  HostFdBackend host;
  auto plan = BuildCapturePlan(
      std::vector<pb::TensorSpec>{CudaSpec("w", kBytes, rig.uuid(), handle, kBytes, 0)}, {},
      MemoryBackends{&host, rig.backend.get()}, kLayout);
  REQUIRE_OK(plan);

  // The trainer: a kernel (held behind a gate, i.e. still running on the GPU) writes the values
  // to be saved; then save() records the event after it and sends its handle.
  const auto expected = Random(kBytes, ckpt::testing::TestSeed());
  FakeCudaApi::Gate kernel_running;
  StreamHandle trainer = rig.fake->TrainerStream(0);
  rig.fake->EnqueueKernel(trainer, &kernel_running,
                          [&] { std::memcpy(alloc->bytes.data(), expected.data(), kBytes); });
  pb::CudaEvent event;
  event.set_device_uuid(rig.uuid());
  event.set_ipc_event_handle(rig.fake->RecordTrainerEvent(0, trainer));
  REQUIRE_OK(rig.backend->WaitForClientEvent(event));  // what Session::HandleSave does

  auto out = rig.Submit(*plan, "rank-00000.data");
  // The copy stream is parked on the trainer's event: nothing can have been captured yet.
  CHECK(out.job->bytes_captured.load() == 0);
  kernel_running.Open();
  REQUIRE_OK(out.captured.get());
  REQUIRE_OK(out.persisted.get());

  const auto file = ReadFile(rig.dir / "rank-00000.data");
  REQUIRE(file.size() >= kBytes);
  CHECK(std::memcmp(file.data(), expected.data(), kBytes) == 0);
  // Chunked: one D2H per slot, each completed by its fence, every slot back in the pool.
  CHECK(rig.fake->d2h_copies() == 4);
  CHECK(rig.pool->free_slots() == rig.pool->slot_count());
  // The checksums the flush engine computed are those of the trainer's bytes.
  CHECK(out.job->checksums[0][0] == Xxh3(expected.data(), 4096));
  CHECK(out.job->bytes_captured.load() == (*plan)->layout.file_size);
}

TEST_CASE("A GPU shard larger than the whole pool streams through it slot by slot",
          "[device][cuda_capture]") {
  Rig rig(2);  // 2 slots; the shard needs 6
  constexpr uint64_t kBytes = 6 * kSlot;
  const std::string handle = rig.fake->NewIpcAllocation(0, kBytes + 8192);
  auto alloc = rig.fake->ipc_allocation(handle);
  const auto expected = Random(kBytes, ckpt::testing::TestSeed() + 1);
  std::memcpy(alloc->bytes.data() + 8192, expected.data(), kBytes);
  HostFdBackend host;
  auto plan = BuildCapturePlan(
      std::vector<pb::TensorSpec>{CudaSpec("big", kBytes, rig.uuid(), handle, kBytes + 8192, 8192)},
      {}, MemoryBackends{&host, rig.backend.get()}, kLayout);
  REQUIRE_OK(plan);
  auto out = rig.Submit(*plan, "big.data");
  REQUIRE_OK(out.captured.get());
  REQUIRE_OK(out.persisted.get());
  const auto file = ReadFile(rig.dir / "big.data");
  REQUIRE(file.size() >= kBytes);
  CHECK(std::memcmp(file.data(), expected.data(), kBytes) == 0);
  CHECK(rig.pool->free_slots() == 2);
}

TEST_CASE("Host and GPU tensors in one registration are captured into one data file",
          "[device][cuda_capture]") {
  Rig rig(4);
  const std::string handle = rig.fake->NewIpcAllocation(0, 8192);
  auto gpu_bytes = Random(8192, 7);
  std::memcpy(rig.fake->ipc_allocation(handle)->bytes.data(), gpu_bytes.data(), 8192);
  UniqueFd memfd(::memfd_create("host-part", MFD_CLOEXEC));
  auto host_bytes = Random(4096, 8);
  REQUIRE(::pwrite(memfd.get(), host_bytes.data(), 4096, 0) == 4096);
  pb::TensorSpec h;
  h.set_name("h");
  h.set_dtype("uint8");
  h.add_global_shape(4096);
  h.mutable_geometry()->mutable_box()->add_offsets(0);
  h.mutable_geometry()->mutable_box()->add_lengths(4096);
  h.mutable_host()->set_fd_index(0);
  h.mutable_host()->set_length(4096);
  std::vector<UniqueFd> fds;
  fds.push_back(std::move(memfd));
  HostFdBackend host;
  auto plan = BuildCapturePlan(
      std::vector<pb::TensorSpec>{h, CudaSpec("g", 8192, rig.uuid(), handle, 8192, 0)}, fds,
      MemoryBackends{&host, rig.backend.get()}, kLayout);
  REQUIRE_OK(plan);
  auto out = rig.Submit(*plan, "mixed.data");
  REQUIRE_OK(out.captured.get());
  REQUIRE_OK(out.persisted.get());
  const auto file = ReadFile(rig.dir / "mixed.data");
  const auto& offsets = (*plan)->layout.shard_offsets;
  CHECK(std::memcmp(file.data() + offsets[0], host_bytes.data(), 4096) == 0);
  CHECK(std::memcmp(file.data() + offsets[1], gpu_bytes.data(), 8192) == 0);
}

TEST_CASE(
    "A GPU lost during capture fails the rank's capture with a clear error and returns "
    "every slot",
    "[device][cuda_capture]") {
  // The trainer's event never completes before the device is lost. Declared before the rig: the
  // trainer stream's thread may still be inside Pass() after Open() below, until the rig's
  // streams are joined.
  FakeCudaApi::Gate never;
  Rig rig(4);
  constexpr uint64_t kBytes = 3 * kSlot;
  const std::string handle = rig.fake->NewIpcAllocation(0, kBytes);
  HostFdBackend host;
  auto plan = BuildCapturePlan(
      std::vector<pb::TensorSpec>{CudaSpec("w", kBytes, rig.uuid(), handle, kBytes, 0)}, {},
      MemoryBackends{&host, rig.backend.get()}, kLayout);
  REQUIRE_OK(plan);
  StreamHandle trainer = rig.fake->TrainerStream(0);
  rig.fake->EnqueueKernel(trainer, &never, [] {});
  pb::CudaEvent event;
  event.set_device_uuid(rig.uuid());
  event.set_ipc_event_handle(rig.fake->RecordTrainerEvent(0, trainer));
  REQUIRE_OK(rig.backend->WaitForClientEvent(event));
  rig.fake->SetDeviceLost(0);
  auto out = rig.Submit(*plan, "lost.data");
  Status captured = out.captured.get();
  CHECK(captured.code() == StatusCode::kUnavailable);
  CHECK_THAT(captured.message(), Contains("GPU lost") && Contains("tensor 'w'"));
  Status persisted = out.persisted.get();
  CHECK_FALSE(persisted.ok());
  CHECK(rig.pool->free_slots() == rig.pool->slot_count());
  never.Open();  // let the trainer stream finish
}

TEST_CASE("Load copies host bytes into GPU memory bit-exactly and signals the loaded event",
          "[device][cuda_capture]") {
  Rig rig(2);
  constexpr uint64_t kBytes = 20000;
  const std::string handle = rig.fake->NewIpcAllocation(0, kBytes + 100);
  HostFdBackend host;
  auto plan = BuildCapturePlan(
      std::vector<pb::TensorSpec>{CudaSpec("w", kBytes, rig.uuid(), handle, kBytes + 100, 100)}, {},
      MemoryBackends{&host, rig.backend.get()}, kLayout);
  REQUIRE_OK(plan);
  const auto src = Random(kBytes, 99);
  ShardMemory& memory = *(*plan)->tensors[0].memory;
  REQUIRE_OK(memory.CopyIn(0, src.data(), 12000));
  REQUIRE_OK(memory.CopyIn(12000, src.data() + 12000, kBytes - 12000));
  auto alloc = rig.fake->ipc_allocation(handle);
  CHECK(std::memcmp(alloc->bytes.data() + 100, src.data(), kBytes) == 0);
  CHECK(alloc->bytes[99] == std::byte{0});  // nothing written before the shard

  auto events = CudaBackend::SignalLoaded({&memory});
  REQUIRE_OK(events);
  REQUIRE(events->size() == 1);
  CHECK((*events)[0].device_uuid() == rig.uuid());
  CHECK((*events)[0].ipc_event_handle().size() == kIpcHandleBytes);

  // Out-of-range copies are refused, not performed.
  CHECK(memory.CopyIn(kBytes - 10, src.data(), 20).code() == StatusCode::kOutOfRange);
}

}  // namespace
}  // namespace ckpt::device
