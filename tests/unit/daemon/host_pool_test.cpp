// HostPool (daemon/host_pool.h): slot accounting, blocking Acquire, cancellation, the
// all-or-nothing TryAcquireMany and the reclaimer hook. Blocking is shown without sleeps: a
// waiter proves it found the pool empty by calling the reclaimer, which signals the test.
#include "daemon/host_pool.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "tests/test_util.h"

namespace ckpt {
namespace {

using Catch::Matchers::Contains;
using namespace std::chrono_literals;

constexpr uint64_t kSlot = 4096;

std::unique_ptr<HostPool> MakePool(uint32_t slots, uint64_t slot_size = kSlot) {
  auto pool = HostPool::Create(
      HostPool::Config{.size = slots * slot_size, .slot_size = slot_size, .lock_memory = false});
  REQUIRE_OK(pool);
  return std::move(pool).value();
}

// Counts events and lets a test wait until n have happened.
class Counter {
 public:
  void Add() {
    {
      std::lock_guard lock(mu_);
      ++n_;
    }
    cv_.notify_all();
  }
  // True once n events happened. The long timeout only turns a hang into a failure.
  [[nodiscard]] bool WaitAtLeast(int n) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, 60s, [&] { return n_ >= n; });
  }
  int value() {
    std::lock_guard lock(mu_);
    return n_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int n_ = 0;
};

// Cancels a waiter and wakes it when the test leaves its scope, so that a failed REQUIRE never
// leaves a blocked std::async future (whose destructor would wait forever).
struct CancelOnExit {
  HostPool* pool;
  std::atomic<bool>* flag;
  ~CancelOnExit() {
    *flag = true;
    pool->WakeAll();
  }
};

// A hang guard, not synchronisation: the future is expected to be ready already or very soon.
template <typename T>
bool Finishes(std::future<T>& f) {
  return f.wait_for(60s) == std::future_status::ready;
}

TEST_CASE("HostPool::Create validates the slot size and rounds the size down", "[host_pool]") {
  auto pool = HostPool::Create(
      HostPool::Config{.size = 3 * kSlot + 100, .slot_size = kSlot, .lock_memory = false});
  REQUIRE_OK(pool);
  CHECK((*pool)->slot_count() == 3);
  CHECK((*pool)->slot_size() == kSlot);
  CHECK((*pool)->size_bytes() == 3 * kSlot);
  CHECK((*pool)->free_slots() == 3);
  CHECK_FALSE((*pool)->locked());

  for (uint64_t bad : {uint64_t{0}, uint64_t{1000}, uint64_t{4097}}) {
    INFO("slot size " << bad);
    auto r =
        HostPool::Create(HostPool::Config{.size = 1 << 20, .slot_size = bad, .lock_memory = false});
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kInvalidArgument);
    CHECK_THAT(r.status().message(), Contains(std::to_string(bad)));
  }
  auto small = HostPool::Create(
      HostPool::Config{.size = kSlot - 1, .slot_size = kSlot, .lock_memory = false});
  REQUIRE_FALSE(small.ok());
  CHECK(small.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(small.status().message(), Contains("smaller than one slot"));
}

TEST_CASE("a deferred pool is mapped first and populated by Pin, its memory resident after",
          "[host_pool]") {
  auto pool = HostPool::Create(HostPool::Config{
      .size = 4 * kSlot, .slot_size = kSlot, .lock_memory = false, .defer_pin = true});
  REQUIRE_OK(pool);
  const size_t pages = (*pool)->size_bytes() / 4096;
  std::vector<unsigned char> resident(pages);
  REQUIRE(::mincore((*pool)->base(), (*pool)->size_bytes(), resident.data()) == 0);
  CHECK(std::count_if(resident.begin(), resident.end(), [](unsigned char c) { return c & 1; }) ==
        0);  // nothing faulted in yet
  REQUIRE_OK((*pool)->Pin());
  REQUIRE(::mincore((*pool)->base(), (*pool)->size_bytes(), resident.data()) == 0);
  CHECK(std::count_if(resident.begin(), resident.end(), [](unsigned char c) { return c & 1; }) ==
        static_cast<long>(pages));
  CHECK_FALSE((*pool)->locked());  // lock_memory = false
}

// The smaps fields ("Size" -> "6144 kB") of the mapping that starts at `base`; empty if none.
std::map<std::string, std::string> SmapsFields(const void* base) {
  std::ifstream smaps("/proc/self/smaps");
  std::map<std::string, std::string> fields;
  std::string line;
  bool in_entry = false;
  char want[32];
  std::snprintf(want, sizeof want, "%lx-", reinterpret_cast<unsigned long>(base));
  while (std::getline(smaps, line)) {
    const size_t colon = line.find(':');
    const bool header = colon == std::string::npos || line.find(' ') < colon;
    if (header) {
      if (in_entry) break;
      in_entry = line.rfind(want, 0) == 0;
    } else if (in_entry) {
      const size_t value = line.find_first_not_of(' ', colon + 1);
      fields[line.substr(0, colon)] = value == std::string::npos ? "" : line.substr(value);
    }
  }
  return fields;
}

bool TransparentHugePagesOn() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string mode;
  std::getline(f, mode);
  return mode.find("[always]") != std::string::npos || mode.find("[madvise]") != std::string::npos;
}

