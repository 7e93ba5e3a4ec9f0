// The kernel of ckpt_gpu_trainer (gpu_trainer.cc): writes byte i of a buffer as
// ExpectedByte(seed, i), after spinning a while so that it is still running when the trainer
// calls save(). Kept apart from the C++20 trainer (this CMake cannot ask nvcc for C++20).
#include "bench/gpu/fill_kernel.h"

namespace {

__device__ inline uint8_t Expected(uint64_t seed, uint64_t i) {
  uint64_t z = seed + (i / 8 + 1) * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<uint8_t>(z >> (8 * (i % 8)));
}

__global__ void Fill(uint8_t* p, uint64_t n, uint64_t seed, long long spin_cycles) {
  const long long start = clock64();
  while (clock64() - start < spin_cycles) {
  }
  for (uint64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    p[i] = Expected(seed, i);
  }
}

}  // namespace

int LaunchFill(uint8_t* p, uint64_t n, uint64_t seed, long long spin_cycles, void* stream) {
  Fill<<<256, 256, 0, static_cast<cudaStream_t>(stream)>>>(p, n, seed, spin_cycles);
  return static_cast<int>(cudaGetLastError());
}
