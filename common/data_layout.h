// Where each shard's bytes go in a data file, and how the file is cut for the pipeline.
//
// A rank's shards are laid out one after another in one data file. Each shard starts on a
// 4 KiB boundary, or on a checksum-chunk boundary when it is at least one chunk long. Its bytes
// are cut into checksum pieces of `checksum_chunk` bytes (the last one shorter). The file is
// then cut into *slots*: consecutive windows of `slot_size` bytes, the unit the daemon copies
// into one pool buffer and writes with one aligned pwrite. Because large shards start on chunk
// boundaries and slot_size is a multiple of checksum_chunk, no checksum piece straddles two
// slots; a small shard that would straddle one is moved to the next slot. So each slot can be
// captured, checksummed and written on its own, in any order, by any thread — and thousands of
// small tensors still become a few large writes.
//
// Padding between shards is zero in the file. The file's size is a multiple of 4 KiB.
// Thread safety: values.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/status.h"

namespace ckpt {

struct LayoutOptions {
  uint64_t checksum_chunk = 1ull << 20;  // multiple of 4096
  uint64_t slot_size = 16ull << 20;      // multiple of checksum_chunk
};

struct SlotPiece {
  uint32_t shard;         // index into the shard list
  uint64_t shard_offset;  // first byte inside the shard
  uint64_t length;        // bytes; ≤ checksum_chunk
  uint64_t slot_offset;   // where the bytes go inside the slot
  uint32_t chunk_index;   // which checksum of the shard these bytes produce
};

struct Slot {
  uint64_t file_offset;           // multiple of slot_size
  uint64_t length;                // bytes to write; multiple of 4096, ≤ slot_size
  std::vector<SlotPiece> pieces;  // in slot_offset order; bytes between pieces are zero
};

struct DataFileLayout {
  uint64_t checksum_chunk = 0;
  uint64_t slot_size = 0;
  std::vector<uint64_t> shard_offsets;  // file offset of each shard
  std::vector<uint32_t> chunk_counts;   // checksum pieces of each shard
  std::vector<Slot> slots;              // in file order; slots without pieces are omitted
  uint64_t file_size = 0;               // multiple of 4096
};

// kInvalidArgument when the options are not aligned as stated above.
Result<DataFileLayout> PlanDataFile(std::span<const uint64_t> shard_bytes,
                                    const LayoutOptions& options);

// Number of checksum pieces of a shard of `bytes` bytes (0 for an empty shard).
inline uint32_t ChunkCount(uint64_t bytes, uint64_t chunk) {
  return static_cast<uint32_t>((bytes + chunk - 1) / chunk);
}

}  // namespace ckpt
