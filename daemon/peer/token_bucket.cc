#include "daemon/peer/token_bucket.h"

#include <algorithm>

namespace ckpt::peer {

TokenBucket::TokenBucket(uint64_t bytes_per_second, uint64_t burst, Clock clock)
    : rate_(bytes_per_second), burst_(burst), clock_(std::move(clock)) {
  if (burst_ == 0) burst_ = std::max<uint64_t>(rate_ / 4, 1);
  MutexLock lock(mu_);
  level_ = static_cast<double>(burst_);
  last_ = Now();
}

std::chrono::steady_clock::time_point TokenBucket::Now() const {
  return clock_ ? clock_() : std::chrono::steady_clock::now();
}

void TokenBucket::RefillLocked(std::chrono::steady_clock::time_point now) {
  if (now <= last_) return;
  const double seconds = std::chrono::duration<double>(now - last_).count();
  level_ = std::min(static_cast<double>(burst_), level_ + seconds * static_cast<double>(rate_));
  last_ = now;
}

std::chrono::nanoseconds TokenBucket::Take(uint64_t bytes) {
  if (rate_ == 0) return std::chrono::nanoseconds(0);
  MutexLock lock(mu_);
  RefillLocked(Now());
  level_ -= static_cast<double>(bytes);
  if (level_ >= 0) return std::chrono::nanoseconds(0);
  const double seconds = -level_ / static_cast<double>(rate_);
  return std::chrono::nanoseconds(static_cast<int64_t>(seconds * 1e9));
}

}  // namespace ckpt::peer
