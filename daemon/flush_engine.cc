#include "daemon/flush_engine.h"

#include <algorithm>
#include <chrono>

#include "common/checksum.h"
#include "common/logging.h"

namespace ckpt {

FlushEngine::FlushEngine(const Config& config, HostPool* pool, HotCache* hot)
    : config_(config),
      pool_(pool),
      hot_(hot),
      busy_since_(new std::atomic<int64_t>[static_cast<size_t>(std::max(1, config.threads))]),
      busy_slots_(static_cast<size_t>(std::max(1, config.threads))),
      writers_("flush", static_cast<int>(busy_slots_), config.nice) {
  for (size_t i = 0; i < busy_slots_; ++i) busy_since_[i] = 0;
}

FlushEngine::~FlushEngine() { Stop(); }

void FlushEngine::Start() { writers_.Start(); }

void FlushEngine::Stop() { writers_.Stop(); }

void FlushEngine::Submit(Item item) {
  if (writers_.Post([this, item](size_t thread) { Process(item, thread); })) return;
  Refuse(item);
}

void FlushEngine::Refuse(const Item& item) {
  CaptureJob& job = *item.job;
  job.Fail(DaemonStopping("job '" + job.job + "' step " + std::to_string(job.step) + " rank " +
                              std::to_string(job.rank),
                          "its writer threads have stopped"));
  pool_->WakeAll();                    // its capture may be waiting for space it no longer needs
  if (item.slot_index == kFinalize) {  // the last token was dropped already
    job.on_persisted(job.first_error());
    return;
  }
  if (item.slot_index != kPrepare) pool_->Release(item.pool_slot);
  // The last token reports at once: no storage call on this (capture or loop) thread, and the
  // failed step's files are removed anyway (a DataFileWriter closes its file when destroyed).
  if (job.pending.fetch_sub(1) == 1) job.on_persisted(job.first_error());
}

template <typename F>
auto FlushEngine::Timed(size_t thread, F&& call) {
  busy_since_[thread].store(std::chrono::steady_clock::now().time_since_epoch().count());
  auto result = call();
  busy_since_[thread].store(0);
  return result;
}

FlushEngine::Activity FlushEngine::activity() const {
  Activity a;
  const int64_t now = std::chrono::steady_clock::now().time_since_epoch().count();
  int64_t oldest = now;
  for (size_t i = 0; i < busy_slots_; ++i) {
    const int64_t since = busy_since_[i].load();
    if (since == 0) continue;
    ++a.in_flight;
    oldest = std::min(oldest, since);
  }
  if (a.in_flight > 0) {
    a.oldest_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::duration(now - oldest)).count();
  }
  return a;
}

void FlushEngine::Prepare(const std::shared_ptr<CaptureJob>& job) {
  job->pending.fetch_add(1);
  Submit(Item{job, kPrepare, 0});
}

void FlushEngine::ReleaseCaptureToken(const std::shared_ptr<CaptureJob>& job) {
  if (job->pending.fetch_sub(1) != 1) return;
  Submit(Item{job, kFinalize, 0});
}

void FlushEngine::ReleaseToken(const std::shared_ptr<CaptureJob>& job, size_t thread) {
  if (job->pending.fetch_sub(1) != 1) return;
  Finalize(job, thread);
}

void FlushEngine::Finalize(const std::shared_ptr<CaptureJob>& job, size_t thread) {
  // Last one out: every slot was written (or the job failed). Finish the data file.
  Status status = job->first_error();
  if (status.ok() && !job->cancelled.load()) {
    // A rank with nothing to write still gets its (empty) data file.
    status = Timed(thread, [&] { return job->EnsureWriter(); });
  }
  if (job->writer != nullptr) {
    if (status.ok()) {
      status = Timed(thread, [&] { return job->writer->Finish(); });
    } else {
      Timed(thread, [&] { return job->writer->Finish(); }).IgnoreError();  // the step is removed
    }
  }
  if (status.ok() && job->cancelled.load()) status = Aborted("capture was cancelled");
  job->on_persisted(std::move(status));
}

void FlushEngine::Process(const Item& item, size_t thread) {
  if (item.slot_index == kFinalize) {
    Finalize(item.job, thread);
    return;
  }
  if (item.slot_index == kPrepare) {
    if (!item.job->cancelled.load()) {
      Status made = Timed(thread, [&] { return item.job->EnsureWriter(); });
      if (!made.ok()) {
        item.job->Fail(std::move(made));
        pool_->WakeAll();  // its capture may be waiting for space it no longer needs
      }
    }
    ReleaseToken(item.job, thread);
    return;
  }
  CaptureJob& job = *item.job;
  bool adopted = false;
  if (!job.cancelled.load()) {
    const Slot& slot = job.plan->layout.slots[item.slot_index];
    const std::byte* data = pool_->slot_data(item.pool_slot);
    // Write first, checksum after (see flush_engine.h): the slot stays ours and immutable
    // until it is released or adopted below, so the checksum still covers the stored bytes.
    Status s = Timed(thread, [&] {
      Status made = job.EnsureWriter();
      if (!made.ok() || job.memory_only) return made;
      return job.writer->WriteAt(slot.file_offset, data, slot.length);
    });
    if (s.ok()) {
      for (const SlotPiece& piece : slot.pieces) {
        job.checksums[piece.shard][piece.chunk_index] =
            Xxh3(data + piece.slot_offset, piece.length);
      }
      job.bytes_written.fetch_add(slot.length, std::memory_order_relaxed);
      if (hot_ != nullptr && !job.cancelled.load()) {
        hot_->Adopt(job.job, job.step, job.data_file, slot.file_offset, slot.length,
                    item.pool_slot);
        adopted = true;
      }
    } else {
      spdlog::warn("job {} step {} rank {}: {}", job.job, job.step, job.rank, s.ToString());
      job.Fail(std::move(s));
      pool_->WakeAll();  // the capture pass may be waiting for space it no longer needs
    }
  }
  if (!adopted) pool_->Release(item.pool_slot);
  ReleaseToken(item.job, thread);
}

}  // namespace ckpt
