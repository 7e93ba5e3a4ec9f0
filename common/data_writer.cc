// DataFileWriter: see data_writer.h. The daemon drives it from its flush engine
// (daemon/flush_engine.cc): one aligned write per captured slot, Finish at the job's last token.
#include "common/data_writer.h"

#include <cstdint>
#include <string>

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

}  // namespace ckpt
