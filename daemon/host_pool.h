// HostPool: the daemon's bounded staging memory.
//
// One region of `size` bytes is mapped (2 MiB aligned, on transparent huge pages where the
// kernel allows) and populated once at start (and pinned: mlock where RLIMIT_MEMLOCK allows;
// the CUDA backend registers it with cudaHostRegister), then cut into equal slots of
// `slot_size` bytes — the unit of capture and of one aligned write. Slots are
// handed out and returned in any order, so a slow write of one step never blocks the freeing of
// another's. The pool never grows: when every slot is taken, Acquire waits (backpressure on
// capture, and through it on wait_snapshot), unless the caller gave up (its cancel flag).
//
// Thread safety: all methods are safe from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"

namespace ckpt {

class HostPool {
 public:
  struct Config {
    uint64_t size = 1ull << 30;        // bytes, rounded down to whole slots
    uint64_t slot_size = 16ull << 20;  // multiple of 4096
    bool lock_memory = true;           // mlock, best effort (logged when refused)
    // Map only; the caller populates and pins with Pin() — seconds for a large pool — once its
    // health endpoint can say NOT_SERVING meanwhile. Nothing may use the slots before Pin().
    bool defer_pin = false;
  };

  // Maps the region and, unless config.defer_pin, populates and pins it (Pin()).
  static Result<std::unique_ptr<HostPool>> Create(const Config& config);
  // Faults every page in and mlocks the region (best effort, see locked()). kResourceExhausted
  // when the memory cannot be populated. Call once, before any Acquire.
  Status Pin();
  ~HostPool();
  HostPool(const HostPool&) = delete;
  HostPool& operator=(const HostPool&) = delete;

  // A slot index; the slot's memory is slot_data(index).
  using SlotId = uint32_t;

  // Waits for a free slot. Returns nullopt when `cancelled` became true while waiting (checked
  // whenever the pool changes and after WakeAll). `cancelled` may be null.
  std::optional<SlotId> Acquire(const std::atomic<bool>* cancelled);
  // As Acquire, but gives up (nullopt) after `wait` too.
  std::optional<SlotId> AcquireFor(const std::atomic<bool>* cancelled,
                                   std::chrono::milliseconds wait);
  // Takes `count` slots only if that many are free now (the on_full=skip policy), after asking
  // the reclaimer for space when `reclaim` is true.
  std::optional<std::vector<SlotId>> TryAcquireMany(uint32_t count, bool reclaim = true);
  // Called (without the pool's lock) when an acquirer finds no free slot; returns true when it
  // released something. The hot cache gives back cached steps this way. Set before use.
  void SetReclaimer(std::function<bool()> reclaimer) { reclaimer_ = std::move(reclaimer); }
  void Release(SlotId slot);
  // Wakes every waiter so that it re-checks its cancel flag and asks the reclaimer again.
  void WakeAll();

  std::byte* slot_data(SlotId slot) const { return base_ + uint64_t{slot} * slot_size_; }
  uint64_t slot_size() const { return slot_size_; }
  uint32_t slot_count() const { return slot_count_; }
  uint32_t free_slots() const;
  uint64_t size_bytes() const { return uint64_t{slot_count_} * slot_size_; }
  bool locked() const { return locked_.load(std::memory_order_relaxed); }
  std::byte* base() const { return base_; }

 private:
  HostPool(std::byte* base, uint64_t slot_size, uint32_t slot_count, bool lock_memory);
  std::optional<SlotId> AcquireUntil(const std::atomic<bool>* cancelled,
                                     std::optional<std::chrono::steady_clock::time_point> deadline);

  std::byte* const base_;
  const uint64_t slot_size_;
  const uint32_t slot_count_;
  const bool lock_memory_;
  std::atomic<bool> locked_{false};
  mutable Mutex mu_;
  CondVar freed_;
  std::vector<SlotId> free_ GUARDED_BY(mu_);
  uint64_t generation_ GUARDED_BY(mu_) = 0;  // bumped by Release and WakeAll
  std::function<bool()> reclaimer_;
};

}  // namespace ckpt
