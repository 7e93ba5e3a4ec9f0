// CaptureEngine: threads that copy registered trainer memory into the host pool while the
// trainer goes on with forward/backward (the lazy snapshot of docs/design.md §2.3).
//
// A job is captured slot by slot in file order by one thread (a single-thread memcpy already
// outruns storage ~10×, and several ranks are captured in parallel by the pool of threads).
// Each slot is handed to the FlushEngine as soon as it is copied, so capture and write overlap;
// a shard larger than the pool simply streams through it. The copy is the only work on the
// path wait_snapshot waits for: checksums are computed by the flush threads after each write
// (flush_engine.h says why; copy + XXH3 in one pass, here or fused per 64-512 KiB block, ran at
// 0.40-0.71 of memcpy on the 2-core machines, because both passes are bound by memory
// bandwidth). When the pool is full the thread waits in HostPool::Acquire — that wait is the
// backpressure that reaches wait_snapshot — unless the job is cancelled (trainer died, step
// aborted).
//
// Device memory (CUDA) goes the same way, asynchronously: the slot's copies are enqueued on each
// GPU's copy stream (which already waits for the trainer's event of this save, see
// daemon/device/cuda_backend.h), a fence is recorded after the slot, and the slot is handed to
// the FlushEngine once its fences are done. Up to kSlotsInFlight slots of one job are copying at
// once, so the DMA engine always has the next chunk queued while the thread waits for one. A
// slot is never released or flushed before its fences completed — not even on failure — because
// the DMA may still be writing into it.
//
// The copy threads are a WorkerPool of their own (worker_pool.h), apart from the writer threads:
// a filesystem that hangs never holds a copy. A job submitted after Stop is never copied: it
// fails ("the daemon is stopping"), its reserved slots go back, and it reports captured and
// persisted with that error, so nothing waits for it forever.
//
// Thread safety: Submit from any thread.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "daemon/capture_job.h"
#include "daemon/flush_engine.h"
#include "daemon/host_pool.h"
#include "daemon/worker_pool.h"

namespace ckpt {

class CaptureEngine {
 public:
  struct Config {
    int threads = 2;
    int nice = 0;  // of the copy threads (thread_priority.h)
    // A storage call of the flush engine in flight for this long means storage is stalled:
    // a capture waiting for pool space then gives up (the step is skipped) instead of waiting
    // for a filesystem that may never answer. 0: wait for space whatever storage does.
    std::chrono::milliseconds storage_stall_timeout{0};
  };
  // Slots of one job whose device copies may be in flight at once.
  static constexpr size_t kSlotsInFlight = 4;
  CaptureEngine(const Config& config, HostPool* pool, FlushEngine* flush);
  ~CaptureEngine();

  void Start();
  // Cancels nothing: lets queued jobs run (callers cancel jobs first if they want), then joins.
  void Stop();
  // After Stop the job fails at once (its callbacks are called from here).
  void Submit(std::shared_ptr<CaptureJob> job);

  // Why storage counts as stalled now ("storage stalled: ..."), or empty when it does not.
  std::string StorageStalled() const;

 private:
  // A job the stopped copy threads will never take (see the essay).
  void Refuse(const std::shared_ptr<CaptureJob>& job);
  void Capture(const std::shared_ptr<CaptureJob>& job);
  // A captured slot goes to the flush engine (counted in bytes_captured, one pending token).
  void Handoff(const std::shared_ptr<CaptureJob>& job, uint32_t index, HostPool::SlotId slot);
  // Copies (host) or enqueues (device) the slot's pieces; the queues it enqueued on are added
  // to `queues`.
  Status CaptureSlot(CaptureJob& job, const Slot& slot, std::byte* dst,
                     std::vector<CopyQueue*>& queues);

  Config config_;
  HostPool* pool_;
  FlushEngine* flush_;
  WorkerPool copiers_;  // last: stopped (its jobs drained) before the members above go
};

}  // namespace ckpt
