// RestorePoints: the step a job restores from, resolved once per restart of the job, so that
// every rank restores the same step (docs/design.md §4.5).
//
// The race it closes: a daemon commits a step of a dead trainer once every rank captured it
// (the bytes are safe), so a step of the previous incarnation can commit while the new ranks are
// restoring. Asked separately, rank 0 could get N-1 and rank 1 N; data-parallel replicas would
// then diverge silently. Instead the first rank to ask pins the answer, and every rank of the
// same world size gets it, as often as its session asks (a restore point, then a load of it,
// then a load of the optimizer's tensors). The pin is dropped when
//   * a step of the job starts that the coordinator did not know of when the pin was made
//     (training resumed; a step of the previous incarnation, known then, does not drop it), or
//   * a rank that took from it asks from another session, or another world size asks (a later
//     restart, whose pin this is not), or
//   * a session that took from it ended before training resumed (the restart died: the next
//     one must not inherit its answer).
// So a step that commits during a restart is restored by every rank or by none.
//
// Pure bookkeeping (no I/O, no locks), kept by CoordinatorCore under its mutex — in process on
// a single node, or in ckpt-coordinator. Resolving "latest" is the caller's: Find says when it
// is needed; Pin records the answer (the first Pin of a restart wins, a concurrent second
// adopts it). Cost: one record per job in the middle of a restore, O(ranks) each.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>

namespace ckpt {

class RestorePoints {
 public:
  // The pinned answer for this rank's session, or nullopt: resolve the newest committed step
  // and call Pin.
  std::optional<std::optional<uint64_t>> Find(const std::string& job, uint32_t rank,
                                              uint32_t world_size, const std::string& session);
  // Records `latest` as the job's restore point unless a pin that holds for this rank was made
  // meanwhile; returns what this rank restores. `known_steps`: every step of the job the
  // coordinator knows of now (in flight or recently ended).
  std::optional<uint64_t> Pin(const std::string& job, uint32_t rank, uint32_t world_size,
                              const std::string& session, std::optional<uint64_t> latest,
                              std::set<uint64_t> known_steps);
  // A step of the job was reported for the first time.
  void OnStepStarted(const std::string& job, uint64_t step);
  // A session of `rank` ended.
  void OnSessionEnded(const std::string& job, uint32_t rank, const std::string& session);

  size_t size() const { return pins_.size(); }
  // The job is in the middle of a restore: a pin stands.
  bool Pinned(const std::string& job) const { return pins_.count(job) != 0; }

 private:
  struct PinRecord {
    std::optional<uint64_t> step;
    uint32_t world_size = 0;
    std::map<uint32_t, std::string> asked;  // rank → the session that took the answer
    std::set<uint64_t> known_steps;
  };
  using Pins = std::map<std::string, PinRecord>;
  // The pin's answer for this rank's session if the pin holds for it; drops a stale pin.
  std::optional<std::optional<uint64_t>> Take(Pins::iterator it, uint32_t rank, uint32_t world_size,
                                              const std::string& session);

  Pins pins_;
};

}  // namespace ckpt
