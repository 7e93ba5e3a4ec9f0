// PeerStore: the regions other nodes pushed to this daemon (PUT), kept in memory within an
// explicit budget (--peer-pool SIZE), and served back by FETCH.
//
// Policy. The budget is a hard cap on bytes held plus bytes reserved by PUTs still arriving.
// A PUT that does not fit is refused with kResourceExhausted ("peer pool full", naming the
// region, the bytes held and the budget); nothing already held is ever evicted to make room,
// because a held copy may be the only restorable copy of a step whose owner died. Space comes
// back when the owner DROPs a step or a file of it, when the coordinator releases the job (its
// trainers ended: DropJob), when a
// PUT of the same (job, step, file, offset) replaces the region it sent before (a retried
// replication), and when a newer step of the same data file arrives while `max_steps_per_file`
// steps of it are held: the oldest goes. That last rule only reclaims copies their sender no
// longer manages (it restarted, or the rank moved); a live sender keeps fewer (replicator.h).
// A budget of 0 means the daemon holds nothing for others: every PUT is refused.
//
// Memory is ordinary heap memory, allocated per region when its PUT is admitted and freed when
// the region is dropped (the host pool stays the capture's: a burst of replication must never
// take slots a trainer's save needs). A PUT's bytes are received straight into the region's
// buffer (Reservation::data) and become visible only after Commit, which the server calls once
// the chunk's checksum matched; an abandoned Reservation returns its bytes to the budget.
//
// Reads copy out of regions; a read may span adjacent regions of the same file. A region being
// read stays alive until the copy ends even if its step is dropped meanwhile (shared
// ownership); its bytes count against the budget until the drop.
//
// Thread safety: all methods from any thread (one mutex; copies happen outside it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "daemon/peer/peer_protocol.h"

namespace ckpt::peer {

class PeerStore {
 public:
  // `max_steps_per_file`: the most steps of one (job, data file) held at once (0: no limit).
  explicit PeerStore(uint64_t budget_bytes, size_t max_steps_per_file = 3)
      : budget_(budget_bytes), max_steps_per_file_(max_steps_per_file) {}
  PeerStore(const PeerStore&) = delete;
  PeerStore& operator=(const PeerStore&) = delete;

  // Space for one incoming region, counted against the budget until committed or destroyed.
  // Must not outlive the store.
  class Reservation {
   public:
    ~Reservation();
    Reservation(const Reservation&) = delete;
    Reservation& operator=(const Reservation&) = delete;
    std::byte* data() { return data_.get(); }
    const Region& region() const { return region_; }

   private:
    friend class PeerStore;
    Reservation(PeerStore* store, Region region);
    PeerStore* store_;
    Region region_;
    std::unique_ptr<std::byte[]> data_;
    bool committed_ = false;
  };

  // Admits a region of region.length bytes (validated by the caller, ValidateRegion), or
  // kResourceExhausted when it does not fit (nothing is evicted).
  Result<std::unique_ptr<Reservation>> Reserve(const Region& region);
  // Makes a filled reservation readable; replaces a region of the same (job, step, file,
  // offset) held before.
  // The reservation is left empty (its destructor then returns nothing to the budget).
  void Commit(Reservation& reservation);

  // Copies bytes [offset, offset + length) of the file into `out` when held (possibly across
  // adjacent regions); false when any byte of it is not held.
  bool Read(const Region& region, std::byte* out) const;
  // True when every byte of the region is held.
  bool Holds(const Region& region) const;

  // Forgets every region of (job, step); returns the bytes freed.
  uint64_t DropStep(const std::string& job, uint64_t step);
  // Forgets the regions of one data file of (job, step); returns the bytes freed.
  uint64_t DropFile(const std::string& job, uint64_t step, const std::string& file);
  // Forgets every region of the job's steps up to `through_step` (the coordinator released
  // the job: JobReleased); returns the bytes freed.
  uint64_t DropJob(const std::string& job, uint64_t through_step);
  // The jobs of which some region is held, in name order, each with the newest step held.
  std::vector<std::pair<std::string, uint64_t>> Jobs() const;

  uint64_t budget() const { return budget_; }
  uint64_t used() const;  // held + reserved
  uint64_t held_bytes() const;
  size_t region_count() const;

 private:
  using Buffer = std::shared_ptr<const std::byte[]>;
  struct Held {
    Buffer data;
    uint64_t length;
  };
  using Key = std::pair<std::string, uint64_t>;                   // job, step
  using Files = std::map<std::string, std::map<uint64_t, Held>>;  // file → offset → region

  void Unreserve(uint64_t bytes);
  uint64_t DropFileLocked(const std::string& job, uint64_t step, const std::string& file)
      REQUIRES(mu_);
  uint64_t DropStepLocked(std::map<Key, Files>::iterator it) REQUIRES(mu_);
  // After a region of (job, step, file) arrived: the oldest steps of that file beyond
  // max_steps_per_file go (never `step`).
  void DropSupersededLocked(const std::string& job, uint64_t step, const std::string& file)
      REQUIRES(mu_);
  // The pieces covering the region (buffer, offset in it, bytes), or false.
  bool Cover(const Region& region,
             std::vector<std::tuple<Buffer, uint64_t, uint64_t>>* pieces) const;

  const uint64_t budget_;
  const size_t max_steps_per_file_;
  mutable Mutex mu_;
  std::map<Key, Files> steps_ GUARDED_BY(mu_);
  uint64_t held_ GUARDED_BY(mu_) = 0;
  uint64_t reserved_ GUARDED_BY(mu_) = 0;
  size_t regions_ GUARDED_BY(mu_) = 0;
};

}  // namespace ckpt::peer
