// The model the coordinator tests save and load (see coordinator_rank.cc): K row-split int32
// matrices plus one replicated matrix, values a pure function of (step, tensor, element).
// Shared by the rank program and the tests, which compute the bytes they expect on disk.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "ckpt/client.h"

namespace ckpt::testing {

class CoordinatorModel {
 public:
  static constexpr uint64_t kCols = 1024;
  static constexpr uint64_t kEmbedRows = 64;

  struct Tensor {
    std::string name;
    uint64_t rows;        // global rows
    uint64_t row0;        // first row this rank holds
    uint64_t local_rows;  // rows this rank holds
    uint64_t offset;      // in the rank's memory
    uint32_t id;
    uint64_t bytes() const { return local_rows * kCols * 4; }
  };

  // `tp` row slices; this rank holds slice rank % tp. Row counts are multiples of 16 so that
  // tp ∈ {1, 2, 4, 8, 16} all divide them.
  CoordinatorModel(uint32_t tensors, uint32_t tp, uint32_t rank) {
    uint64_t offset = 0;
    for (uint32_t k = 0; k <= tensors; ++k) {
      Tensor t;
      t.id = k;
      if (k < tensors) {
        t.name = "layers." + std::to_string(k) + ".weight";
        t.rows = 16 * (k + 1);
        t.local_rows = t.rows / tp;
        t.row0 = (rank % tp) * t.local_rows;
      } else {
        t.name = "embed.weight";
        t.rows = kEmbedRows;
        t.local_rows = t.rows;
        t.row0 = 0;
      }
      t.offset = offset;
      offset += t.bytes();
      tensors_.push_back(t);
    }
    total_ = offset;
  }

  uint64_t total_bytes() const { return total_; }
  const std::vector<Tensor>& tensors() const { return tensors_; }

  // Bytes of one copy of every tensor (what write-once stores).
  static uint64_t UniqueBytes(uint32_t tensors) {
    uint64_t sum = kEmbedRows * kCols * 4;
    for (uint32_t k = 0; k < tensors; ++k) sum += 16 * (k + 1) * kCols * 4;
    return sum;
  }

  static uint32_t Value(uint64_t step, uint32_t tensor, uint64_t index) {
    uint64_t x = step * 0x9E3779B97F4A7C15ull ^ (uint64_t{tensor} << 40) ^ index;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return static_cast<uint32_t>(x ^ (x >> 31));
  }

  std::vector<HostTensor> Specs(int fd) const {
    std::vector<HostTensor> out;
    for (const Tensor& t : tensors_) {
      HostTensor h;
      h.name = t.name;
      h.dtype = "int32";
      h.global_shape = {t.rows, kCols};
      h.offsets = {t.row0, 0};
      h.lengths = {t.local_rows, kCols};
      h.fd = fd;
      h.fd_offset = t.offset;
      h.nbytes = t.bytes();
      out.push_back(h);
    }
    return out;
  }

  void Fill(std::byte* base, uint64_t step) const {
    for (const Tensor& t : tensors_) {
      auto* p = reinterpret_cast<uint32_t*>(base + t.offset);
      const uint64_t first = t.row0 * kCols;
      for (uint64_t i = 0; i < t.local_rows * kCols; ++i) p[i] = Value(step, t.id, first + i);
    }
  }

  uint64_t CountMismatches(const std::byte* base, uint64_t step) const {
    uint64_t bad = 0;
    for (const Tensor& t : tensors_) {
      const auto* p = reinterpret_cast<const uint32_t*>(base + t.offset);
      const uint64_t first = t.row0 * kCols;
      for (uint64_t i = 0; i < t.local_rows * kCols; ++i) {
        bad += p[i] != Value(step, t.id, first + i) ? 1 : 0;
      }
    }
    return bad;
  }

 private:
  std::vector<Tensor> tensors_;
  uint64_t total_ = 0;
};

}  // namespace ckpt::testing
