// ReportRetries: the coordinator link's reports waiting to be sent again (coordinator_link.h).
//
// A report the coordinator did not answer or could not take is sent again later by the link's
// sender thread. Some reports replace older ones of the same kind — a rank's newer registration
// replaces its older one, a step's newer PERSISTED report (whose node manifest holds every rank of
// the older one) replaces the older — and an older one must then never reach the coordinator after
// the newer, or it would move the rank back or shrink the node's manifest. Such reports carry a key
// ("registration of job j rank r", "PERSISTED of job j step s"); each report queued under a key
// gets a number (one counter for all keys, never reused) and drops any retry waiting under it, and
// a retry is kept only while its number is still the key's newest. The link numbers a report in the
// same hold of its mutex that queues it, so numbers follow the queue's order whichever threads
// report. Reports nothing replaces (a rank's CAPTURED, say: repeats of it change nothing, in any
// order) have the empty key.
//
// Not thread-safe: the link guards it with its mutex.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>

namespace ckpt {

class ReportRetries {
 public:
  using Clock = std::chrono::steady_clock;

  // A report under `key` is queued: its number, and any retry waiting under `key` is dropped.
  // The empty key: 0, and nothing is dropped. Call it when the report is really queued.
  uint64_t Queued(const std::string& key);
  // Sends `send` on the sender thread at `due`, unless a newer report under `key` was queued
  // since (`seq` is no longer the key's newest). False when it was not kept.
  bool Schedule(const std::string& key, uint64_t seq, Clock::time_point due,
                std::function<void()> send);
  // Whether `seq` is the newest report queued under `key`.
  bool IsNewest(const std::string& key, uint64_t seq) const;
  // The report numbered `seq` under `key` was delivered, refused or given up: the key is
  // forgotten unless a newer report under it is queued.
  void Done(const std::string& key, uint64_t seq);
  // The retry due first, if it is due at `now`: removed and returned; else null.
  std::function<void()> TakeDue(Clock::time_point now);
  // When the retry due first is due; nullopt when none waits.
  std::optional<Clock::time_point> NextDue() const;

  size_t waiting() const { return waiting_.size(); }
  size_t keys() const { return newest_.size(); }

 private:
  struct Waiting {
    Clock::time_point due;
    std::function<void()> send;
  };
  std::map<std::string, uint64_t> newest_;  // key → the number of its newest report queued
  std::map<std::string, Waiting> waiting_;  // key (or "\x01<n>" for the empty key) → its retry
  uint64_t last_number_ = 0;                // of any key
  uint64_t unkeyed_ = 0;
};

}  // namespace ckpt
