#include "daemon/thread_priority.h"
#include "daemon/flush_engine.h"

#include "common/checksum.h"
#include "common/logging.h"

namespace ckpt {

FlushEngine::FlushEngine(const Config& config, HostPool* pool, HotCache* hot)
    : config_(config), pool_(pool), hot_(hot) {}

FlushEngine::~FlushEngine() { Stop(); }

void FlushEngine::Start() {
  for (int i = 0; i < std::max(1, config_.threads); ++i) threads_.emplace_back([this] { Run(); });
}

void FlushEngine::Stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
  threads_.clear();
}

void FlushEngine::Submit(Item item) {
  {
    std::lock_guard lock(mu_);
    queue_.push_back(std::move(item));
  }
  cv_.notify_one();
}

void FlushEngine::ReleaseToken(const std::shared_ptr<CaptureJob>& job) {
  if (job->pending.fetch_sub(1) != 1) return;
  // Last one out: every slot was written (or the job failed). Finish the data file.
  Status status = job->first_error();
  if (job->writer != nullptr) {
    if (status.ok()) {
      status = job->writer->Finish();
    } else {
      job->writer->Finish().IgnoreError();  // closes the file; the step is removed anyway
    }
  }
  if (status.ok() && job->cancelled.load()) status = Aborted("capture was cancelled");
  job->on_persisted(std::move(status));
}

void FlushEngine::Run() {
  SetThisThreadNice(config_.nice);
  while (true) {
    Item item;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping and drained
      item = std::move(queue_.front());
      queue_.pop_front();
    }
    CaptureJob& job = *item.job;
    bool adopted = false;
    if (!job.cancelled.load()) {
      const Slot& slot = job.plan->layout.slots[item.slot_index];
      const std::byte* data = pool_->slot_data(item.pool_slot);
      // Write first, checksum after (see flush_engine.h): the slot stays ours and immutable
      // until it is released or adopted below, so the checksum still covers the stored bytes.
      Status s = job.writer->WriteAt(slot.file_offset, data, slot.length);
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
    ReleaseToken(item.job);
  }
}

}  // namespace ckpt
