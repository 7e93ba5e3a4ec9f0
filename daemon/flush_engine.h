// FlushEngine: writer threads that drain captured slots to storage.
//
// Each submitted slot is written with one aligned pwrite through the job's DataFileWriter (so
// with O_DIRECT where the filesystem takes it), then checksummed, then its pool slot is
// returned. Queue depth equals the number of threads; the queue itself is bounded by the pool
// (an item holds a slot). When a capture starts, an item of its own has a writer create the
// step directory and data file (Prepare); when the job's last token is dropped a writer thread
// finishes the file (fdatasync) and reports. The writer threads are the only ones that wait on
// storage for captured data: the capture threads never do, so captures go on into the pool while a
// filesystem hangs.
//
// The writer threads are a WorkerPool of their own (worker_pool.h): a hung filesystem holds only
// them. An item submitted after Stop cannot be written: its job fails ("the daemon is
// stopping"), its pool slot goes back and its token is dropped, so the job still reports
// persisted (with that error) and nothing waits for it forever.
//
// Stall watch. Each writer thread stamps when its current storage call began (0 while idle);
// Activity() reports how many calls are in flight and how long the oldest has been. The node
// state uses it to tell a hung filesystem (a call in flight for longer than the stall timeout)
// from a merely busy one, and ops see it in /metrics and `ckptctl status`.
//
// Why write before checksumming: XXH3 over bytes that are no longer in cache runs at memcpy's
// speed (both are bound by memory bandwidth: ~20 GB/s each on the CI machines), so hashing a
// slot costs as much CPU as capturing it. Hashed first, every freshly captured slot made a flush
// thread runnable at once, and on a core shared with the copy the hashes took a third of it
// while the trainer waited in wait_snapshot. Written first, a thread hashes a slot only after
// storage took it, so hashing proceeds at the storage's pace (~1/5 of the copy's here) and the
// write reaches the device ~1 ms sooner. Measured with bench_daemon, ckptd on one core, with the
// pool's huge pages (host_pool.cc): capture 0.80-0.82 of memcpy (0.54-0.63 before), flush
// 0.93 of fio (0.86-0.88).
//
// Thread safety: Submit from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "daemon/capture_job.h"
#include "daemon/host_pool.h"
#include "daemon/hot_cache.h"
#include "daemon/worker_pool.h"

namespace ckpt {

class FlushEngine {
 public:
  struct Config {
    int threads = 8;
    int nice = 0;  // of the writer threads (thread_priority.h)
  };
  // `hot` (may be null) adopts written slots so the newest step stays resident.
  FlushEngine(const Config& config, HostPool* pool, HotCache* hot);
  ~FlushEngine();  // Stop()

  void Start();
  // Lets queued items finish, then joins the threads. Items submitted later fail their job.
  void Stop();

  struct Item {
    std::shared_ptr<CaptureJob> job;
    uint32_t slot_index;  // into job->plan->layout.slots
    HostPool::SlotId pool_slot;
  };
  // The item's job must hold a pending token for it (the capture engine adds it). After Stop
  // the item is refused: its job fails, and the token and slot are given back here.
  void Submit(Item item);

  // The capture of `job` starts: a writer thread creates its step directory and data file now,
  // while the capture copies (so the file exists as early as before, without the capture thread
  // waiting on storage). A failure fails the job.
  void Prepare(const std::shared_ptr<CaptureJob>& job);
  // The capture pass is done with `job`: drops its token; if it was the last, a writer thread
  // finishes the data file (never the calling capture thread: fdatasync may block for as long
  // as the filesystem hangs).
  void ReleaseCaptureToken(const std::shared_ptr<CaptureJob>& job);

  struct Activity {
    uint32_t in_flight = 0;     // storage calls of the writer threads now in progress
    double oldest_seconds = 0;  // how long the oldest of them has been running
  };
  Activity activity() const;

 private:
  static constexpr uint32_t kFinalize = UINT32_MAX;     // Item::slot_index: finish the file
  static constexpr uint32_t kPrepare = UINT32_MAX - 1;  // Item::slot_index: create the file
  // One item, on writer thread `thread`.
  void Process(const Item& item, size_t thread);
  // An item the stopped writer threads will never take (see the essay).
  void Refuse(const Item& item);
  // Drops one token; the caller that brings it to zero finalizes.
  void ReleaseToken(const std::shared_ptr<CaptureJob>& job, size_t thread);
  // fdatasync and on_persisted, on writer thread `thread`.
  void Finalize(const std::shared_ptr<CaptureJob>& job, size_t thread);
  // Runs one storage call of writer thread `thread` with its start stamped for activity().
  template <typename F>
  auto Timed(size_t thread, F&& call);

  Config config_;
  HostPool* pool_;
  HotCache* hot_;
  // Per writer thread: steady_clock nanoseconds at which its current storage call began; 0 idle.
  std::unique_ptr<std::atomic<int64_t>[]> busy_since_;
  size_t busy_slots_ = 0;
  WorkerPool writers_;  // last: stopped (its tasks drained) before the members above go
};

}  // namespace ckpt
