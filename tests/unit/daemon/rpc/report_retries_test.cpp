// ReportRetries (daemon/rpc/report_retries.h): a newer report under a key drops the older one's
// retry and keeps it from being scheduled later; unkeyed reports are all kept; retries come out
// in the order they are due.
#include "daemon/rpc/report_retries.h"

#include <string>
#include <vector>

#include "tests/test_util.h"

namespace ckpt {
namespace {

using Clock = ReportRetries::Clock;
using std::chrono::milliseconds;

TEST_CASE("report retries: a newer report under the key replaces the older one's retry",
          "[rpc][report_retries]") {
  ReportRetries retries;
  const Clock::time_point t0 = Clock::now();
  std::vector<std::string> sent;
  const uint64_t first = retries.Queued("k");
  CHECK(retries.Schedule("k", first, t0, [&] { sent.push_back("first"); }));
  const uint64_t second = retries.Queued("k");  // drops the first's retry
  CHECK(second > first);
  CHECK(retries.waiting() == 0);
  CHECK(retries.TakeDue(t0 + milliseconds(1)) == nullptr);
  // The first failing only now (its answer was on its way): not kept either.
  CHECK_FALSE(retries.Schedule("k", first, t0, [&] { sent.push_back("first"); }));
  CHECK(retries.Schedule("k", second, t0, [&] { sent.push_back("second"); }));
  auto send = retries.TakeDue(t0);
  REQUIRE(send != nullptr);
  send();
  CHECK(sent == std::vector<std::string>{"second"});
  // Delivered: the key is forgotten, unless a newer one was queued meanwhile.
  const uint64_t third = retries.Queued("k");
  retries.Done("k", second);
  CHECK(retries.keys() == 1);
  retries.Done("k", third);
  CHECK(retries.keys() == 0);
  CHECK(retries.Queued("k") > third);  // numbers are never reused
}

TEST_CASE("report retries: unkeyed reports are all kept, and come out in the order they are due",
          "[rpc][report_retries]") {
  ReportRetries retries;
  const Clock::time_point t0 = Clock::now();
  std::vector<int> sent;
  CHECK(retries.Queued("") == 0);
  CHECK(retries.Schedule("", 0, t0 + milliseconds(30), [&] { sent.push_back(3); }));
  CHECK(retries.Schedule("", 0, t0 + milliseconds(10), [&] { sent.push_back(1); }));
  const uint64_t k = retries.Queued("k");
  CHECK(retries.Schedule("k", k, t0 + milliseconds(20), [&] { sent.push_back(2); }));
  CHECK(retries.Queued("") == 0);  // nothing unkeyed is dropped
  CHECK(retries.waiting() == 3);
  REQUIRE(retries.NextDue().has_value());
  CHECK(*retries.NextDue() == t0 + milliseconds(10));
  CHECK(retries.TakeDue(t0 + milliseconds(5)) == nullptr);  // none due yet
  while (auto send = retries.TakeDue(t0 + milliseconds(30))) send();
  CHECK(sent == std::vector<int>{1, 2, 3});
  CHECK_FALSE(retries.NextDue().has_value());
  CHECK(retries.keys() == 1);  // "k" waits for Done
}

}  // namespace
}  // namespace ckpt
