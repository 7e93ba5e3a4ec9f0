// FlushEngine: writer threads that drain captured slots to storage.
//
// Each submitted slot is written with one aligned pwrite through the job's DataFileWriter (so
// with O_DIRECT where the filesystem takes it), then its pool slot is returned. Queue depth
// equals the number of threads; the queue itself is bounded by the pool (an item holds a slot).
// When a job's last slot is done the engine finishes the data file (fdatasync) and reports.
//
// Thread safety: Submit from any thread.
#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "daemon/capture_job.h"
#include "daemon/host_pool.h"
#include "daemon/hot_cache.h"

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
  // Lets queued items finish, then joins the threads.
  void Stop();

  struct Item {
    std::shared_ptr<CaptureJob> job;
    uint32_t slot_index;  // into job->plan->layout.slots
    HostPool::SlotId pool_slot;
  };
  // The item's job must hold a pending token for it (the capture engine adds it).
  void Submit(Item item);

  // Drops one pending token of the job; the caller that brings it to zero finalizes: fdatasync
  // and on_persisted. Used by the capture engine for its own token.
  static void ReleaseToken(const std::shared_ptr<CaptureJob>& job);

 private:
  void Run();

  Config config_;
  HostPool* pool_;
  HotCache* hot_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_;  // guarded by mu_
  bool stopping_ = false;   // guarded by mu_
  std::vector<std::thread> threads_;
};

}  // namespace ckpt
