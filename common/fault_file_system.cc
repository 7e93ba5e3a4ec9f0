// FaultInjectingFileSystem: see fault_file_system.h.
//
// The crash model (after leveldb's db/fault_injection_test.cc):
//   * Contents. For every path written through this filesystem we remember its size at the last
//     successful DataSync (its "synced size"). A file that is created, or opened with truncate,
//     starts at 0; an existing file opened for writing without truncate is taken as durable as
//     it is. A crash truncates each remembered file back to its synced size. Overwrites inside
//     the synced size are kept: only lost appends are modelled, which is all a checkpoint writer
//     produces (it writes new files, never rewrites old ones).
//   * Directory entries. A file created by Open (it did not exist before) and the target of a
//     Rename are "unsynced entries" until SyncDir of their parent directory. A crash removes
//     every unsynced entry. Simplification: a Rename that replaced an existing, durable file and
//     was not followed by SyncDir loses the new and the old file alike (a real filesystem would
//     keep one of them), and the source of such a rename does not come back. Either way a crash
//     never shows a torn file, and tests of the commit protocol accept "old or nothing" there.
//     Directories made by CreateDirs are taken as durable at once.
//   * Open files. Every File handed out before the crash fails all later calls with EIO, like
//     the descriptors of a process that died. The filesystem itself works on after the crash,
//     as the restarted process would see it.
// Fault decisions are taken under the mutex; the wrapped filesystem is called outside it (except
// where an open must be atomic with its existence check), so concurrent writers still overlap.
#include "common/fault_file_system.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <utility>
#include <vector>

#include "common/logging.h"
#include "common/mutex.h"
#include "common/units.h"

namespace ckpt {
namespace {

// One spelling per path, so that "a//b/" and "a/b" share their crash bookkeeping.
std::string Normalize(const std::string& path) {
  std::string s = std::filesystem::path(path).lexically_normal().string();
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return s;
}

bool IsSameOrUnder(const std::string& path, const std::string& dir) {
  if (path == dir) return true;
  return path.size() > dir.size() && path.compare(0, dir.size(), dir) == 0 &&
         (dir == "/" || path[dir.size()] == '/');
}

std::string AtOffset(std::string_view call, const std::string& path, uint64_t offset) {
  return std::string(call) + " " + path + " at offset " + std::to_string(offset);
}

}  // namespace

struct FaultInjectingFileSystem::State {
  mutable Mutex mu;

  // ---- faults ----
  // Faults apply to paths containing this ("" = all).
  std::string limit_to GUARDED_BY(mu);
  std::optional<uint64_t> space_left GUARDED_BY(mu);  // bytes writable before ENOSPC
  uint64_t writes_until_eio GUARDED_BY(mu) = 0;       // 0 = off; 1 = the next write fails
  bool fail_data_sync GUARDED_BY(mu) = false;
  bool short_writes GUARDED_BY(mu) = false;
  uint64_t writes_until_stall GUARDED_BY(mu) = 0;  // 0 = off; 1 = the next write stalls
  std::string stall_release_fifo GUARDED_BY(mu);   // "" = released by ReleaseStalls
  // Bumped by ReleaseStalls; a stalled write waits for a bump.
  uint64_t stall_generation GUARDED_BY(mu) = 0;
  CondVar stall_cv;
  uint64_t stalled_writes GUARDED_BY(mu) = 0;

  // ---- control file ("control=FILE") ----
  std::string control_path GUARDED_BY(mu);
  // Identity (inode, size, mtime) of the version last applied.
  std::string control_seen GUARDED_BY(mu);
  Mutex reload_mu ACQUIRED_BEFORE(mu);  // one reload at a time

  uint64_t bytes_written GUARDED_BY(mu) = 0;  // every byte written through this filesystem

  // ---- crash model; keys normalized ----
  uint64_t epoch GUARDED_BY(mu) = 0;  // bumped by SimulateCrash
  // Files written through us.
  std::unordered_map<std::string, uint64_t> synced_size GUARDED_BY(mu);
  std::set<std::string> unsynced_entries GUARDED_BY(mu);  // names not yet dir-synced

