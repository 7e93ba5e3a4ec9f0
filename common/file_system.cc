// PosixFileSystem: the FileSystem of file_system.h on plain POSIX calls.
//
// Every failed system call becomes an ErrnoStatus whose message names the call, the path and,
// for data transfers, the offset ("pwrite /pfs/job/step-0000000100/rank-00000.data at offset
// 4096: No space left on device (errno 28 at file_system.cc:61)"), so an operator reading a
// log line knows which file on which mount failed without a debugger.
//
// O_DIRECT: data files are opened with try_direct. Filesystems that do not support it (tmpfs,
// some FUSE mounts) fail open(2) with EINVAL; we then reopen buffered and File::direct() says so.
// Callers keep passing aligned buffers either way.
#include "common/file_system.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <new>
#include <system_error>
#include <utility>

namespace ckpt {
namespace {

std::string AtOffset(std::string_view call, const std::string& path, uint64_t offset) {
  std::string s(call);
  s += ' ';
  s += path;
  s += " at offset ";
  s += std::to_string(offset);
  return s;
}

std::string OnPath(std::string_view call, const std::string& path) {
  std::string s(call);
  s += ' ';
  s += path;
  return s;
}

// One open descriptor. PWrite/PRead may run concurrently (pwrite/pread do not share a file
// position); Close, DataSync and Truncate are not called concurrently with others (file_system.h).
class PosixFile final : public File {
 public:
  PosixFile(int fd, std::string path, bool direct)
      : fd_(fd), path_(std::move(path)), direct_(direct) {}
  ~PosixFile() override {
    if (fd_ >= 0) ::close(fd_);
  }
  PosixFile(const PosixFile&) = delete;
  PosixFile& operator=(const PosixFile&) = delete;

  Result<size_t> PWrite(const void* data, size_t size, uint64_t offset) override {
    if (fd_ < 0) return ErrnoStatus(EBADF, AtOffset("pwrite", path_, offset));
    ssize_t n;
    do {
      n = ::pwrite(fd_, data, size, static_cast<off_t>(offset));
    } while (n < 0 && errno == EINTR);
    if (n < 0) return ErrnoStatus(errno, AtOffset("pwrite", path_, offset));
    return static_cast<size_t>(n);
  }

  Result<size_t> PRead(void* data, size_t size, uint64_t offset) override {
    if (fd_ < 0) return ErrnoStatus(EBADF, AtOffset("pread", path_, offset));
    ssize_t n;
    do {
      n = ::pread(fd_, data, size, static_cast<off_t>(offset));
    } while (n < 0 && errno == EINTR);
    if (n < 0) return ErrnoStatus(errno, AtOffset("pread", path_, offset));
    return static_cast<size_t>(n);
  }

  Status DataSync() override {
    if (fd_ < 0) return ErrnoStatus(EBADF, OnPath("fdatasync", path_));
    int rc;
    do {
      rc = ::fdatasync(fd_);
    } while (rc != 0 && errno == EINTR);
    if (rc != 0) return ErrnoStatus(errno, OnPath("fdatasync", path_));
    return Status::Ok();
  }

  Status Allocate(uint64_t size) override {
    if (fd_ < 0) return ErrnoStatus(EBADF, OnPath("fallocate", path_));
    if (size == 0) return Status::Ok();
    int rc;
    do {
      rc = ::fallocate(fd_, 0, 0, static_cast<off_t>(size));
    } while (rc != 0 && errno == EINTR);
    if (rc != 0 && errno != EOPNOTSUPP && errno != ENOSYS) {
      return ErrnoStatus(errno, OnPath("fallocate", path_) + " of " + std::to_string(size));
    }
    return Status::Ok();
  }

  Status Truncate(uint64_t size) override {
    if (fd_ < 0) return ErrnoStatus(EBADF, OnPath("ftruncate", path_));
    int rc;
    do {
      rc = ::ftruncate(fd_, static_cast<off_t>(size));
    } while (rc != 0 && errno == EINTR);
    if (rc != 0) {
      return ErrnoStatus(errno, OnPath("ftruncate", path_) + " to " + std::to_string(size));
    }
    return Status::Ok();
  }

