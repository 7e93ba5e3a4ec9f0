// ckpt_gpu_trainer: a minimal GPU trainer for the [gpu] tests and the GPU benchmark
// (tests/integration/gpu_ipc_test.cpp, bench/gpu/run.sh). Needs a GPU; built wherever the CUDA
// toolkit is (so a compile break fails CI), run only on GPU machines.
//
//   --mode save   allocate (--route legacy: cudaMalloc | vmm: cuMemCreate exportable as a POSIX
//                 fd), write pseudo-random bytes with a deliberately slow kernel on the trainer's
//                 stream, register, save WITHOUT any host synchronize (the kernel may still be
//                 running), wait_snapshot, then overwrite the memory with another kernel and
//                 wait until the step is committed. The checkpoint must hold the first bytes.
//   --mode load   allocate zeroed memory, register, load the step, copy it back on the same
//                 stream and compare bit for bit with the expected bytes (exit 3 on mismatch).
//   --mode bench  D2H capture throughput through ckptd vs a plain cudaMemcpyAsync of the same
//                 bytes into pinned memory, and the trainer-visible stall of save+wait_snapshot.
//
// Bytes: byte i of the shard is ExpectedByte(seed, i) (fill_kernel.h), on host and device.
// Driver functions (VMM) are reached through cudaGetDriverEntryPointByVersion.
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench/gpu/fill_kernel.h"
#include "ckpt/client.h"

namespace {

#define CHECK_CUDA(expr)                                                                        \
  do {                                                                                          \
    cudaError_t _e = (expr);                                                                    \
    if (_e != cudaSuccess) {                                                                    \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorName(_e)); \
      std::exit(2);                                                                             \
    }                                                                                           \
  } while (0)

void CheckOk(const ckpt::Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, s.ToString().c_str());
    std::exit(2);
  }
}

template <typename Fn>
Fn Driver(const char* name) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult q;
  CHECK_CUDA(cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &q));
  if (q != cudaDriverEntryPointSuccess) {
    std::fprintf(stderr, "driver function %s not found\n", name);
    std::exit(2);
  }
  return reinterpret_cast<Fn>(p);
}

// A VMM allocation exportable as a POSIX fd (what PyTorch's expandable segments use).
uint8_t* AllocVmm(uint64_t bytes, uint64_t* mapped) {
  auto create = Driver<decltype(&::cuMemCreate)>("cuMemCreate");
  auto granularity =
      Driver<decltype(&::cuMemGetAllocationGranularity)>("cuMemGetAllocationGranularity");
  auto reserve = Driver<decltype(&::cuMemAddressReserve)>("cuMemAddressReserve");
  auto map = Driver<decltype(&::cuMemMap)>("cuMemMap");
  auto access = Driver<decltype(&::cuMemSetAccess)>("cuMemSetAccess");
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  size_t g = 0;
  if (granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS) std::exit(2);
  const uint64_t size = (bytes + g - 1) / g * g;
  CUmemGenericAllocationHandle h;
  if (create(&h, size, &prop, 0) != CUDA_SUCCESS) std::exit(2);
  CUdeviceptr ptr = 0;
  if (reserve(&ptr, size, 0, 0, 0) != CUDA_SUCCESS) std::exit(2);
  if (map(ptr, size, 0, h, 0) != CUDA_SUCCESS) std::exit(2);
  CUmemAccessDesc desc = {};
  desc.location = prop.location;
  desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if (access(ptr, size, &desc, 1) != CUDA_SUCCESS) std::exit(2);
  *mapped = size;
  return reinterpret_cast<uint8_t*>(ptr);
}

struct Args {
  std::string socket, job = "gpu", mode = "save", route = "legacy";
  uint64_t bytes = 64ull << 20, seed = 1, step = 1, reps = 5;
  long long spin = 200'000'000;  // ~0.1 s at ~2 GHz
};

Args Parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--socket")
      a.socket = v;
    else if (k == "--job")
      a.job = v;
    else if (k == "--mode")
      a.mode = v;
    else if (k == "--route")
      a.route = v;
    else if (k == "--bytes")
      a.bytes = std::stoull(v);
    else if (k == "--seed")
      a.seed = std::stoull(v);
    else if (k == "--step")
      a.step = std::stoull(v);
    else if (k == "--reps")
      a.reps = std::stoull(v);
    else if (k == "--spin")
      a.spin = std::stoll(v);
    else {
      std::fprintf(stderr, "unknown flag %s\n", k.c_str());
      std::exit(2);
    }
  }
  return a;
}

constexpr uint64_t kShardOffset = 256;  // the shard starts inside the allocation