  bool Applies(const std::string& path) const REQUIRES(mu) {
    return limit_to.empty() || path.find(limit_to) != std::string::npos;
  }

  // Drops all bookkeeping of `path` and anything below it.
  void Forget(const std::string& path) REQUIRES(mu) {
    std::erase_if(synced_size, [&](const auto& kv) { return IsSameOrUnder(kv.first, path); });
    std::erase_if(unsynced_entries, [&](const auto& p) { return IsSameOrUnder(p, path); });
  }

  // Bookkeeping of a rename: `to` (and below) is replaced by `from` (and below).
  void Rename(const std::string& from, const std::string& to) REQUIRES(mu) {
    auto moved = [&](const std::string& key) { return to + key.substr(from.size()); };
    std::vector<std::pair<std::string, uint64_t>> sizes;
    std::vector<std::string> entries;
    for (const auto& [path, size] : synced_size) {
      if (IsSameOrUnder(path, from)) sizes.emplace_back(moved(path), size);
    }
    for (const auto& path : unsynced_entries) {
      if (path != from && IsSameOrUnder(path, from)) entries.push_back(moved(path));
    }
    Forget(from);
    Forget(to);
    for (auto& kv : sizes) synced_size.insert(std::move(kv));
    for (auto& p : entries) unsynced_entries.insert(std::move(p));
    unsynced_entries.insert(to);
  }
};

namespace {

// A File of the fault-injecting filesystem: forwards to the real one unless a fault or a past
// crash says otherwise.
class FaultFile final : public File {
 public:
  using State = FaultInjectingFileSystem::State;

  FaultFile(std::unique_ptr<File> base, std::shared_ptr<State> state, uint64_t epoch)
      : base_(std::move(base)),
        state_(std::move(state)),
        key_(Normalize(base_->path())),
        epoch_(epoch) {}

  Result<size_t> PWrite(const void* data, size_t size, uint64_t offset) override {
    RETURN_IF_ERROR(MaybeStall(offset));
    size_t n = size;
    {
      MutexLock lock(state_->mu);
      if (DeadLocked()) return ErrnoStatus(EIO, AtOffset("pwrite", path(), offset));
      if (state_->Applies(path())) {
        if (state_->writes_until_eio > 0 && --state_->writes_until_eio == 0) {
          return ErrnoStatus(EIO, AtOffset("pwrite", path(), offset));
        }
        if (state_->short_writes && size > 1) {
          // O_DIRECT transfers must stay aligned, so a direct file is cut at a 4 KiB boundary
          // (and a single-block write cannot be shortened).
          n = base_->direct() ? AlignDown(size / 2, kIoAlignment) : size / 2;
          if (n == 0) n = base_->direct() ? size : 1;
        }
        if (state_->space_left) {
          if (n > *state_->space_left) {
            return ErrnoStatus(ENOSPC, AtOffset("pwrite", path(), offset));
          }
          *state_->space_left -= n;  // reserved; the unwritten part is refunded below
        }
      }
    }
    Result<size_t> written = base_->PWrite(data, n, offset);
    MutexLock lock(state_->mu);
    const size_t done = written.ok() ? *written : 0;
    if (state_->space_left && state_->Applies(path())) *state_->space_left += n - done;
    state_->bytes_written += done;
    return written;
  }

  Result<size_t> PRead(void* data, size_t size, uint64_t offset) override {
    if (Dead()) return ErrnoStatus(EIO, AtOffset("pread", path(), offset));
    return base_->PRead(data, size, offset);
  }

  Status DataSync() override {
    {
      MutexLock lock(state_->mu);
      if (DeadLocked()) return ErrnoStatus(EIO, "fdatasync " + path());
      if (state_->fail_data_sync && state_->Applies(path())) {
        return ErrnoStatus(EIO, "fdatasync " + path());
      }
    }
    RETURN_IF_ERROR(base_->DataSync());
    ASSIGN_OR_RETURN(const uint64_t size, base_->Size());
    MutexLock lock(state_->mu);
    if (!DeadLocked()) state_->synced_size[key_] = size;
    return Status::Ok();
  }

