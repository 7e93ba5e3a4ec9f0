// DataFileWriter: see data_writer.h. The daemon drives it from its flush engine
// (daemon/flush_engine.cc): one aligned write per captured slot, Finish at the job's last token.
#include "common/data_writer.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

#include "common/checksum.h"

namespace ckpt {

Result<std::unique_ptr<DataFileWriter>> DataFileWriter::Create(FileSystem* fs,
                                                               const std::string& path,
                                                               uint64_t size) {
  ASSIGN_OR_RETURN(
      std::unique_ptr<File> file,
      fs->Open(path,
               OpenOptions{.write = true, .create = true, .truncate = true, .try_direct = true}));
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

Result<std::vector<WrittenShard>> WriteDataFileFromMemory(FileSystem* fs, const std::string& path,
                                                          std::span<const ShardSource> shards,
                                                          const LayoutOptions& options) {
  std::vector<uint64_t> sizes;
  for (size_t i = 0; i < shards.size(); ++i) {
    if (shards[i].size > 0 && shards[i].data == nullptr) {
      return InvalidArgument("data file " + path + ": shard " + std::to_string(i) + " has " +
                             std::to_string(shards[i].size) + " bytes but no data");
    }
    sizes.push_back(shards[i].size);
  }
  ASSIGN_OR_RETURN(const DataFileLayout layout, PlanDataFile(sizes, options));
  std::vector<WrittenShard> written(shards.size());
  for (size_t i = 0; i < shards.size(); ++i) {
    written[i] = WrittenShard{layout.shard_offsets[i], shards[i].size, layout.checksum_chunk,
                              std::vector<uint64_t>(layout.chunk_counts[i], 0)};
  }
  ASSIGN_OR_RETURN(std::unique_ptr<DataFileWriter> writer,
                   DataFileWriter::Create(fs, path, layout.file_size));
  uint64_t longest = 0;
  for (const Slot& slot : layout.slots) longest = std::max(longest, slot.length);
  AlignedBuffer buffer(longest);
  for (const Slot& slot : layout.slots) {
    std::memset(buffer.data(), 0, slot.length);
    for (const SlotPiece& piece : slot.pieces) {
      std::memcpy(buffer.data() + piece.slot_offset, shards[piece.shard].data + piece.shard_offset,
                  piece.length);
      written[piece.shard].chunk_xxh3[piece.chunk_index] =
          Xxh3(buffer.data() + piece.slot_offset, piece.length);
    }
    RETURN_IF_ERROR(writer->WriteAt(slot.file_offset, buffer.data(), slot.length));
  }
  RETURN_IF_ERROR(writer->Finish());  // fdatasync: the bytes are durable before any commit
  return written;
}

}  // namespace ckpt
