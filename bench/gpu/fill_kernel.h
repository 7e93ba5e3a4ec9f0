// The trainer's data kernel, callable from C++ (bench/gpu/fill_kernel.cu).
#pragma once

#include <cstdint>

// Enqueues on `stream` (a cudaStream_t): spin `spin_cycles` GPU clocks, then
// p[i] = ExpectedByte(seed, i) for i < n. Returns the launch's cudaError_t (0 = success).
int LaunchFill(uint8_t* p, uint64_t n, uint64_t seed, long long spin_cycles, void* stream);

// Byte i of the data for `seed` (splitmix64 of the 8-byte word index), as the kernel writes it.
inline uint8_t ExpectedByte(uint64_t seed, uint64_t i) {
  uint64_t z = seed + (i / 8 + 1) * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<uint8_t>(z >> (8 * (i % 8)));
}
