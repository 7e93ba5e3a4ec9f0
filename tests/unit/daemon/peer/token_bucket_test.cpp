// The data plane's bandwidth cap (daemon/peer/token_bucket.h), driven by a fake clock: waits
// follow from the rate and the burst exactly, never from how fast the test runs.
#include "daemon/peer/token_bucket.h"

#include <catch2/catch.hpp>

namespace ckpt::peer {
namespace {

using std::chrono::milliseconds;
using std::chrono::nanoseconds;

struct FakeClock {
  std::chrono::steady_clock::time_point now{};
  TokenBucket::Clock Fn() {
    return [this] { return now; };
  }
};

TEST_CASE("token bucket: a rate of 0 never waits", "[peer]") {
  TokenBucket bucket(0);
  CHECK(bucket.Take(1ull << 40) == nanoseconds(0));
}

TEST_CASE("token bucket: the burst passes at once, then bytes wait for the rate", "[peer]") {
  FakeClock clock;
  TokenBucket bucket(1000, 500, clock.Fn());  // 1000 B/s, burst 500 B
  CHECK(bucket.Take(500) == nanoseconds(0));
  // 250 bytes of debt at 1000 B/s: 250 ms.
  CHECK(bucket.Take(250) == milliseconds(250));
  // The debt accumulates: another 250 waits until 500 ms.
  CHECK(bucket.Take(250) == milliseconds(500));
  // After 500 ms the debt is paid; nothing is banked beyond that yet.
  clock.now += milliseconds(500);
  CHECK(bucket.Take(100) == milliseconds(100));
}

TEST_CASE("token bucket: idle time refills up to the burst, not beyond", "[peer]") {
  FakeClock clock;
  TokenBucket bucket(1000, 500, clock.Fn());
  CHECK(bucket.Take(500) == nanoseconds(0));
  clock.now += std::chrono::seconds(60);  // would be 60000 tokens without the cap
  CHECK(bucket.Take(500) == nanoseconds(0));
  CHECK(bucket.Take(1000) == milliseconds(1000));
}

TEST_CASE("token bucket: a chunk larger than the burst is admitted whole", "[peer]") {
  FakeClock clock;
  TokenBucket bucket(1 << 20, 0, clock.Fn());  // default burst: a quarter second
  CHECK(bucket.burst() == (1u << 20) / 4);
  // 16 MiB at 1 MiB/s with 256 KiB banked: 15.75 s.
  CHECK(bucket.Take(16u << 20) == milliseconds(15750));
}

TEST_CASE("token bucket: the long-run rate holds over many takes", "[peer]") {
  FakeClock clock;
  TokenBucket bucket(10000, 1000, clock.Fn());
  // A sender that sleeps exactly what it is told sends 100 x 1000 B in 9.9 s (the first 1000 B
  // were the burst): 10000 B/s.
  nanoseconds total{0};
  for (int i = 0; i < 100; ++i) {
    const auto wait = bucket.Take(1000);
    clock.now += wait;
    total += wait;
  }
  CHECK(total == milliseconds(9900));
}

}  // namespace
}  // namespace ckpt::peer