double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = Parse(argc, argv);
  CHECK_CUDA(cudaSetDevice(0));
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  uint8_t* base = nullptr;
  uint64_t mapped = 0;
  if (a.route == "vmm") {
    base = AllocVmm(a.bytes + kShardOffset, &mapped);
  } else {
    void* raw = nullptr;
    CHECK_CUDA(cudaMalloc(&raw, a.bytes + kShardOffset));
    base = static_cast<uint8_t*>(raw);
  }
  CHECK_CUDA(cudaMemsetAsync(base, 0, a.bytes + kShardOffset, stream));
  uint8_t* shard = base + kShardOffset;

  ckpt::ClientOptions options;
  options.socket = a.socket;
  options.job = a.job;
  auto client = ckpt::Client::Connect(options);
  CheckOk(client.status(), "connect");
  ckpt::CudaTensor t;
  t.name = "w";
  t.dtype = "uint8";
  t.global_shape = {a.bytes};
  t.device_ptr = shard;
  t.nbytes = a.bytes;
  CheckOk((*client)->Register({}, std::span<const ckpt::CudaTensor>(&t, 1)), "register");

  if (a.mode == "save") {
    CHECK_CUDA(static_cast<cudaError_t>(LaunchFill(shard, a.bytes, a.seed, a.spin, stream)));
    // No host synchronize: the kernel is most likely still spinning.
    CheckOk((*client)->Save(a.step, "", ckpt::OnFull::kWait, stream), "save");
    CheckOk((*client)->WaitSnapshot(), "wait_snapshot");
    CHECK_CUDA(static_cast<cudaError_t>(
        LaunchFill(shard, a.bytes, a.seed + 1000, 0, stream)));  // the "optimizer step"
    CHECK_CUDA(cudaStreamSynchronize(stream));
    CheckOk((*client)->Wait(a.step, ckpt::WaitState::kCommitted), "wait committed");
    std::printf("saved step %llu (%s route)\n", static_cast<unsigned long long>(a.step),
                a.route.c_str());
    return 0;
  }
  if (a.mode == "load") {
    auto loaded = (*client)->Load(a.step, true, stream);
    CheckOk(loaded.status(), "load");
    std::vector<uint8_t> host(a.bytes);
    CHECK_CUDA(cudaMemcpyAsync(host.data(), shard, a.bytes, cudaMemcpyDeviceToHost, stream));
    CHECK_CUDA(cudaStreamSynchronize(stream));
    for (uint64_t i = 0; i < a.bytes; ++i) {
      if (host[i] != ExpectedByte(a.seed, i)) {
        std::fprintf(stderr, "load mismatch at byte %llu: %u != %u\n",
                     static_cast<unsigned long long>(i), host[i], ExpectedByte(a.seed, i));
        return 3;
      }
    }
    std::printf("loaded step %llu bit-exact (%llu bytes)\n",
                static_cast<unsigned long long>(a.step), static_cast<unsigned long long>(a.bytes));
    return 0;
  }
  if (a.mode == "bench") {
    CHECK_CUDA(static_cast<cudaError_t>(LaunchFill(shard, a.bytes, a.seed, 0, stream)));
    CHECK_CUDA(cudaStreamSynchronize(stream));
    // Baseline: the same bytes with one cudaMemcpyAsync into pinned memory.
    void* pinned = nullptr;
    CHECK_CUDA(cudaHostAlloc(&pinned, a.bytes, cudaHostAllocDefault));
    double best_copy = 1e30;
    for (uint64_t r = 0; r < a.reps; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      CHECK_CUDA(cudaMemcpyAsync(pinned, shard, a.bytes, cudaMemcpyDeviceToHost, stream));
      CHECK_CUDA(cudaStreamSynchronize(stream));
      best_copy = std::min(best_copy, Seconds(t0, std::chrono::steady_clock::now()));
    }
    // ckptd: save → wait_snapshot is the capture; the save call alone is the trainer's stall
    // when forward/backward outlasts the capture.
    double best_capture = 1e30, worst_save_call = 0;
    for (uint64_t r = 0; r < a.reps; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      CheckOk((*client)->Save(a.step + r, "", ckpt::OnFull::kWait, stream), "save");
      auto t1 = std::chrono::steady_clock::now();
      CheckOk((*client)->WaitSnapshot(), "wait_snapshot");
      auto t2 = std::chrono::steady_clock::now();
      best_capture = std::min(best_capture, Seconds(t0, t2));
      worst_save_call = std::max(worst_save_call, Seconds(t0, t1));
      CheckOk((*client)->Wait(a.step + r, ckpt::WaitState::kPersisted), "wait persisted");
    }
    const double gb = static_cast<double>(a.bytes) / 1e9;
    std::printf("| measure | value |\n|---|---|\n");
    std::printf("| bytes per capture | %llu |\n", static_cast<unsigned long long>(a.bytes));
    std::printf("| plain cudaMemcpyAsync D2H to pinned (best of %llu) | %.2f GB/s |\n",
                static_cast<unsigned long long>(a.reps), gb / best_copy);
    std::printf("| ckptd capture save→wait_snapshot (best of %llu) | %.2f GB/s |\n",
                static_cast<unsigned long long>(a.reps), gb / best_capture);
    std::printf("| **capture / plain copy** (goal >= 0.8) | **%.3f** |\n",
                best_copy / best_capture);
    std::printf("| trainer stall of save() (worst) | %.3f ms |\n", worst_save_call * 1e3);
    std::printf("| stall of save() / plain copy time | %.4f |\n", worst_save_call / best_copy);
    CHECK_CUDA(cudaFreeHost(pinned));
    return 0;
  }
  std::fprintf(stderr, "unknown --mode %s\n", a.mode.c_str());
  return 2;
}
