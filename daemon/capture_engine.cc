#include "daemon/capture_engine.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include "common/logging.h"

namespace ckpt {

CaptureEngine::CaptureEngine(const Config& config, HostPool* pool, FlushEngine* flush)
    : config_(config),
      pool_(pool),
      flush_(flush),
      copiers_("capture", config.threads, config.nice) {}

CaptureEngine::~CaptureEngine() { Stop(); }

void CaptureEngine::Start() { copiers_.Start(); }

void CaptureEngine::Stop() { copiers_.Stop(); }

std::string CaptureEngine::StorageStalled() const {
  if (config_.storage_stall_timeout.count() == 0) return {};
  const FlushEngine::Activity a = flush_->activity();
  const double limit = std::chrono::duration<double>(config_.storage_stall_timeout).count();
  if (a.in_flight == 0 || a.oldest_seconds < limit) return {};
  char oldest[32];
  std::snprintf(oldest, sizeof oldest, "%.1f", a.oldest_seconds);
  return "storage stalled (" + std::to_string(a.in_flight) + " writes in flight, the oldest for " +
         oldest + " s)";
}

void CaptureEngine::Submit(std::shared_ptr<CaptureJob> job) {
  if (copiers_.Post([this, job] { Capture(job); })) return;
  Refuse(job);
}

void CaptureEngine::Refuse(const std::shared_ptr<CaptureJob>& job) {
  // As a capture that failed before its first slot: the slots reserved for it go back, it
  // reports captured with the error, and its capture token goes to the flush engine, which
  // reports it persisted (with the same error, whether or not its writers still run).
  job->Fail(DaemonStopping("job '" + job->job + "' step " + std::to_string(job->step) + " rank " +
                               std::to_string(job->rank),
                           "its copy threads have stopped"));
  for (HostPool::SlotId slot : job->reserved_slots) pool_->Release(slot);
  job->on_captured(job->first_error());
  flush_->ReleaseCaptureToken(job);
}

Status CaptureEngine::CaptureSlot(CaptureJob& job, const Slot& slot, std::byte* dst,
                                  std::vector<CopyQueue*>& queues) {
  // Consecutive pieces of one shard are contiguous in both the trainer's memory and the slot:
  // copy each such run with one call (one memcpy of up to a slot). Checksums are computed by
  // the flush thread, off the path that wait_snapshot waits for.
  uint64_t cursor = 0;
  const auto& pieces = slot.pieces;
  for (size_t i = 0; i < pieces.size();) {
    const SlotPiece& first = pieces[i];
    uint64_t length = first.length;
    size_t j = i + 1;
    while (j < pieces.size() && pieces[j].shard == first.shard &&
           pieces[j].shard_offset == first.shard_offset + length &&
           pieces[j].slot_offset == first.slot_offset + length) {
      length += pieces[j].length;
      ++j;
    }
    if (first.slot_offset > cursor) std::memset(dst + cursor, 0, first.slot_offset - cursor);
    const RegisteredTensor& tensor = job.plan->tensors[first.shard];
    CopyQueue* queue = tensor.memory->copy_queue();
    Status s =
        queue == nullptr
            ? tensor.memory->CopyOut(first.shard_offset, dst + first.slot_offset, length)
            : tensor.memory->CopyOutAsync(first.shard_offset, dst + first.slot_offset, length);
    if (queue != nullptr && std::find(queues.begin(), queues.end(), queue) == queues.end()) {
      queues.push_back(queue);
    }
    if (!s.ok()) return s.WithContext("tensor '" + tensor.name + "'");
    cursor = first.slot_offset + length;
    i = j;
  }
  if (slot.length > cursor) std::memset(dst + cursor, 0, slot.length - cursor);
  return Status::Ok();
}

void CaptureEngine::Handoff(const std::shared_ptr<CaptureJob>& job, uint32_t index,
                            HostPool::SlotId slot) {
  job->bytes_captured.fetch_add(job->plan->layout.slots[index].length, std::memory_order_relaxed);
  job->pending.fetch_add(1);
  flush_->Submit(FlushEngine::Item{job, index, slot});
}

void CaptureEngine::Capture(const std::shared_ptr<CaptureJob>& job) {
  const auto& layout = job->plan->layout;
  Status status;
  size_t reserved_used = 0;
  const auto start = std::chrono::steady_clock::now();

  if (!job->cancelled.load()) {
    job->checksums.resize(job->plan->tensors.size());
    for (size_t i = 0; i < job->plan->tensors.size(); ++i) {
      job->checksums[i].assign(layout.chunk_counts[i], 0);
    }
    // The step directory and data file are made by a flush thread (capture_job.h).
    flush_->Prepare(job);
  }

  // Slots whose device copies are enqueued but not known to be done, oldest first.
  struct InFlight {
    uint32_t index;
    HostPool::SlotId slot;
    std::vector<std::unique_ptr<CopyFence>> fences;
  };
  std::deque<InFlight> in_flight;
  // Waits for the oldest slot's fences, then hands it on (or releases it after a failure).
  auto complete_oldest = [&] {
    InFlight f = std::move(in_flight.front());
    in_flight.pop_front();
    Status done;
    for (auto& fence : f.fences) {
      Status s = fence->Wait();
      if (done.ok() && !s.ok()) done = std::move(s);
    }
    if (!done.ok() && status.ok()) status = std::move(done);
    if (!status.ok() || job->cancelled.load()) {
      pool_->Release(f.slot);
      return;
    }
    Handoff(job, f.index, f.slot);
  };

  for (uint32_t i = 0; status.ok() && i < layout.slots.size(); ++i) {
    if (job->cancelled.load()) break;
    std::optional<HostPool::SlotId> slot;
    if (reserved_used < job->reserved_slots.size()) {
      slot = job->reserved_slots[reserved_used++];
    } else {
      // Never block for space while holding slots of our own whose copies may be done: they are
      // what frees the pool (a shard larger than the pool streams through it this way).
      while (!slot && !in_flight.empty() && status.ok()) {
        auto got = pool_->TryAcquireMany(1);
        if (got) {
          slot = (*got)[0];
        } else {
          complete_oldest();
        }
      }
      if (!status.ok()) break;
      // Wait for space while storage makes progress; a stalled filesystem (a write in flight
      // for longer than the stall timeout) will not free any soon: skip the step instead.
      while (!slot && !job->cancelled.load()) {
        if (config_.storage_stall_timeout.count() == 0) {
          slot = pool_->Acquire(&job->cancelled);
          break;
        }
        slot = pool_->AcquireFor(&job->cancelled, std::max(std::chrono::milliseconds(50),
                                                           config_.storage_stall_timeout / 10));
        if (slot) break;
        if (std::string stalled = StorageStalled(); !stalled.empty()) {
          status = ResourceExhausted("skipped: " + stalled + "; the host pool is full");
          break;
        }
      }
      if (!status.ok()) break;
      if (!slot) break;  // cancelled while waiting for space
    }
    const Slot& s = layout.slots[i];
    std::vector<CopyQueue*> queues;
    status = CaptureSlot(*job, s, pool_->slot_data(*slot), queues);
    InFlight f{i, *slot, {}};
    for (CopyQueue* q : queues) {
      auto fence = q->Record();
      if (!fence.ok()) {
        if (status.ok()) status = fence.status();
        continue;
      }
      f.fences.push_back(std::move(fence).value());
    }
    if (f.fences.empty() && !status.ok()) {
      pool_->Release(*slot);
      break;
    }
    if (f.fences.empty()) {
      Handoff(job, i, *slot);  // host memory: copied already
    } else {
      in_flight.push_back(std::move(f));
      if (!status.ok()) break;  // the fences are waited below before the slot is released
      while (in_flight.size() > kSlotsInFlight) complete_oldest();
    }

    if (job->throttle_bytes_per_second > 0) {
      // Keep the average copy rate at or below the throttle (so checkpoint traffic cannot
      // starve training of memory or PCIe bandwidth): sleep until the bytes so far are due.
      const double due_s = static_cast<double>(job->bytes_captured.load()) /
                           static_cast<double>(job->throttle_bytes_per_second);
      const auto due = start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                   std::chrono::duration<double>(due_s));
      while (!job->cancelled.load() && std::chrono::steady_clock::now() < due) {
        std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(
            due - std::chrono::steady_clock::now(), std::chrono::milliseconds(10)));
      }
    }
  }
  // Every enqueued copy must be done before its slot is flushed or reused.
  while (!in_flight.empty()) complete_oldest();
  // Unused reserved slots go back.
  for (; reserved_used < job->reserved_slots.size(); ++reserved_used) {
    pool_->Release(job->reserved_slots[reserved_used]);
  }
  if (!status.ok()) job->Fail(status);
  if (status.ok() && job->cancelled.load()) {
    Status e = job->first_error();
    status = e.ok() ? Aborted("capture was cancelled") : e;
  }
  job->on_captured(status);
  flush_->ReleaseCaptureToken(job);
}

}  // namespace ckpt