TEST_CASE("the pool is 2 MiB aligned, trimmed to its slots, and eligible for huge pages",
          "[host_pool]") {
  constexpr uint64_t kHuge = 2ull << 20;
  auto pool = MakePool(3, kHuge);
  const auto base = reinterpret_cast<uintptr_t>(pool->base());
  CHECK(base % kHuge == 0);
  // The alignment slack around the pool was given back: the mapping is exactly the slots.
  auto fields = SmapsFields(pool->base());
  REQUIRE_FALSE(fields.empty());
  CHECK(fields["Size"] == "6144 kB");
  if (TransparentHugePagesOn()) {
    CHECK(fields["THPeligible"] == "1");
  } else {
    WARN("transparent huge pages are off on this machine: eligibility not checked");
  }
  // Huge pages or not, every byte of every slot is ordinary writable memory.
  for (uint32_t i = 0; i < pool->slot_count(); ++i) std::memset(pool->slot_data(i), i + 1, kHuge);
  CHECK(static_cast<int>(pool->slot_data(2)[kHuge - 1]) == 3);
}

TEST_CASE("slots are disjoint, writable, and come back in any order", "[host_pool]") {
  auto pool = MakePool(4);
  std::vector<HostPool::SlotId> got;
  for (int i = 0; i < 4; ++i) {
    auto s = pool->Acquire(nullptr);
    REQUIRE(s.has_value());
    REQUIRE(*s < 4);
    got.push_back(*s);
    CHECK(pool->free_slots() == static_cast<uint32_t>(3 - i));
  }
  CHECK(std::set<HostPool::SlotId>(got.begin(), got.end()).size() == 4);
  for (auto s : got) {
    CHECK(pool->slot_data(s) == pool->base() + uint64_t{s} * kSlot);
    std::memset(pool->slot_data(s), static_cast<int>(s + 1), kSlot);
  }
  for (auto s : got) {
    CHECK(static_cast<int>(pool->slot_data(s)[0]) == static_cast<int>(s + 1));
    CHECK(static_cast<int>(pool->slot_data(s)[kSlot - 1]) == static_cast<int>(s + 1));
  }

  // Release out of order; the same four come back.
  for (size_t i : {size_t{2}, size_t{0}, size_t{3}, size_t{1}}) pool->Release(got[i]);
  CHECK(pool->free_slots() == 4);
  std::set<HostPool::SlotId> again;
  for (int i = 0; i < 4; ++i) again.insert(*pool->Acquire(nullptr));
  CHECK(again == std::set<HostPool::SlotId>(got.begin(), got.end()));
  CHECK(pool->free_slots() == 0);
  for (auto s : again) pool->Release(s);
}