  Status Allocate(uint64_t size) override {
    if (Dead()) return ErrnoStatus(EIO, "fallocate " + path());
    return base_->Allocate(size);
  }

  Status Truncate(uint64_t size) override {
    if (Dead()) return ErrnoStatus(EIO, "ftruncate " + path());
    RETURN_IF_ERROR(base_->Truncate(size));
    MutexLock lock(state_->mu);
    auto it = state_->synced_size.find(key_);
    if (it != state_->synced_size.end()) it->second = std::min(it->second, size);
    return Status::Ok();
  }

  Result<uint64_t> Size() override {
    if (Dead()) return ErrnoStatus(EIO, "fstat " + path());
    return base_->Size();
  }

  Status Close() override {
    if (Dead()) {
      base_->Close().IgnoreError();  // release the descriptor all the same
      return ErrnoStatus(EIO, "close " + path());
    }
    return base_->Close();
  }

  bool direct() const override { return base_->direct(); }
  const std::string& path() const override { return base_->path(); }

 private:
  // Blocks this write when it is the one chosen to stall (see StallWriteNumber). The lock is
  // not held while blocked: other writes, and ReleaseStalls, go on meanwhile.
  Status MaybeStall(uint64_t offset) {
    MutexLock lock(state_->mu);
    if (state_->writes_until_stall == 0 || !state_->Applies(path()) ||
        --state_->writes_until_stall != 0) {
      return Status::Ok();
    }
    ++state_->stalled_writes;
    const std::string fifo = state_->stall_release_fifo;
    const uint64_t generation = state_->stall_generation;
    spdlog::warn("fault injection: {} stalls until released{}", AtOffset("pwrite", path(), offset),
                 fifo.empty() ? std::string() : " (a writer opening " + fifo + ")");
    if (fifo.empty()) {
      state_->stall_cv.Wait(state_->mu, [&]() REQUIRES(state_->mu) {
        return state_->stall_generation != generation;
      });
      return Status::Ok();
    }
    lock.Unlock();
    int fd;
    do {
      fd = ::open(fifo.c_str(), O_RDONLY | O_CLOEXEC);  // blocks until a writer opens it
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) return ErrnoStatus(errno, "fault injection: open stall FIFO " + fifo);
    ::close(fd);
    spdlog::warn("fault injection: {} released", AtOffset("pwrite", path(), offset));
    return Status::Ok();
  }

  bool DeadLocked() const REQUIRES(state_->mu) { return state_->epoch != epoch_; }
  bool Dead() const {
    MutexLock lock(state_->mu);
    return DeadLocked();
  }

