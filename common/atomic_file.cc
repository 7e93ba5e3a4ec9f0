// WriteFileAtomically: the commit primitive of atomic_file.h.
//
// temp → fdatasync → rename → fsync(dir), as leveldb's SetCurrentFile. Until the rename the old
// file is untouched; the rename replaces it in one step; the directory fsync makes the new entry
// survive a crash. A failure before the rename removes the temp file (best effort: a leftover
// "<path>.tmp" is harmless and overwritten by the next attempt).
#include "common/atomic_file.h"

namespace ckpt {

Status WriteFileAtomically(FileSystem* fs, const std::string& path, std::string_view contents) {
  const std::string tmp = path + ".tmp";
  bool renamed = false;
  Status status = [&]() -> Status {
    ASSIGN_OR_RETURN(std::unique_ptr<File> file,
                     fs->Open(tmp, OpenOptions{.write = true, .create = true, .truncate = true}));
    RETURN_IF_ERROR(file->PWriteAll(contents.data(), contents.size(), 0));
    RETURN_IF_ERROR(file->DataSync());
    RETURN_IF_ERROR(file->Close());
    RETURN_IF_ERROR(fs->Rename(tmp, path));
    renamed = true;
    return fs->SyncDir(DirName(path));
  }();
  if (status.ok()) return status;
  if (!renamed) fs->Remove(tmp).IgnoreError();
  return std::move(status).WithContext("write " + path + " atomically");
}

}  // namespace ckpt