  Result<uint64_t> Size() override {
    if (fd_ < 0) return ErrnoStatus(EBADF, OnPath("fstat", path_));
    struct stat st;
    if (::fstat(fd_, &st) != 0) return ErrnoStatus(errno, OnPath("fstat", path_));
    return static_cast<uint64_t>(st.st_size);
  }

  Status Close() override {
    if (fd_ < 0) return Status::Ok();
    const int fd = std::exchange(fd_, -1);
    // No retry on EINTR: on Linux the descriptor is released even when close reports EINTR.
    if (::close(fd) != 0 && errno != EINTR) return ErrnoStatus(errno, OnPath("close", path_));
    return Status::Ok();
  }

  bool direct() const override { return direct_; }
  const std::string& path() const override { return path_; }

 private:
  int fd_;
  const std::string path_;
  const bool direct_;
};

int OpenRetryingEintr(const std::string& path, int flags) {
  int fd;
  do {
    fd = ::open(path.c_str(), flags, 0644);
  } while (fd < 0 && errno == EINTR);
  return fd;
}

class PosixFileSystemImpl final : public FileSystem {
 public:
  Result<std::unique_ptr<File>> Open(const std::string& path, const OpenOptions& options) override {
    int flags = O_CLOEXEC | (options.write ? O_RDWR : O_RDONLY);
    if (options.create) flags |= O_CREAT;
    if (options.truncate) flags |= O_TRUNC;
    if (options.exclusive) flags |= O_EXCL;
    bool direct = false;
    int fd = -1;
    if (options.try_direct) {
      fd = OpenRetryingEintr(path, flags | O_DIRECT);
      if (fd >= 0) {
        direct = true;
      } else if (errno != EINVAL) {
        return ErrnoStatus(errno, OnPath("open", path) + " (O_DIRECT)");
      }
    }
    if (fd < 0) {
      fd = OpenRetryingEintr(path, flags);
      if (fd < 0) return ErrnoStatus(errno, OnPath("open", path));
    }
    return std::unique_ptr<File>(std::make_unique<PosixFile>(fd, path, direct));
  }

  Status CreateDirs(const std::string& path) override {
    if (path.empty()) return InvalidArgument("mkdir: empty path");
    // mkdir every prefix; an existing directory is fine, an existing non-directory is not.
    size_t pos = 0;
    while (pos != std::string::npos) {
      pos = path.find('/', pos + 1);
      const std::string prefix = path.substr(0, pos);
      if (prefix.empty() || prefix.back() == '/') continue;
      if (::mkdir(prefix.c_str(), 0755) == 0) continue;
      const int err = errno;
      if (err != EEXIST) return ErrnoStatus(err, OnPath("mkdir", prefix));
      struct stat st;
      if (::stat(prefix.c_str(), &st) != 0) return ErrnoStatus(errno, OnPath("stat", prefix));
      if (!S_ISDIR(st.st_mode)) return ErrnoStatus(ENOTDIR, OnPath("mkdir", prefix));
    }
    return Status::Ok();
  }

  Status Rename(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0) {
      return ErrnoStatus(errno, "rename " + from + " to " + to);
    }
    return Status::Ok();
  }

