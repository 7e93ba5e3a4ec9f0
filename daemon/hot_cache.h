// HotCache: recent checkpoint bytes kept in the host pool, so that a restarted trainer restores
// from the daemon's memory instead of the PFS (docs/design.md §4.3 "hot restore"), and so that
// several local ranks loading the same bytes read them from storage once ("read-once per node").
//
// Entries are windows of a step's data files, one pool slot each, holding the file bytes at
// [window start, window start + slot size) and a list of which ranges are valid. Two sources
// fill them: the flush engine adopts every slot it has just written (so the newest captured step
// stays resident without a copy), and the load path inserts what it read from storage.
// Policy: per job only the newest step is kept when a newer one arrives — except a step pinned
// (a load) or kept (a replication to peers under way) meanwhile, which stays readable and keeps
// adopting its slots until its last pin and keep go; under pool pressure
// (capture needs a slot and none is free) the least recently used unpinned step is dropped
// first — capture always wins over the cache, and a kept step is reclaimable like any other. A
// load pins its step for its duration, so the bytes it found cannot be recycled under it; a
// replication keeps its step from save to send and pins it only while it copies a window out. Bytes
// are verified against the manifest's checksums by the reader before use, exactly as bytes from
// storage are.
//
// Thread safety: all methods are safe from any thread (one mutex; no I/O under it).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/mutex.h"
#include "daemon/host_pool.h"

namespace ckpt {

class HotCache {
 public:
  explicit HotCache(HostPool* pool) : pool_(pool) {}
  ~HotCache();

  // Takes ownership of `slot`, which holds file bytes [file_offset, file_offset + length).
  // Releases it to the pool at once when the step is older than what the job already caches.
  void Adopt(const std::string& job, uint64_t step, const std::string& file, uint64_t file_offset,
             uint64_t length, HostPool::SlotId slot);

  // Copies bytes read from storage (or fetched from a peer) in, window by window, where a slot
  // is free right now (never waits, never evicts another step of the same or a newer step).
  // Bytes already resident are left as they are: a reader may be using them.
  void InsertRead(const std::string& job, uint64_t step, const std::string& file, uint64_t offset,
                  const std::byte* data, uint64_t length);

  // Resident bytes [offset, offset + length) of the file, or nullptr. The pointer stays valid
  // while the caller holds a pin on the step.
  const std::byte* Find(const std::string& job, uint64_t step, const std::string& file,
                        uint64_t offset, uint64_t length);

  void Pin(const std::string& job, uint64_t step);
  void Unpin(const std::string& job, uint64_t step);
  // A weaker hold: a newer step does not push the step out, but pool pressure may (ReclaimOne).
  void Keep(const std::string& job, uint64_t step);
  void Unkeep(const std::string& job, uint64_t step);

  // Forgets a step (it failed or was deleted).
  void Drop(const std::string& job, uint64_t step);
  // Frees the least recently used unpinned step; false when there is none. The pool calls this
  // when a capture needs a slot.
  bool ReclaimOne();

  uint64_t resident_bytes() const;
  // Bytes per window (the pool's slot size): Find answers only ranges inside one window.
  uint64_t window_size() const { return pool_->slot_size(); }

 private:
  struct Window {
    HostPool::SlotId slot;
    std::vector<std::pair<uint64_t, uint64_t>> valid;  // [begin, end) within the window, sorted
  };
  struct StepEntry {
    int pins = 0;
    int keeps = 0;
    uint64_t last_use = 0;
    bool dropped = false;     // failed or deleted: unreadable, freed when the last pin goes
    bool superseded = false;  // a newer step arrived: still readable, freed with the last pin
    std::map<std::string, std::map<uint64_t, Window>> files;  // file → window start → window
  };
  using Key = std::pair<std::string, uint64_t>;

  // InsertRead of a range inside one window.
  void InsertWindow(const std::string& job, uint64_t step, const std::string& file, uint64_t offset,
                    const std::byte* data, uint64_t length);
  // Releases every slot of the entry.
  void FreeLocked(std::map<Key, StepEntry>::iterator it) REQUIRES(mu_);
  // Frees the entry if nothing holds it any more and it was dropped, superseded or is empty.
  void MaybeFreeLocked(std::map<Key, StepEntry>::iterator it) REQUIRES(mu_);
  // Releases the entry's slots and forgets its windows; the entry stays.
  void ReleaseWindowsLocked(std::map<Key, StepEntry>::iterator it) REQUIRES(mu_);
  // Drops unpinned steps of `job` older than `step`.
  void DropOlderLocked(const std::string& job, uint64_t step) REQUIRES(mu_);
  // A step of `job` newer than `step` holds bytes here.
  bool NewerStepCachedLocked(const std::string& job, uint64_t step) const REQUIRES(mu_);
  static void AddValid(Window& w, uint64_t begin, uint64_t end);

  HostPool* pool_;
  mutable Mutex mu_;
  std::map<Key, StepEntry> steps_ GUARDED_BY(mu_);
  uint64_t clock_ GUARDED_BY(mu_) = 0;
  uint64_t resident_slots_ GUARDED_BY(mu_) = 0;
};

}  // namespace ckpt
