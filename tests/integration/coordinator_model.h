// The model the coordinator tests save and load (see coordinator_rank.cc): K int32 matrices
// split over `tp` ranks by rows, by columns or as flat ranges of the flattened matrix, plus one
// matrix replicated whole on every rank; values a pure function of (step, tensor, element), so
// any layout can check what any other layout saved. Shared by the rank program and the tests,
// which compute the bytes they expect on disk.
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

  enum class Split { kRows, kCols, kFlat };

  struct Tensor {
    std::string name;
    uint64_t rows;        // global rows
    uint64_t row0;        // box: first row this rank holds
    uint64_t local_rows;  // box: rows this rank holds
    uint64_t col0 = 0;    // box: first column this rank holds
    uint64_t local_cols = kCols;
    bool flat = false;  // a flat range [flat0, flat0 + local_rows * local_cols) instead
    uint64_t flat0 = 0;
    uint64_t offset;  // in the rank's memory
    uint32_t id;
    uint64_t numel() const { return local_rows * local_cols; }
    uint64_t bytes() const { return numel() * 4; }
    // Global row-major index of local element i.
    uint64_t GlobalIndex(uint64_t i) const {
      if (flat) return flat0 + i;
      return (row0 + i / local_cols) * kCols + col0 + i % local_cols;
    }
  };

  // `tp` slices; this rank holds slice rank % tp. Row counts are multiples of 16 so that
  // tp ∈ {1, 2, 4, 8, 16} all divide them (and every shard stays a multiple of 4 KiB).
  CoordinatorModel(uint32_t tensors, uint32_t tp, uint32_t rank, Split split = Split::kRows) {
    uint64_t offset = 0;
    const uint64_t slice = rank % tp;
    for (uint32_t k = 0; k <= tensors; ++k) {
      Tensor t;
      t.id = k;
      t.local_cols = kCols;
      t.col0 = 0;
      if (k < tensors) {
        t.name = "layers." + std::to_string(k) + ".weight";
        t.rows = 16 * (k + 1);
        t.local_rows = t.rows;
        t.row0 = 0;
        if (split == Split::kRows) {
          t.local_rows = t.rows / tp;
          t.row0 = slice * t.local_rows;
        } else if (split == Split::kCols) {
          t.local_cols = kCols / tp;
          t.col0 = slice * t.local_cols;
        } else {
          t.flat = true;
          t.local_rows = t.rows / tp;  // numel/tp elements, as whole rows' worth
          t.flat0 = slice * t.local_rows * kCols;
        }
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
      if (t.flat) {
        h.flat = true;
        h.flat_offset = t.flat0;
        h.numel = t.numel();
      } else {
        h.offsets = {t.row0, t.col0};
        h.lengths = {t.local_rows, t.local_cols};
      }
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
      for (uint64_t i = 0; i < t.numel(); ++i) p[i] = Value(step, t.id, t.GlobalIndex(i));
    }
  }

  uint64_t CountMismatches(const std::byte* base, uint64_t step) const {
    uint64_t bad = 0;
    for (const Tensor& t : tensors_) {
      const auto* p = reinterpret_cast<const uint32_t*>(base + t.offset);
      for (uint64_t i = 0; i < t.numel(); ++i)
        bad += p[i] != Value(step, t.id, t.GlobalIndex(i)) ? 1 : 0;
    }
    return bad;
  }

 private:
  std::vector<Tensor> tensors_;
  uint64_t total_ = 0;
};

}  // namespace ckpt::testing
