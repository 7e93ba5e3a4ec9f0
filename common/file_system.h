// The storage interface: every byte ckptd writes or reads on the PFS goes through FileSystem,
// so tests can inject the faults a parallel filesystem produces (full disk, EIO, short writes,
// a crash that loses unsynced data) — the leveldb fault-injection idea.
//
// Semantics follow POSIX: PWrite/PRead may transfer fewer bytes than asked (callers use
// PWriteAll / PReadAll); data is durable only after DataSync; a new or renamed directory entry
// is durable only after SyncDir of its parent. Errors carry the path and errno.
//
// Thread safety: a FileSystem is safe to use from many threads. A File may receive concurrent
// PWrite/PRead calls at distinct offsets (that is how the flush engine reaches queue depth);
// Close and DataSync must not race with other calls on the same File.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace ckpt {

// Alignment of O_DIRECT I/O: buffers, offsets and lengths are multiples of this.
inline constexpr size_t kIoAlignment = 4096;

struct OpenOptions {
  bool write = false;      // O_RDWR instead of O_RDONLY
  bool create = false;     // O_CREAT (mode 0644)
  bool truncate = false;   // O_TRUNC
  bool exclusive = false;  // O_EXCL
  // Ask for O_DIRECT; when the filesystem refuses it (tmpfs: EINVAL) the file is opened buffered
  // and File::direct() says so. Callers must then still pass aligned buffers, which is harmless.
  bool try_direct = false;
};

class File {
 public:
  virtual ~File() = default;
  virtual Result<size_t> PWrite(const void* data, size_t size, uint64_t offset) = 0;
  virtual Result<size_t> PRead(void* data, size_t size, uint64_t offset) = 0;
  virtual Status DataSync() = 0;
  virtual Status Truncate(uint64_t size) = 0;
  // Reserves blocks for [0, size) (fallocate). Writes into a preallocated file do not extend it,
  // which on ext4/XFS lets O_DIRECT writes from several threads proceed in parallel instead of
  // serializing on the inode lock. A filesystem without fallocate is not an error.
  virtual Status Allocate(uint64_t size) = 0;
  virtual Result<uint64_t> Size() = 0;
  virtual Status Close() = 0;  // idempotent; the destructor closes without reporting
  virtual bool direct() const = 0;
  virtual const std::string& path() const = 0;

  // Loops over short transfers; a transfer of 0 bytes is an error (kInternal "short write" or
  // kDataLoss "unexpected end of file" naming the path and offset).
  Status PWriteAll(const void* data, size_t size, uint64_t offset);
  Status PReadAll(void* data, size_t size, uint64_t offset);
};

class FileSystem {
 public:
  virtual ~FileSystem() = default;
  virtual Result<std::unique_ptr<File>> Open(const std::string& path,
                                             const OpenOptions& options) = 0;
  virtual Status CreateDirs(const std::string& path) = 0;                     // mkdir -p, mode 0755
  virtual Status Rename(const std::string& from, const std::string& to) = 0;  // atomic replace
  virtual Status SyncDir(const std::string& path) = 0;    // fsync of a directory
  virtual Status Remove(const std::string& path) = 0;     // a file or an empty directory
  virtual Status RemoveAll(const std::string& path) = 0;  // rm -rf; missing is not an error
  // Names in a directory (no "." / ".."), sorted. kNotFound if it does not exist.
  virtual Result<std::vector<std::string>> ListDir(const std::string& path) = 0;
  virtual Result<bool> Exists(const std::string& path) = 0;

  // Whole small files (manifests, LATEST). ReadFile fails with kNotFound when absent.
  Result<std::string> ReadFile(const std::string& path);
};

// The real thing. Process-wide singleton; never null.
FileSystem* PosixFileSystem();

// Parent directory of a path ("a/b/c" → "a/b"; "c" → ".").
std::string DirName(const std::string& path);
std::string JoinPath(const std::string& a, const std::string& b);

// A heap buffer aligned to kIoAlignment, for O_DIRECT. Move-only.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t size);  // zero-filled; size rounded up to kIoAlignment
  AlignedBuffer(AlignedBuffer&& o) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& o) noexcept;
  ~AlignedBuffer();
  std::byte* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  std::byte* data_ = nullptr;
  size_t size_ = 0;
};

inline constexpr uint64_t AlignUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }
inline constexpr uint64_t AlignDown(uint64_t v, uint64_t a) { return v / a * a; }

}  // namespace ckpt
