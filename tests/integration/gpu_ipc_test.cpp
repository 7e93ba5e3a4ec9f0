// [gpu] tests of the CUDA IPC handoff with real processes: a real ckptd and a real GPU trainer
// (bench/gpu/gpu_trainer.cc) that writes pseudo-random bytes with a kernel on its own stream,
// saves WITHOUT a host synchronize, overwrites the memory after wait_snapshot, and waits for the
// commit. The checkpoint on disk must hold the pre-mutation bytes — through the legacy IPC route
// (cudaMalloc) and the VMM route (cuMemCreate, POSIX fd). A second trainer process then loads the
// step into fresh GPU memory and checks it bit for bit.
//
// Skipped, with a message, where there is no GPU (no libcuda.so.1 or no device): CI machines.
#include "tests/integration/daemon_harness.h"

#include <dlfcn.h>

#include <iostream>

#include "bench/gpu/fill_kernel.h"

namespace ckpt::itest {
namespace {

// GPUs visible through the driver, without linking it; 0 when there is no driver.
int VisibleGpus() {
  void* lib = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) return 0;
  using InitFn = int (*)(unsigned);
  using CountFn = int (*)(int*);
  auto init = reinterpret_cast<InitFn>(::dlsym(lib, "cuInit"));
  auto count = reinterpret_cast<CountFn>(::dlsym(lib, "cuDeviceGetCount"));
  int n = 0;
  if (init == nullptr || count == nullptr || init(0) != 0 || count(&n) != 0) n = 0;
  return n;
}

// Without a GPU a [gpu] test is skipped, and ctest must say so rather than count it as passed:
// the marker line makes ctest report it as "Skipped" (SKIP_REGULAR_EXPRESSION,
// tests/CMakeLists.txt).
bool SkipWithoutGpu() {
  if (VisibleGpus() > 0) return false;
  std::cout << "CKPT-TEST-SKIPPED: [gpu] needs an NVIDIA driver and GPU; the CUDA IPC path is "
               "only compiled here (run bench/gpu/run.sh on a GPU machine)"
            << std::endl;
  return true;
}

void SaveMutateAndLoad(const std::string& route) {
  if (SkipWithoutGpu()) return;
  const std::string trainer = RequireBinary("ckpt_gpu_trainer");
  ckpt::testing::TempDir dir;
  DaemonProcess daemon(DaemonProcess::InDir(dir));
  constexpr uint64_t kBytes = (48ull << 20) + 12345;  // many slots, a ragged end
  constexpr uint64_t kSeed = 77;
  const std::vector<std::string> common = {
      "--socket", daemon.socket(),        "--job",  "gpu" + route,         "--route", route,
      "--bytes",  std::to_string(kBytes), "--seed", std::to_string(kSeed), "--step",  "5"};
  {
    auto args = common;
    args.insert(args.end(), {"--mode", "save"});
    ChildProcess save(trainer, args, dir / "save.log");
    const int status = save.Wait();
    INFO("trainer (save) " << DescribeWaitStatus(status) << "\n" << save.Log());
    REQUIRE(ExitedWith(status, 0));
  }
  const auto bytes = ReadWholeTensor(StepDir(daemon.root(), "gpu" + route, 5), "w");
  REQUIRE(bytes.size() == kBytes);
  uint64_t mismatches = 0, first = 0;
  for (uint64_t i = 0; i < kBytes; ++i) {
    if (static_cast<uint8_t>(bytes[i]) != ExpectedByte(kSeed, i) && mismatches++ == 0) first = i;
  }
  INFO("first mismatching byte " << first);
  CHECK(mismatches == 0);
  {
    auto args = common;
    args.insert(args.end(), {"--mode", "load"});
    ChildProcess load(trainer, args, dir / "load.log");
    const int status = load.Wait();
    INFO("trainer (load) " << DescribeWaitStatus(status) << "\n" << load.Log());
    CHECK(ExitedWith(status, 0));
  }
}

TEST_CASE(
    "GPU save without host sync captures the bytes the trainer's kernel wrote, legacy IPC "
    "route, and H2D load is bit-exact",
    "[gpu]") {
  SaveMutateAndLoad("legacy");
}

TEST_CASE(
    "GPU save without host sync captures the bytes the trainer's kernel wrote, VMM fd "
    "route, and H2D load is bit-exact",
    "[gpu]") {
  SaveMutateAndLoad("vmm");
}

// Runs everywhere: on a daemon without a usable CUDA backend (CI: no driver), CUDA memory and
// CUDA events are refused per request, clearly, and the session goes on.
TEST_CASE(
    "A daemon without GPUs refuses CUDA registrations and save events with clear errors "
    "and keeps the session",
    "[gpu_protocol]") {
  ckpt::testing::TempDir dir;
  DaemonProcess daemon(DaemonProcess::InDir(dir));
  if (VisibleGpus() > 0) {
    WARN("this machine has a GPU: the no-backend replies are not what it answers");
    return;
  }
  RawConnection raw(daemon.socket());
  raw.Hello("nogpu");
  ckptd::v1::ClientMessage reg;
  auto* spec = reg.mutable_register_()->add_tensors();
  spec->set_name("w");
  spec->set_dtype("float32");
  spec->add_global_shape(16);
  spec->mutable_geometry()->mutable_box()->add_offsets(0);
  spec->mutable_geometry()->mutable_box()->add_lengths(16);
  auto* cuda = spec->mutable_cuda();
  cuda->set_ipc_handle(std::string(64, 'h'));
  cuda->set_allocation_size(1 << 20);
  cuda->set_length(64);
  cuda->set_device_uuid("GPU-00000000-0000-0000-0000-000000000001");
  raw.Send(reg);
  auto reply = raw.Next();
  REQUIRE(reply.has_value());
  REQUIRE(reply->has_error());
  CHECK(reply->error().code() == static_cast<uint32_t>(StatusCode::kUnimplemented));
  CHECK_THAT(reply->error().message(),
             Catch::Matchers::Contains("tensor 'w'") && Catch::Matchers::Contains("CUDA"));

  ckptd::v1::ClientMessage save;
  save.mutable_save()->set_step(1);
  auto* event = save.mutable_save()->add_cuda_events();
  event->set_device_uuid("GPU-00000000-0000-0000-0000-000000000001");
  event->set_ipc_event_handle(std::string(64, 'e'));
  raw.Send(save);
  reply = raw.Next();
  REQUIRE(reply.has_value());
  REQUIRE(reply->has_error());
  CHECK(reply->error().code() == static_cast<uint32_t>(StatusCode::kFailedPrecondition));
  CHECK_THAT(reply->error().message(), Catch::Matchers::Contains("CUDA events"));

  // The session is still usable.
  ckptd::v1::ClientMessage latest;
  latest.mutable_latest();
  raw.Send(latest);
  reply = raw.Next();
  REQUIRE(reply.has_value());
  CHECK(reply->has_latest());
}

}  // namespace
}  // namespace ckpt::itest
