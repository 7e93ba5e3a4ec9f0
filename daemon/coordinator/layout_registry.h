// LayoutRegistry: the coordinator's distinct layouts, one object per fingerprint, and the
// registrations that name a fingerprint the coordinator does not know yet.
//
// Registration by fingerprint (proto/README.md, "Registration by fingerprint"): a daemon sends
// a rank's fingerprint alone; if the registry holds that layout, the rank shares it and nothing
// more crosses the wire. If not, the first registration to name it is asked for the layout
// (need_layout) and every other one naming it while that ask is open waits here (pending) —
// so N data-parallel ranks registering at once send one layout, not N. The wait is bounded: an
// ask older than `ask_timeout` (the asked daemon died, or its answer was lost) is renewed, by
// asking the next registration that names the fingerprint or, from the coordinator's timer, a
// waiting one (OverdueAsks). A waiting rank is not registered yet, so until its layout arrives
// the job has no plan and every rank writes everything — slower, never wrong.
//
// Layouts are held by the ranks (and plans) that use them; the registry keeps weak references
// and forgets a layout no one holds. Cost: O(distinct layouts + waiting registrations).
// Thread-compatible: the coordinator core calls it with its mutex held.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "daemon/coordinator/rank_layout.h"

namespace ckpt {

class LayoutRegistry {
 public:
  using Clock = std::chrono::steady_clock;
  struct Waiter {
    std::string job;
    uint32_t rank = 0;
    uint64_t registration_id = 0;
    std::string node_id;
  };

  explicit LayoutRegistry(std::chrono::milliseconds ask_timeout) : ask_timeout_(ask_timeout) {}

  // The live layout with this fingerprint, or null.
  std::shared_ptr<const RankLayout> Find(const LayoutFingerprint& fingerprint) const;
  // `layout` if none with its fingerprint is live, else the live one (so ranks share it). Ends
  // the fingerprint's ask; its waiters are then taken with TakeWaiters.
  std::shared_ptr<const RankLayout> Intern(std::shared_ptr<const RankLayout> layout);
  // A registration names the unknown `fingerprint`: true when it is to be asked for the layout
  // (no ask is open, or the open one is overdue), which opens a new ask.
  bool Ask(const LayoutFingerprint& fingerprint, Clock::time_point now);
  void AddWaiter(const LayoutFingerprint& fingerprint, Waiter waiter);
  std::vector<Waiter> TakeWaiters(const LayoutFingerprint& fingerprint);
  // Open asks older than ask_timeout that have waiters: for each, one waiter to ask next (the
  // ask restarts now, and the waiters take turns).
  std::vector<std::pair<LayoutFingerprint, Waiter>> OverdueAsks(Clock::time_point now);
  // The earliest time an open ask with waiters becomes overdue, if any.
  std::optional<Clock::time_point> NextDeadline() const;

  size_t live_layouts() const;
  size_t waiting() const;

 private:
  struct Entry {
    std::weak_ptr<const RankLayout> layout;
    std::optional<Clock::time_point> asked_at;
    std::vector<Waiter> waiters;
    size_t turn = 0;  // the next waiter OverdueAsks asks
  };
  void Sweep();

  const std::chrono::milliseconds ask_timeout_;
  std::unordered_map<LayoutFingerprint, Entry, LayoutFingerprintHash> entries_;
  size_t sweep_at_ = 1024;
};

}  // namespace ckpt