  const std::unique_ptr<File> base_;
  const std::shared_ptr<State> state_;
  const std::string key_;
  const uint64_t epoch_;  // the filesystem's epoch when opened; a crash makes them differ
};

}  // namespace

FaultInjectingFileSystem::FaultInjectingFileSystem(FileSystem* base)
    : base_(base), state_(std::make_shared<State>()) {}

FaultInjectingFileSystem::~FaultInjectingFileSystem() = default;

void FaultInjectingFileSystem::FailWithNoSpaceAfter(uint64_t bytes) {
  MutexLock lock(state_->mu);
  state_->space_left = bytes;
}

void FaultInjectingFileSystem::FailWriteNumber(uint64_t n) {
  MutexLock lock(state_->mu);
  state_->writes_until_eio = n;
}

void FaultInjectingFileSystem::FailDataSync(bool on) {
  MutexLock lock(state_->mu);
  state_->fail_data_sync = on;
}

void FaultInjectingFileSystem::ShortWrites(bool on) {
  MutexLock lock(state_->mu);
  state_->short_writes = on;
}

void FaultInjectingFileSystem::StallWriteNumber(uint64_t n, std::string release_fifo) {
  MutexLock lock(state_->mu);
  state_->writes_until_stall = n;
  state_->stall_release_fifo = std::move(release_fifo);
}

void FaultInjectingFileSystem::ReleaseStalls() {
  MutexLock lock(state_->mu);
  ++state_->stall_generation;
  state_->stall_cv.NotifyAll();
}

uint64_t FaultInjectingFileSystem::stalled_writes() const {
  MutexLock lock(state_->mu);
  return state_->stalled_writes;
}

Status FaultInjectingFileSystem::ApplySpec(std::string_view spec) {
  std::stringstream ss{std::string(spec)};
  std::optional<uint64_t> stall_write;
  std::string stall_release;
  for (std::string item; std::getline(ss, item, ',');) {
    while (!item.empty() && std::isspace(static_cast<unsigned char>(item.back()))) item.pop_back();
    while (!item.empty() && std::isspace(static_cast<unsigned char>(item.front()))) {
      item.erase(0, 1);
    }
    if (item.empty()) continue;
    const auto eq = item.find('=');
    const std::string key = item.substr(0, eq);
    const std::string value = eq == std::string::npos ? "" : item.substr(eq + 1);
    const std::string where = "fault spec item '" + item + "'";
    if (key == "enospc-after") {
      ASSIGN_OR_RETURN(uint64_t bytes, ParseByteSize(value), where);
      FailWithNoSpaceAfter(bytes);
    } else if (key == "eio-write") {
      ASSIGN_OR_RETURN(uint64_t n, ParseByteSize(value), where);
      FailWriteNumber(n);
    } else if (key == "eio-sync") {
      FailDataSync(true);
    } else if (key == "short-writes") {
      ShortWrites(true);
    } else if (key == "stall-write") {
      ASSIGN_OR_RETURN(stall_write, ParseByteSize(value), where);
    } else if (key == "stall-release") {
      stall_release = value;
    } else if (key == "path") {
      LimitFaultsTo(value);
    } else if (key == "control") {
      if (value.empty()) return InvalidArgument(where + ": control needs a file name");
      MutexLock lock(state_->mu);
      state_->control_path = value;
      state_->control_seen.clear();
    } else {
      return InvalidArgument(where + ": unknown fault '" + key + "'");
    }
  }
  if (stall_write) StallWriteNumber(*stall_write, stall_release);
  return Status::Ok();
}

void FaultInjectingFileSystem::ReloadControlFile() {
  std::string path;
  {
    MutexLock lock(state_->mu);
    if (state_->control_path.empty()) return;
    path = state_->control_path;
  }
  MutexLock reload(state_->reload_mu);
  struct stat st = {};
  std::string identity = "absent";
  if (::stat(path.c_str(), &st) == 0) {
    identity = std::to_string(st.st_ino) + ":" + std::to_string(st.st_size) + ":" +
               std::to_string(st.st_mtim.tv_sec) + "." + std::to_string(st.st_mtim.tv_nsec);
  }
  {
    MutexLock lock(state_->mu);
    if (identity == state_->control_seen) return;
    state_->control_seen = identity;
  }
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  std::string spec = text.str();
  std::replace(spec.begin(), spec.end(), '\n', ',');
  // The file's spec replaces every fault; the control file itself stays.
  ClearFaults();
  if (spec.find("control=") != std::string::npos) {
    spdlog::error("fault injection: control file {} may not name another control file", path);
    return;
  }
  if (Status st = ApplySpec(spec); !st.ok()) {
    spdlog::error("fault injection: control file {}: {}", path, st.ToString());
    return;
  }
  spdlog::warn("fault injection: faults now '{}' (from {})", spec, path);
}

void FaultInjectingFileSystem::LimitFaultsTo(std::string path_substring) {
  MutexLock lock(state_->mu);
  state_->limit_to = std::move(path_substring);
}

void FaultInjectingFileSystem::ClearFaults() {
  MutexLock lock(state_->mu);
  state_->limit_to.clear();
  state_->space_left.reset();
  state_->writes_until_eio = 0;
  state_->fail_data_sync = false;
  state_->short_writes = false;
  state_->writes_until_stall = 0;
  state_->stall_release_fifo.clear();
  ++state_->stall_generation;
  state_->stall_cv.NotifyAll();
}

uint64_t FaultInjectingFileSystem::bytes_written() const {
  MutexLock lock(state_->mu);
  return state_->bytes_written;
}

Status FaultInjectingFileSystem::SimulateCrash() {
  // Held throughout: a crash is one instant, nothing may interleave with it.
  MutexLock lock(state_->mu);
  ++state_->epoch;
  Status first_error;
  auto note = [&](Status s) {
    if (!s.ok() && first_error.ok()) first_error = std::move(s);
  };
  // Deepest names first, so a new directory's new files go before the directory.
  std::vector<std::string> entries(state_->unsynced_entries.rbegin(),
                                   state_->unsynced_entries.rend());
  for (const std::string& path : entries) {
    note(base_->RemoveAll(path));
    std::erase_if(state_->synced_size,
                  [&](const auto& kv) { return IsSameOrUnder(kv.first, path); });
  }
  state_->unsynced_entries.clear();
  for (const auto& [path, synced] : state_->synced_size) {
    Result<bool> exists = base_->Exists(path);
    if (!exists.ok()) {
      note(exists.status());
      continue;
    }
    if (!*exists) continue;
    Result<std::unique_ptr<File>> file = base_->Open(path, OpenOptions{.write = true});
    if (!file.ok()) {
      note(file.status());
      continue;
    }
    Result<uint64_t> size = (*file)->Size();
    if (!size.ok()) {
      note(size.status());
    } else if (*size > synced) {
      note((*file)->Truncate(synced));
    }
    note((*file)->Close());
  }
  return std::move(first_error).WithContext("simulated crash");
}

Result<std::unique_ptr<File>> FaultInjectingFileSystem::Open(const std::string& path,
                                                             const OpenOptions& options) {
  const std::string key = Normalize(path);
  if (options.write) ReloadControlFile();
  if (!options.write) {
    ASSIGN_OR_RETURN(std::unique_ptr<File> file, base_->Open(path, options));
    MutexLock lock(state_->mu);
    return std::unique_ptr<File>(
        std::make_unique<FaultFile>(std::move(file), state_, state_->epoch));
  }
  // Held across the open so the existence check and the open are one step for other threads.
  MutexLock lock(state_->mu);
  bool existed = true;
  if (options.create) {
    ASSIGN_OR_RETURN(existed, base_->Exists(path));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<File> file, base_->Open(path, options));
  if (!existed) state_->unsynced_entries.insert(key);
  if (!existed || options.truncate) {
    state_->synced_size[key] = 0;
  } else if (!state_->synced_size.contains(key)) {
    ASSIGN_OR_RETURN(state_->synced_size[key], file->Size());
  }
  return std::unique_ptr<File>(std::make_unique<FaultFile>(std::move(file), state_, state_->epoch));
}

Status FaultInjectingFileSystem::CreateDirs(const std::string& path) {
  return base_->CreateDirs(path);
}

Status FaultInjectingFileSystem::Rename(const std::string& from, const std::string& to) {
  RETURN_IF_ERROR(base_->Rename(from, to));
  MutexLock lock(state_->mu);
  state_->Rename(Normalize(from), Normalize(to));
  return Status::Ok();
}

Status FaultInjectingFileSystem::SyncDir(const std::string& path) {
  RETURN_IF_ERROR(base_->SyncDir(path));
  const std::string dir = Normalize(path);
  MutexLock lock(state_->mu);
  std::erase_if(state_->unsynced_entries,
                [&](const std::string& p) { return Normalize(DirName(p)) == dir; });
  return Status::Ok();
}

Status FaultInjectingFileSystem::Remove(const std::string& path) {
  RETURN_IF_ERROR(base_->Remove(path));
  MutexLock lock(state_->mu);
  state_->Forget(Normalize(path));
  return Status::Ok();
}

Status FaultInjectingFileSystem::RemoveAll(const std::string& path) {
  RETURN_IF_ERROR(base_->RemoveAll(path));
  MutexLock lock(state_->mu);
  state_->Forget(Normalize(path));
  return Status::Ok();
}

Result<std::vector<std::string>> FaultInjectingFileSystem::ListDir(const std::string& path) {
  return base_->ListDir(path);
}

Result<bool> FaultInjectingFileSystem::Exists(const std::string& path) {
  return base_->Exists(path);
}

}  // namespace ckpt
