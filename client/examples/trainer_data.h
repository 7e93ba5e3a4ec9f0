// The example trainer's tensors and their contents, shared with the tests that check what it
// saved (ckpt_example_trainer, tests/integration/*).
//
// Each rank holds K int32 tensors "layers.<t>.weight". Tensor t is a row block of a global
// [world_size * rows, cols] tensor: rank r holds rows [r*rows, (r+1)*rows), so every checkpoint
// is genuinely sharded across ranks. The K shards lie in one memfd, each at a 4 KiB-aligned
// offset. Element i (row-major inside the shard) of tensor t at step s on rank r holds
// ElementValue(seed, r, s, t, i); GlobalElementValue gives the same value by global flat index,
// for tests that load under another layout. Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ckpt::example {

inline constexpr uint64_t kTrainerAlignment = 4096;
inline constexpr uint64_t kTrainerMaxCols = 1024;

struct TrainerTensor {
  std::string name;   // "layers.<t>.weight"
  uint64_t rows = 0;  // of this rank's shard
  uint64_t cols = 0;
  uint64_t fd_offset = 0;  // in the memfd
  uint64_t nbytes = 0;     // rows * cols * 4
};

struct TrainerLayout {
  uint32_t world_size = 1;
  std::vector<TrainerTensor> tensors;
  uint64_t memfd_bytes = 0;  // size of the memfd holding all shards

  // Global shape of every tensor: [world_size * rows, cols].
  std::vector<uint64_t> GlobalShape(const TrainerTensor& t) const {
    return {uint64_t{world_size} * t.rows, t.cols};
  }
};

// Splits about `bytes_per_rank` bytes into `tensors` int32 shards of equal shape: as close to
// bytes_per_rank / tensors bytes each as whole rows of at most kTrainerMaxCols columns allow
// (at least one element each).
inline TrainerLayout MakeTrainerLayout(uint64_t bytes_per_rank, uint32_t tensors,
                                       uint32_t world_size) {
  TrainerLayout layout;
  layout.world_size = world_size;
  const uint64_t per_tensor = tensors == 0 ? 0 : bytes_per_rank / tensors;
  const uint64_t elements = per_tensor / 4 == 0 ? 1 : per_tensor / 4;
  const uint64_t cols = elements < kTrainerMaxCols ? elements : kTrainerMaxCols;
  const uint64_t rows = elements / cols;
  const uint64_t nbytes = rows * cols * 4;
  const uint64_t stride = (nbytes + kTrainerAlignment - 1) / kTrainerAlignment * kTrainerAlignment;
  for (uint32_t t = 0; t < tensors; ++t) {
    layout.tensors.push_back(
        TrainerTensor{"layers." + std::to_string(t) + ".weight", rows, cols, t * stride, nbytes});
  }
  layout.memfd_bytes = uint64_t{tensors} * stride;
  return layout;
}

// splitmix64's finalizer.
inline uint64_t Mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// One key per (seed, rank, step, tensor); the elements of that shard derive from it.
inline uint64_t ShardKey(uint64_t seed, uint32_t rank, uint64_t step, uint32_t tensor) {
  return Mix64(Mix64(Mix64(Mix64(seed) ^ rank) ^ step) ^ tensor);
}

inline uint32_t ElementValueFromKey(uint64_t key, uint64_t i) {
  return static_cast<uint32_t>(Mix64(key ^ (i * 0xD6E8FEB86659FD93ull)));
}

// The value of element i (row-major inside rank's shard) of tensor t at step s.
inline uint32_t ElementValue(uint64_t seed, uint32_t rank, uint64_t step, uint32_t tensor,
                             uint64_t i) {
  return ElementValueFromKey(ShardKey(seed, rank, step, tensor), i);
}

// The same value addressed by the flat index in the global [world_size * rows, cols] tensor.
inline uint32_t GlobalElementValue(const TrainerLayout& layout, uint64_t seed, uint64_t step,
                                   uint32_t tensor, uint64_t global_index) {
  const TrainerTensor& t = layout.tensors.at(tensor);
  const uint64_t shard = t.rows * t.cols;
  return ElementValue(seed, static_cast<uint32_t>(global_index / shard), step, tensor,
                      global_index % shard);
}

// Writes the shard of tensor t of `rank` at `step`: count elements from element 0.
inline void FillShard(uint32_t* out, uint64_t count, uint64_t seed, uint32_t rank, uint64_t step,
                      uint32_t tensor) {
  const uint64_t key = ShardKey(seed, rank, step, tensor);
  for (uint64_t i = 0; i < count; ++i) out[i] = ElementValueFromKey(key, i);
}

}  // namespace ckpt::example
