// A FileSystem for tests that wraps a real one and injects the failures a PFS produces:
//   * a simulated crash (SimulateCrash) that loses what was not made durable: file contents
//     beyond the size at the last DataSync, and directory entries (new files, renames) not yet
//     followed by SyncDir of their directory. Files open at the crash fail every later call.
//   * ENOSPC once more than N bytes have been written in total;
//   * EIO on the Nth write or on every DataSync;
//   * short writes (each PWrite writes at most half of what it was asked, at least 1 byte);
//   * a stalled write: the Nth PWrite blocks until released (ReleaseStalls, or a writer opening
//     a FIFO named in advance), like a write to a hung PFS server.
// Faults can be limited to paths containing a substring. Thread safe.
//
// A daemon takes its faults from a text spec (ApplySpec; the CKPTD_FAULT_INJECTION variable),
// e.g. "enospc-after=64MiB,eio-write=3,eio-sync,short-writes,stall-write=2,
// stall-release=/tmp/fifo,path=rank-00001". "control=FILE" makes the filesystem re-read FILE
// whenever it changes (checked at each open for writing) and replace all faults by the spec it
// holds, so a test can inject and lift faults in a running daemon (write the file elsewhere and
// rename it over FILE).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>

#include "common/file_system.h"

namespace ckpt {

class FaultInjectingFileSystem : public FileSystem {
 public:
  explicit FaultInjectingFileSystem(FileSystem* base);
  ~FaultInjectingFileSystem() override;

  // ---- faults (take effect for calls that start afterwards) ----
  void FailWithNoSpaceAfter(uint64_t bytes);  // total bytes written by PWrite before ENOSPC
  void FailWriteNumber(uint64_t n);           // the nth PWrite from now (1-based) fails with EIO
  void FailDataSync(bool on);                 // every DataSync fails with EIO
  void ShortWrites(bool on);
  // The nth PWrite from now (1-based) on a matching path blocks until ReleaseStalls() or, when
  // `release_fifo` is not empty, until some process opens that FIFO for writing.
  void StallWriteNumber(uint64_t n, std::string release_fifo = "");
  void ReleaseStalls();                            // wakes every write stalled so far
  void LimitFaultsTo(std::string path_substring);  // "" = all paths
  void ClearFaults();                              // also releases stalled writes

  // Applies a comma-separated spec (see the top of this file) on top of the current faults.
  // kInvalidArgument naming the item for an unknown key or a bad number.
  Status ApplySpec(std::string_view spec);

  // Loses everything not durable (see above) and invalidates open files.
  Status SimulateCrash();

  uint64_t bytes_written() const;
  uint64_t stalled_writes() const;  // writes that have stalled so far (released or not)

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
  // Re-reads the "control=" file when it changed since the last look (any thread).
  void ReloadControlFile();

  FileSystem* base_;
  std::shared_ptr<State> state_;
};

}  // namespace ckpt
