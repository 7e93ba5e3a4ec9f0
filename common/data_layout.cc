#include "common/data_layout.h"

#include <algorithm>

#include "common/file_system.h"

namespace ckpt {

Result<DataFileLayout> PlanDataFile(std::span<const uint64_t> shard_bytes,
                                    const LayoutOptions& options) {
  const uint64_t chunk = options.checksum_chunk;
  const uint64_t slot = options.slot_size;
  if (chunk == 0 || chunk % kIoAlignment != 0) {
    return InvalidArgument("checksum chunk " + std::to_string(chunk) +
                           " is not a positive multiple of 4096");
  }
  if (slot == 0 || slot % chunk != 0) {
    return InvalidArgument("slot size " + std::to_string(slot) +
                           " is not a positive multiple of the checksum chunk " +
                           std::to_string(chunk));
  }

  DataFileLayout layout;
  layout.checksum_chunk = chunk;
  layout.slot_size = slot;
  layout.shard_offsets.reserve(shard_bytes.size());
  layout.chunk_counts.reserve(shard_bytes.size());

  uint64_t cursor = 0;
  // Pieces are produced in increasing file order; the slot of each piece is offset / slot.
  auto slot_for = [&](uint64_t file_offset) -> Slot& {
    const uint64_t start = AlignDown(file_offset, slot);
    if (layout.slots.empty() || layout.slots.back().file_offset != start) {
      layout.slots.push_back(Slot{start, 0, {}});
    }
    return layout.slots.back();
  };

  for (uint32_t i = 0; i < shard_bytes.size(); ++i) {
    const uint64_t bytes = shard_bytes[i];
    if (bytes >= chunk) {
      cursor = AlignUp(cursor, chunk);
    } else {
      cursor = AlignUp(cursor, kIoAlignment);
      // A small shard is one piece; it must not straddle a slot boundary.
      if (bytes > 0 && AlignDown(cursor, slot) != AlignDown(cursor + bytes - 1, slot)) {
        cursor = AlignUp(cursor, slot);
      }
    }
    layout.shard_offsets.push_back(cursor);
    const uint32_t pieces = ChunkCount(bytes, chunk);
    layout.chunk_counts.push_back(pieces);
    for (uint32_t p = 0; p < pieces; ++p) {
      const uint64_t in_shard = uint64_t{p} * chunk;
      const uint64_t len = std::min(chunk, bytes - in_shard);
      const uint64_t file_offset = cursor + in_shard;
      Slot& s = slot_for(file_offset);
      s.pieces.push_back(SlotPiece{i, in_shard, len, file_offset - s.file_offset, p});
      s.length = AlignUp(file_offset + len - s.file_offset, kIoAlignment);
    }
    cursor += bytes;
  }
  layout.file_size = AlignUp(cursor, kIoAlignment);
  return layout;
}

}  // namespace ckpt
