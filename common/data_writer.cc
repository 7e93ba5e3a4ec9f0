// DataFileWriter and WriteShardsToFile: see data_writer.h.
//
// WriteShardsToFile runs the daemon's slot pipeline synchronously: PlanDataFile cuts the file
// into slots; `io_threads` workers each own one aligned buffer as long as the longest slot, take
// the next slot index from a shared counter, copy that slot's pieces in (zeroing the gaps),
// checksum each piece while it is hot in cache, and write the slot with one aligned pwrite.
// Memory is at most io_threads × slot_size. Slots are independent (no checksum piece straddles
// two), so the order in which workers finish does not matter. The first error stops the other
// workers before their next slot and is the one reported.
#include "common/data_writer.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <new>
#include <system_error>
#include <thread>

#include "common/checksum.h"

namespace ckpt {

Result<std::unique_ptr<DataFileWriter>> DataFileWriter::Create(FileSystem* fs,
                                                               const std::string& path,
                                                               uint64_t size) {
  ASSIGN_OR_RETURN(std::unique_ptr<File> file,
                   fs->Open(path, OpenOptions{.write = true, .create = true, .truncate = true,
                                              .try_direct = true}));
  RETURN_IF_ERROR(file->Allocate(size));
  return std::unique_ptr<DataFileWriter>(new DataFileWriter(std::move(file)));
}

Status DataFileWriter::WriteAt(uint64_t offset, const std::byte* data, size_t size) {
  if (offset % kIoAlignment != 0 || size % kIoAlignment != 0 ||
      reinterpret_cast<uintptr_t>(data) % kIoAlignment != 0) {
    return InvalidArgument("unaligned write to data file " + path() + " at offset " +
                           std::to_string(offset) + " of " + std::to_string(size) +
                           " bytes: offset, size and buffer must be multiples of " +
                           std::to_string(kIoAlignment));
  }
  RETURN_IF_ERROR(file_->PWriteAll(data, size, offset));
  bytes_written_.fetch_add(size, std::memory_order_relaxed);
  return Status::Ok();
}

Status DataFileWriter::Finish() {
  if (finished_) return *finished_;
  Status status = file_->DataSync();
  Status closed = file_->Close();  // even after a failed sync: release the descriptor
  if (status.ok()) status = std::move(closed);
  finished_ = status;
  return status;
}

Result<std::vector<WrittenShard>> WriteShardsToFile(FileSystem* fs, const std::string& path,
                                                    std::span<const ShardSource> shards,
                                                    const LayoutOptions& layout_options,
                                                    int io_threads) {
  std::vector<uint64_t> shard_bytes;
  shard_bytes.reserve(shards.size());
  for (size_t i = 0; i < shards.size(); ++i) {
    if (shards[i].size > 0 && shards[i].data == nullptr) {
      return InvalidArgument("data file " + path + ": shard " + std::to_string(i) + " has " +
                             std::to_string(shards[i].size) + " bytes but no data");
    }
    shard_bytes.push_back(shards[i].size);
  }
  ASSIGN_OR_RETURN(const DataFileLayout layout, PlanDataFile(shard_bytes, layout_options));

  std::vector<WrittenShard> written(shards.size());
  for (size_t i = 0; i < shards.size(); ++i) {
    written[i].offset = layout.shard_offsets[i];
    written[i].length = shards[i].size;
    written[i].chunk_size = layout.checksum_chunk;
    written[i].chunk_xxh3.assign(layout.chunk_counts[i], 0);
  }

  ASSIGN_OR_RETURN(std::unique_ptr<DataFileWriter> writer, DataFileWriter::Create(fs, path, layout.file_size));

  std::atomic<size_t> next_slot{0};
  std::atomic<bool> failed{false};
  std::mutex error_mu;
  Status first_error;  // guarded by error_mu
  auto fail = [&](Status s) {
    std::lock_guard lock(error_mu);
    if (first_error.ok()) first_error = std::move(s);
    failed.store(true, std::memory_order_relaxed);
  };

  // Each worker writes only the checksums of the pieces in its own slots: distinct vector
  // elements, so the workers share no mutable state but the two atomics and first_error.
  // A buffer need not exceed the longest slot: a small file does not cost a whole slot_size.
  uint64_t buffer_size = 0;
  for (const Slot& slot : layout.slots) buffer_size = std::max(buffer_size, slot.length);
  auto worker = [&] {
    AlignedBuffer buffer;
    try {
      buffer = AlignedBuffer(buffer_size);
    } catch (const std::bad_alloc&) {
      fail(ResourceExhausted("data file " + path + ": cannot allocate a slot buffer of " +
                             std::to_string(buffer_size) + " bytes"));
      return;
    }
    for (;;) {
      if (failed.load(std::memory_order_relaxed)) return;
      const size_t index = next_slot.fetch_add(1, std::memory_order_relaxed);
      if (index >= layout.slots.size()) return;
      const Slot& slot = layout.slots[index];
      std::byte* const base = buffer.data();
      uint64_t filled = 0;  // bytes of the slot already set, zero padding included
      for (const SlotPiece& piece : slot.pieces) {
        std::memset(base + filled, 0, piece.slot_offset - filled);
        const std::byte* src = shards[piece.shard].data + piece.shard_offset;
        std::memcpy(base + piece.slot_offset, src, piece.length);
        written[piece.shard].chunk_xxh3[piece.chunk_index] =
            Xxh3(base + piece.slot_offset, piece.length);
        filled = piece.slot_offset + piece.length;
      }
      std::memset(base + filled, 0, slot.length - filled);
      Status st = writer->WriteAt(slot.file_offset, base, slot.length);
      if (!st.ok()) {
        fail(std::move(st));
        return;
      }
    }
  };

  const size_t threads =
      std::min<size_t>(static_cast<size_t>(std::max(io_threads, 1)), layout.slots.size());
  {
    std::vector<std::jthread> pool;
    pool.reserve(threads);
    for (size_t t = 0; t < threads; ++t) {
      try {
        pool.emplace_back(worker);
      } catch (const std::system_error& e) {
        fail(ResourceExhausted("data file " + path + ": cannot start an I/O thread: " + e.what()));
        break;
      }
    }
  }  // joined here

  if (failed.load()) {
    std::lock_guard lock(error_mu);
    return first_error;
  }
  RETURN_IF_ERROR(writer->Finish());
  return written;
}

}  // namespace ckpt
