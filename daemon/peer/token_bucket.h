// TokenBucket: the data plane's bandwidth cap (--peer-bandwidth BYTES_PER_S, 0 = none), so that
// peer traffic leaves the network to training first.
//
// Tokens are bytes. They accrue at `rate` per second up to `burst` (default: a quarter second's
// worth). Take(n) is admission with debt: it always succeeds at once, subtracts n (the level may go
// negative) and returns how long the caller must wait before sending, which is the time the
// debt needs to be paid back. Senders therefore never starve each other and a large chunk is
// admitted whole; over any interval the bytes sent stay within rate * interval + burst.
//
// The clock is injected (tests drive a fake one; the daemon uses steady_clock). A rate of 0
// makes Take return 0 always. Thread safety: all methods from any thread (one mutex).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>

#include "common/mutex.h"

namespace ckpt::peer {

class TokenBucket {
 public:
  using Clock = std::function<std::chrono::steady_clock::time_point()>;

  // `bytes_per_second` 0: unlimited. `burst` 0: the default above. `clock` empty: steady_clock.
  explicit TokenBucket(uint64_t bytes_per_second, uint64_t burst = 0, Clock clock = {});

  // Admits `bytes`; returns the wait before they may be sent (zero when within the budget).
  std::chrono::nanoseconds Take(uint64_t bytes);

  uint64_t rate() const { return rate_; }
  uint64_t burst() const { return burst_; }

 private:
  std::chrono::steady_clock::time_point Now() const;
  void RefillLocked(std::chrono::steady_clock::time_point now) REQUIRES(mu_);

  const uint64_t rate_;
  uint64_t burst_;
  Clock clock_;
  Mutex mu_;
  double level_ GUARDED_BY(mu_) = 0;  // tokens; negative: debt
  std::chrono::steady_clock::time_point last_ GUARDED_BY(mu_);
};

}  // namespace ckpt::peer
