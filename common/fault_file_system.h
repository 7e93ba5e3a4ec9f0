// A FileSystem for tests that wraps a real one and injects the failures a PFS produces:
//   * a simulated crash (SimulateCrash) that loses what was not made durable: file contents
//     beyond the size at the last DataSync, and directory entries (new files, renames) not yet
//     followed by SyncDir of their directory. Files open at the crash fail every later call.
//   * ENOSPC once more than N bytes have been written in total;
//   * EIO on the Nth write or on every DataSync;
//   * short writes (each PWrite writes at most half of what it was asked, at least 1 byte).
// Faults can be limited to paths containing a substring. Thread safe.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>

#include "common/file_system.h"

namespace ckpt {

class FaultInjectingFileSystem : public FileSystem {
 public:
  explicit FaultInjectingFileSystem(FileSystem* base);
  ~FaultInjectingFileSystem() override;

  // ---- faults (take effect for calls that start afterwards) ----
  void FailWithNoSpaceAfter(uint64_t bytes);   // total bytes written by PWrite before ENOSPC
  void FailWriteNumber(uint64_t n);            // the nth PWrite from now (1-based) fails with EIO
  void FailDataSync(bool on);                  // every DataSync fails with EIO
  void ShortWrites(bool on);
  void LimitFaultsTo(std::string path_substring);  // "" = all paths
  void ClearFaults();

  // Loses everything not durable (see above) and invalidates open files.
  Status SimulateCrash();

  uint64_t bytes_written() const;

  // FileSystem
  Result<std::unique_ptr<File>> Open(const std::string& path, const OpenOptions& options) override;
  Status CreateDirs(const std::string& path) override;
  Status Rename(const std::string& from, const std::string& to) override;
  Status SyncDir(const std::string& path) override;
  Status Remove(const std::string& path) override;
  Status RemoveAll(const std::string& path) override;
  Result<std::vector<std::string>> ListDir(const std::string& path) override;
  Result<bool> Exists(const std::string& path) override;

  struct State;  // shared with the files it hands out

 private:
  FileSystem* base_;
  std::shared_ptr<State> state_;
};

}  // namespace ckpt