TEST_CASE("Acquire on an empty pool blocks until a Release and gets that slot", "[host_pool]") {
  auto pool = MakePool(2);
  const auto a = *pool->Acquire(nullptr);
  const auto b = *pool->Acquire(nullptr);
  REQUIRE(pool->free_slots() == 0);

  Counter found_empty;
  pool->SetReclaimer([&] {
    found_empty.Add();
    return false;  // nothing to give back
  });
  std::atomic<bool> guard_flag{false};  // set only by the guard when the test fails
  auto waiter = std::async(std::launch::async, [&] { return pool->Acquire(&guard_flag); });
  CancelOnExit guard{pool.get(), &guard_flag};
  REQUIRE(found_empty.WaitAtLeast(1));  // the waiter saw no free slot
  CHECK(pool->free_slots() == 0);
  // It cannot have finished: no slot is free and nobody cancelled it.
  CHECK(waiter.wait_for(0s) == std::future_status::timeout);

  pool->Release(b);
  REQUIRE(Finishes(waiter));
  const auto got = waiter.get();
  REQUIRE(got.has_value());
  CHECK(*got == b);
  CHECK(pool->free_slots() == 0);
  pool->Release(a);
  pool->Release(*got);
  CHECK(pool->free_slots() == 2);
}

TEST_CASE("cancelling a waiter and WakeAll return nullopt without taking a slot", "[host_pool]") {
  auto pool = MakePool(1);
  const auto held = *pool->Acquire(nullptr);
  Counter found_empty;
  pool->SetReclaimer([&] {
    found_empty.Add();
    return false;
  });
  std::atomic<bool> cancel{false};
  auto waiter = std::async(std::launch::async, [&] { return pool->Acquire(&cancel); });
  CancelOnExit guard{pool.get(), &cancel};
  REQUIRE(found_empty.WaitAtLeast(1));
  CHECK(waiter.wait_for(0s) == std::future_status::timeout);
  cancel = true;
  pool->WakeAll();
  REQUIRE(Finishes(waiter));
  CHECK_FALSE(waiter.get().has_value());
  CHECK(pool->free_slots() == 0);
  pool->Release(held);
  CHECK(pool->free_slots() == 1);
}

TEST_CASE("an already-cancelled acquirer on an empty pool returns nullopt at once", "[host_pool]") {
  auto pool = MakePool(1);
  const auto held = *pool->Acquire(nullptr);
  const std::atomic<bool> cancelled{true};
  CHECK_FALSE(pool->Acquire(&cancelled).has_value());
  pool->Release(held);
}

TEST_CASE("WakeAll wakes only the cancelled waiter out, the other still gets a slot",
          "[host_pool]") {
  auto pool = MakePool(1);
  const auto held = *pool->Acquire(nullptr);
  Counter found_empty;
  pool->SetReclaimer([&] {
    found_empty.Add();
    return false;
  });
  std::atomic<bool> cancel_first{false}, cancel_second{false};
  auto first = std::async(std::launch::async, [&] { return pool->Acquire(&cancel_first); });
  auto second = std::async(std::launch::async, [&] { return pool->Acquire(&cancel_second); });
  CancelOnExit guard_first{pool.get(), &cancel_first};
  CancelOnExit guard_second{pool.get(), &cancel_second};
  REQUIRE(found_empty.WaitAtLeast(2));  // both found the pool empty

  cancel_first = true;
  pool->WakeAll();
  REQUIRE(Finishes(first));
  CHECK_FALSE(first.get().has_value());
  // The second is not cancelled and no slot is free: it is still waiting.
  CHECK(second.wait_for(0s) == std::future_status::timeout);

  pool->Release(held);
  REQUIRE(Finishes(second));
  const auto got = second.get();
  REQUIRE(got.has_value());
  CHECK(*got == held);
  pool->Release(*got);
}

