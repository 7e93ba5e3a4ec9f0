// Host memory shared by trainers: descriptors of memfd / POSIX shm objects received over the
// local socket, mapped into the daemon.
//
// Each distinct object (st_dev, st_ino) is mapped once per session, whole, MAP_SHARED, and the
// mapping is shared by every tensor that lives in it; the mapping stays alive as long as a
// capture or load still uses it, even after the trainer died (host memory outlives the
// process that shared it — docs/design.md §2.7). Mappings are writable when the descriptor allows,
// so loads can write straight into the trainer's tensors.
//
// A trainer can still shrink its object after registering it; touching the vanished pages
// raises SIGBUS. Every copy to or from trainer memory therefore goes through GuardedCopy, which
// turns that SIGBUS into an error for that client instead of a daemon crash.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <utility>

#include "common/status.h"

namespace ckpt {

class HostMapping {
 public:
  // Maps the whole object behind `fd` (which is not kept). kInvalidArgument when it is not a
  // regular file/shm object or is empty.
  static Result<std::shared_ptr<HostMapping>> Map(int fd);
  ~HostMapping();
  HostMapping(const HostMapping&) = delete;
  HostMapping& operator=(const HostMapping&) = delete;

  std::byte* data() const { return data_; }
  uint64_t size() const { return size_; }
  bool writable() const { return writable_; }
  std::pair<dev_t, ino_t> identity() const { return {dev_, ino_}; }

 private:
  HostMapping(std::byte* data, uint64_t size, bool writable, dev_t dev, ino_t ino)
      : data_(data), size_(size), writable_(writable), dev_(dev), ino_(ino) {}
  std::byte* data_;
  uint64_t size_;
  bool writable_;
  dev_t dev_;
  ino_t ino_;
};

// Per-session cache of mappings by object identity. Not thread safe (the session's loop owns it).
class MappingCache {
 public:
  Result<std::shared_ptr<HostMapping>> Get(int fd);
  size_t size() const { return by_identity_.size(); }
  void Clear() { by_identity_.clear(); }
  // Drops mappings no registered tensor uses any more (use_count == 1: only the cache holds it).
  void DropUnused();

 private:
  std::map<std::pair<dev_t, ino_t>, std::shared_ptr<HostMapping>> by_identity_;
};

// memcpy that survives SIGBUS from a truncated shared object: returns kDataLoss instead.
// Installs its signal handler on first use. Safe from any thread.
Status GuardedCopy(void* dst, const void* src, size_t size);

}  // namespace ckpt
