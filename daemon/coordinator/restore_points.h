// RestorePoints: the step a job restores from, resolved once per restart of the job, so that
// every rank restores the same step (docs/design.md §4.5).
//
// The race it closes: a daemon commits a step of a dead trainer once every rank captured it
// (the bytes are safe), so a step of the previous incarnation can commit while the new ranks are
// restoring. Asked separately, rank 0 could get N-1 and rank 1 N; data-parallel replicas would
// then diverge silently. Instead the first rank to ask pins the answer, and every rank of the
// same world size gets that answer, once each. The pin is dropped when
//   * every rank of the world asked (the restore is done), or
//   * a rank asks a second time (a later restart, whose pin this is not), or another world size
//     asks (a job restarted at another scale), or
//   * a step starts that was not in flight when the pin was made (training resumed), or
//   * `ttl` passed since it was made (a restart whose ranks never all asked).
// A step in flight when the pin was made does not drop it: that is the step of the previous
// incarnation, seen by all ranks or by none.
//
// Pure bookkeeping (no I/O, no locks): the embedded coordinator calls it on the daemon's loop,
// ckpt-coordinator under its mutex. Resolving "latest" is the caller's: Find says when it is
// needed; Pin records the answer (the first Pin of a restart wins, a concurrent second adopts
// it). The cost is one small record per restarting job.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>

namespace ckpt {

class RestorePoints {
 public:
  using Clock = std::chrono::steady_clock;
  explicit RestorePoints(Clock::duration ttl) : ttl_(ttl) {}

  // The pinned answer for this rank (counted as asked), or nullopt: resolve the newest
  // committed step and call Pin.
  std::optional<std::optional<uint64_t>> Find(const std::string& job, uint32_t rank,
                                              uint32_t world_size, Clock::time_point now);
  // Records `latest` as the job's restore point unless a valid one was pinned meanwhile;
  // returns what this rank restores.
  std::optional<uint64_t> Pin(const std::string& job, uint32_t rank, uint32_t world_size,
                              std::optional<uint64_t> latest, Clock::time_point now);
  // A step of the job started that was not in flight when its pin was made.
  void OnNewStep(const std::string& job) { pins_.erase(job); }

  size_t size() const { return pins_.size(); }

 private:
  struct PinRecord {
    std::optional<uint64_t> step;
    uint32_t world_size = 0;
    std::set<uint32_t> asked;
    Clock::time_point expires;
  };
  // The pin's answer for `rank` if the pin holds for it (counting the rank); drops a stale pin.
  std::optional<std::optional<uint64_t>> Take(std::map<std::string, PinRecord>::iterator it,
                                              uint32_t rank, uint32_t world_size,
                                              Clock::time_point now);

  Clock::duration ttl_;
  std::map<std::string, PinRecord> pins_;
};

}  // namespace ckpt