TEST_CASE("TryAcquireMany takes all or nothing, now", "[host_pool]") {
  auto pool = MakePool(4);
  const auto one = *pool->Acquire(nullptr);
  REQUIRE(pool->free_slots() == 3);

  CHECK_FALSE(pool->TryAcquireMany(4, /*reclaim=*/false).has_value());
  CHECK_FALSE(pool->TryAcquireMany(4).has_value());  // no reclaimer set
  CHECK(pool->free_slots() == 3);                    // nothing was taken

  auto none = pool->TryAcquireMany(0);
  REQUIRE(none.has_value());
  CHECK(none->empty());

  auto three = pool->TryAcquireMany(3);
  REQUIRE(three.has_value());
  REQUIRE(three->size() == 3);
  std::set<HostPool::SlotId> distinct(three->begin(), three->end());
  distinct.insert(one);
  CHECK(distinct.size() == 4);
  CHECK(pool->free_slots() == 0);
  CHECK_FALSE(pool->TryAcquireMany(1, false).has_value());

  for (auto s : *three) pool->Release(s);
  pool->Release(one);
  CHECK(pool->free_slots() == 4);
}

TEST_CASE("Acquire on an empty pool asks the reclaimer and gets the slot it released",
          "[host_pool]") {
  auto pool = MakePool(2);
  const auto a = *pool->Acquire(nullptr);
  const auto cached = *pool->Acquire(nullptr);
  int calls = 0;
  pool->SetReclaimer([&] {
    ++calls;
    pool->Release(cached);  // the hot cache gives a step back
    return true;
  });
  const auto got = pool->Acquire(nullptr);
  REQUIRE(got.has_value());
  CHECK(*got == cached);
  CHECK(calls == 1);
  CHECK(pool->free_slots() == 0);

  // With free slots the reclaimer is not asked.
  pool->Release(a);
  const auto direct = pool->Acquire(nullptr);
  CHECK(direct == a);
  CHECK(calls == 1);
  pool->Release(*direct);
  pool->Release(*got);
}

TEST_CASE("TryAcquireMany asks the reclaimer only when allowed, and stays all-or-nothing",
          "[host_pool]") {
  auto pool = MakePool(3);
  std::vector<HostPool::SlotId> cache;  // slots "held by the cache"
  for (int i = 0; i < 3; ++i) cache.push_back(*pool->Acquire(nullptr));
  int calls = 0;
  pool->SetReclaimer([&] {
    ++calls;
    if (cache.empty()) return false;
    pool->Release(cache.back());
    cache.pop_back();
    return true;
  });

  CHECK_FALSE(pool->TryAcquireMany(2, /*reclaim=*/false).has_value());
  CHECK(calls == 0);

  auto two = pool->TryAcquireMany(2, /*reclaim=*/true);
  REQUIRE(two.has_value());
  CHECK(two->size() == 2);
  CHECK(calls == 2);
  CHECK(pool->free_slots() == 0);

  // One more slot can be reclaimed, but two are asked for: nothing is taken.
  auto too_many = pool->TryAcquireMany(2, true);
  CHECK_FALSE(too_many.has_value());
  CHECK(pool->free_slots() == 1);
  CHECK(cache.empty());

  for (auto s : *two) pool->Release(s);
  CHECK(pool->free_slots() == 3);
}

TEST_CASE("concurrent Acquire/Release never hands a slot to two owners", "[host_pool]") {
  auto pool = MakePool(3);
  std::vector<std::atomic<int>> owner(3);
  for (auto& o : owner) o = -1;
  std::atomic<int> violations{0};
  constexpr int kThreads = 6, kIters = 2000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kIters; ++i) {
        const auto s = pool->Acquire(nullptr);
        if (!s) {
          ++violations;
          return;
        }
        int expected = -1;
        if (!owner[*s].compare_exchange_strong(expected, t)) ++violations;
        std::memset(pool->slot_data(*s), t, 64);
        if (static_cast<int>(pool->slot_data(*s)[63]) != t) ++violations;
        owner[*s] = -1;
        pool->Release(*s);
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(violations == 0);
  CHECK(pool->free_slots() == 3);
}

}  // namespace
}  // namespace ckpt
