// CaptureJob: one rank's save of one step as it moves through the pipeline.
//
//   capture thread:  for each slot of the plan's layout: take a pool slot (waiting for space
//                    — the backpressure), copy the slot's pieces out of trainer memory,
//                    hand the slot to the flush engine. It never touches storage, so a hung
//                    filesystem cannot stop captures while the pool has room.
//   flush threads:   create the step directory and data file (an item queued when the
//                    capture starts; the first slot waits for it), write the slot with one aligned
//                    pwrite, checksum the slot's pieces, hand the slot to the hot cache (or back to
//                    the pool).
//   last token:      a flush thread fdatasyncs the data file and reports the rank persisted.
//
// Completion is counted, not polled: `pending` holds one token for the capture pass and one per
// slot in flight to the flush engine; the thread that drops it to zero finalizes. The job's
// callbacks run on engine threads; the node state posts them onto its own loop.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/data_writer.h"
#include "common/mutex.h"
#include "common/step_layout.h"
#include "daemon/capture_plan.h"
#include "daemon/host_pool.h"

namespace ckpt {

struct CaptureJob {
  // ---- set before submission, then read-only ----
  std::string job;
  uint64_t step = 0;
  uint32_t rank = 0;
  std::shared_ptr<const CapturePlan> plan;
  std::string step_dir;
  std::string data_path;
  std::string data_file;  // data_path's name inside the step directory
  FileSystem* fs = nullptr;
  uint64_t throttle_bytes_per_second = 0;  // 0 = unthrottled
  // A memory-only step (Save.memory_only): no directory, no data file, no write — the slots are
  // checksummed and go to the hot cache as if written.
  bool memory_only = false;
  // Slots taken up front (on_full = skip); empty for the wait policy.
  std::vector<HostPool::SlotId> reserved_slots;
  // Called once each, from engine threads.
  std::function<void(Status)> on_captured;
  std::function<void(Status)> on_persisted;

  // ---- shared progress ----
  std::atomic<bool> cancelled{false};
  std::atomic<uint64_t> bytes_captured{0};
  std::atomic<uint64_t> bytes_written{0};
  std::atomic<int64_t> pending{1};  // the capture pass's token
  // Created by the first flush thread that needs it (EnsureWriter); read by the finalizer.
  std::unique_ptr<DataFileWriter> writer;
  // checksums[shard][piece]; each element written by the one flush thread that wrote its slot
  // (after the write), read after the job finished.
  std::vector<std::vector<uint64_t>> checksums;

  // Creates the step directory and the data file once; later callers wait for the first and
  // share its outcome. Runs on flush threads only: storage calls may block for as long as the
  // filesystem hangs.
  Status EnsureWriter() {
    if (memory_only) return Status::Ok();
    MutexLock lock(writer_mu);
    if (writer != nullptr) return Status::Ok();
    if (!writer_error.ok()) return writer_error;
    // Never into a committed step (a restarted trainer saving a step number again): its data
    // files would be overwritten under its MANIFEST.
    auto committed = fs->Exists(JoinPath(step_dir, std::string(kManifestFileName)));
    Status st = committed.status();
    if (st.ok() && *committed) {
      st = FailedPrecondition("job '" + job + "' step " + std::to_string(step) +
                              " is already committed; ckptd never overwrites a committed "
                              "checkpoint (save later step numbers, proto/README.md)");
    }
    if (st.ok()) st = fs->CreateDirs(step_dir);
    if (st.ok()) {
      auto created = DataFileWriter::Create(fs, data_path, plan->layout.file_size);
      if (created.ok()) {
        writer = std::move(created).value();
      } else {
        st = created.status();
      }
    }
    writer_error = st;
    return st;
  }

  // First error wins; it also cancels the job.
  void Fail(Status s) {
    MutexLock lock(error_mu);
    if (error.ok()) error = std::move(s);
    cancelled.store(true);
  }
  Status first_error() const {
    MutexLock lock(error_mu);
    return error;
  }

  mutable Mutex error_mu;
  Status error GUARDED_BY(error_mu);
  Mutex writer_mu;
  Status writer_error GUARDED_BY(writer_mu);
};

}  // namespace ckpt