  Status SyncDir(const std::string& path) override {
    int fd = OpenRetryingEintr(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return ErrnoStatus(errno, OnPath("open directory", path));
    int rc;
    do {
      rc = ::fsync(fd);
    } while (rc != 0 && errno == EINTR);
    const int err = errno;
    ::close(fd);
    if (rc != 0) return ErrnoStatus(err, OnPath("fsync directory", path));
    return Status::Ok();
  }

  Status Remove(const std::string& path) override {
    if (std::remove(path.c_str()) != 0) return ErrnoStatus(errno, OnPath("remove", path));
    return Status::Ok();
  }

  Status RemoveAll(const std::string& path) override {
    // Two processes may remove one tree at once (a daemon and a restarted coordinator both
    // clean up a failed step): entries vanish under the walk (ENOENT), or a directory is not
    // empty yet when its last entry is being removed by the other. Another pass settles it.
    std::error_code ec;
    for (int pass = 0; pass < 4; ++pass) {
      ec.clear();
      std::filesystem::remove_all(path, ec);
      if (!ec) return Status::Ok();
      if (ec != std::errc::no_such_file_or_directory && ec != std::errc::directory_not_empty) {
        break;
      }
    }
    std::error_code exists_ec;
    if (!std::filesystem::exists(path, exists_ec) && !exists_ec) return Status::Ok();
    return ErrnoStatus(ec.value(), OnPath("remove_all", path));
  }

  Result<std::vector<std::string>> ListDir(const std::string& path) override {
    DIR* dir = ::opendir(path.c_str());
    if (dir == nullptr) return ErrnoStatus(errno, OnPath("opendir", path));
    std::vector<std::string> names;
    for (;;) {
      errno = 0;
      const dirent* e = ::readdir(dir);
      if (e == nullptr) {
        const int err = errno;
        ::closedir(dir);
        if (err != 0) return ErrnoStatus(err, OnPath("readdir", path));
        break;
      }
      if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
      names.emplace_back(e->d_name);
    }
    std::sort(names.begin(), names.end());
    return names;
  }

  Result<bool> Exists(const std::string& path) override {
    struct stat st;
    if (::stat(path.c_str(), &st) == 0) return true;
    if (errno == ENOENT || errno == ENOTDIR) return false;
    return ErrnoStatus(errno, OnPath("stat", path));
  }
};

}  // namespace

FileSystem* PosixFileSystem() {
  static PosixFileSystemImpl* const fs = new PosixFileSystemImpl();  // never destroyed
  return fs;
}

Status File::PWriteAll(const void* data, size_t size, uint64_t offset) {
  const auto* p = static_cast<const std::byte*>(data);
  while (size > 0) {
    ASSIGN_OR_RETURN(const size_t n, PWrite(p, size, offset));
    if (n == 0) {
      return Internal("short write: pwrite " + path() + " at offset " + std::to_string(offset) +
                      " wrote 0 of " + std::to_string(size) + " bytes");
    }
    p += n;
    size -= n;
    offset += n;
  }
  return Status::Ok();
}

Status File::PReadAll(void* data, size_t size, uint64_t offset) {
  auto* p = static_cast<std::byte*>(data);
  while (size > 0) {
    ASSIGN_OR_RETURN(const size_t n, PRead(p, size, offset));
    if (n == 0) {
      return DataLoss("unexpected end of file: pread " + path() + " at offset " +
                      std::to_string(offset) + " returned 0 of " + std::to_string(size) + " bytes");
    }
    p += n;
    size -= n;
    offset += n;
  }
  return Status::Ok();
}

Result<std::string> FileSystem::ReadFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<File> file, Open(path, OpenOptions{}));
  ASSIGN_OR_RETURN(const uint64_t size, file->Size());
  std::string contents(size, '\0');
  RETURN_IF_ERROR(file->PReadAll(contents.data(), contents.size(), 0));
  RETURN_IF_ERROR(file->Close());
  return contents;
}

std::string DirName(const std::string& path) {
  size_t end = path.size();
  while (end > 1 && path[end - 1] == '/') --end;  // "a/b/" is "a/b"
  const size_t slash = path.rfind('/', end - (end > 0 ? 1 : 0));
  if (slash == std::string::npos || end == 0) return ".";
  size_t cut = slash;
  while (cut > 0 && path[cut - 1] == '/') --cut;  // "a//b" → "a"
  return cut == 0 ? "/" : path.substr(0, cut);
}

std::string JoinPath(const std::string& a, const std::string& b) {
  if (a.empty()) return b;
  if (b.empty()) return a;
  if (a.back() == '/') return a + b;
  return a + "/" + b;
}

AlignedBuffer::AlignedBuffer(size_t size) : size_(AlignUp(size, kIoAlignment)) {
  if (size_ == 0) return;
  data_ = static_cast<std::byte*>(std::aligned_alloc(kIoAlignment, size_));
  if (data_ == nullptr) throw std::bad_alloc();
  std::memset(data_, 0, size_);
}

AlignedBuffer::AlignedBuffer(AlignedBuffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& o) noexcept {
  if (this != &o) {
    std::free(data_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

AlignedBuffer::~AlignedBuffer() { std::free(data_); }

}  // namespace ckpt
