// HotCache (daemon/hot_cache.h): lookups by valid range, the newest-step-per-job policy, pins,
// LRU reclaim, InsertRead never taking a slot it cannot have — and every slot going back to the
// pool on every path (checked through HostPool::free_slots).
#include "daemon/hot_cache.h"

#include <cstring>
#include <future>
#include <vector>

#include "tests/test_util.h"

namespace ckpt {
namespace {

constexpr uint64_t kWindow = 4096;  // the pool's slot size is the cache's window size
const std::string kFile = "rank-00000.data";

std::unique_ptr<HostPool> MakePool(uint32_t slots) {
  auto pool = HostPool::Create(
      HostPool::Config{.size = slots * kWindow, .slot_size = kWindow, .lock_memory = false});
  REQUIRE_OK(pool);
  return std::move(pool).value();
}

// Takes a slot, fills it with a pattern derived from `seed`, and returns it.
HostPool::SlotId FilledSlot(HostPool& pool, uint8_t seed) {
  auto s = pool.Acquire(nullptr);
  REQUIRE(s.has_value());
  for (uint64_t i = 0; i < kWindow; ++i) {
    pool.slot_data(*s)[i] = static_cast<std::byte>((i * 7 + seed) & 0xff);
  }
  return *s;
}

std::vector<std::byte> Bytes(size_t n, uint8_t seed) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>((i * 13 + seed) & 0xff);
  return v;
}

TEST_CASE("Find returns adopted bytes inside the valid range only", "[hot_cache]") {
  auto pool = MakePool(4);
  {
    HotCache cache(pool.get());
    const auto s0 = FilledSlot(*pool, 1);
    cache.Adopt("job", 7, kFile, 0, 3000, s0);
    CHECK(cache.resident_bytes() == kWindow);
    CHECK(pool->free_slots() == 3);

    CHECK(cache.Find("job", 7, kFile, 0, 3000) == pool->slot_data(s0));
    CHECK(cache.Find("job", 7, kFile, 100, 200) == pool->slot_data(s0) + 100);
    CHECK(cache.Find("job", 7, kFile, 2999, 1) == pool->slot_data(s0) + 2999);
    // Straddling the end of the valid range, or beyond it.
    CHECK(cache.Find("job", 7, kFile, 2900, 200) == nullptr);
    CHECK(cache.Find("job", 7, kFile, 3000, 1) == nullptr);
    CHECK(cache.Find("job", 7, kFile, 3500, 100) == nullptr);
    // Another window, file, step or job.
    CHECK(cache.Find("job", 7, kFile, kWindow, 10) == nullptr);
    CHECK(cache.Find("job", 7, "rank-00001.data", 0, 10) == nullptr);
    CHECK(cache.Find("job", 6, kFile, 0, 10) == nullptr);
    CHECK(cache.Find("job", 8, kFile, 0, 10) == nullptr);
    CHECK(cache.Find("other", 7, kFile, 0, 10) == nullptr);

    // A second window of the same file; a range across both windows is not contiguous.
    const auto s1 = FilledSlot(*pool, 2);
    cache.Adopt("job", 7, kFile, kWindow, kWindow, s1);
    CHECK(cache.Find("job", 7, kFile, kWindow + 10, 20) == pool->slot_data(s1) + 10);
    CHECK(cache.Find("job", 7, kFile, 2 * kWindow - 1, 1) == pool->slot_data(s1) + kWindow - 1);
    CHECK(cache.Find("job", 7, kFile, 2000, 3000) == nullptr);
    CHECK(cache.resident_bytes() == 2 * kWindow);
    CHECK(pool->free_slots() == 2);
  }
  CHECK(pool->free_slots() == 4);  // the destructor gave everything back
}

TEST_CASE("a newer step of a job drops the older one, other jobs are untouched", "[hot_cache]") {
  auto pool = MakePool(6);
  HotCache cache(pool.get());
  cache.Adopt("a", 1, kFile, 0, kWindow, FilledSlot(*pool, 1));
  cache.Adopt("a", 1, kFile, kWindow, kWindow, FilledSlot(*pool, 2));
  cache.Adopt("b", 1, kFile, 0, kWindow, FilledSlot(*pool, 3));
  REQUIRE(pool->free_slots() == 3);

  const auto s2 = FilledSlot(*pool, 4);
  cache.Adopt("a", 2, kFile, 0, kWindow, s2);
  CHECK(cache.Find("a", 1, kFile, 0, 10) == nullptr);
  CHECK(cache.Find("a", 1, kFile, kWindow, 10) == nullptr);
  CHECK(cache.Find("a", 2, kFile, 0, 10) == pool->slot_data(s2));
  CHECK(cache.Find("b", 1, kFile, 0, 10) != nullptr);
  CHECK(pool->free_slots() == 4);  // step 1's two slots went back
  CHECK(cache.resident_bytes() == 2 * kWindow);
}

TEST_CASE("an older step arriving after a newer one is released at once", "[hot_cache]") {
  auto pool = MakePool(3);
  HotCache cache(pool.get());
  const auto newer = FilledSlot(*pool, 1);
  cache.Adopt("job", 10, kFile, 0, kWindow, newer);
  const auto stale = FilledSlot(*pool, 2);
  REQUIRE(pool->free_slots() == 1);
  cache.Adopt("job", 9, kFile, 0, kWindow, stale);
  CHECK(pool->free_slots() == 2);
  CHECK(cache.Find("job", 9, kFile, 0, 10) == nullptr);
  CHECK(cache.Find("job", 10, kFile, 0, 10) == pool->slot_data(newer));
  CHECK(cache.resident_bytes() == kWindow);
  // Reads of the stale step are not cached either.
  const auto data = Bytes(100, 5);
  cache.InsertRead("job", 9, kFile, 0, data.data(), data.size());
  CHECK(cache.Find("job", 9, kFile, 0, 100) == nullptr);
  CHECK(pool->free_slots() == 2);
}

TEST_CASE("re-adopting the same window replaces the slot and frees the old one", "[hot_cache]") {
  auto pool = MakePool(3);
  HotCache cache(pool.get());
  const auto first = FilledSlot(*pool, 1);
  cache.Adopt("job", 3, kFile, 0, kWindow, first);
  const auto second = FilledSlot(*pool, 2);
  cache.Adopt("job", 3, kFile, 0, 100, second);
  CHECK(cache.Find("job", 3, kFile, 0, 100) == pool->slot_data(second));
  CHECK(cache.Find("job", 3, kFile, 0, 200) == nullptr);  // only the new valid range counts
  CHECK(pool->free_slots() == 2);
  CHECK(cache.resident_bytes() == kWindow);
}

TEST_CASE("a pinned step is not reclaimed, unpinned, it is", "[hot_cache]") {
  auto pool = MakePool(2);
  HotCache cache(pool.get());
  const auto s = FilledSlot(*pool, 1);
  cache.Adopt("job", 1, kFile, 0, kWindow, s);
  cache.Pin("job", 1);
  CHECK_FALSE(cache.ReclaimOne());
  CHECK(pool->free_slots() == 1);
  CHECK(cache.Find("job", 1, kFile, 0, kWindow) == pool->slot_data(s));

  cache.Unpin("job", 1);
  CHECK(cache.Find("job", 1, kFile, 0, kWindow) != nullptr);  // unpinning alone keeps it
  CHECK(cache.ReclaimOne());
  CHECK(pool->free_slots() == 2);
  CHECK(cache.Find("job", 1, kFile, 0, kWindow) == nullptr);
  CHECK(cache.resident_bytes() == 0);
  CHECK_FALSE(cache.ReclaimOne());  // nothing left
}

TEST_CASE("ReclaimOne frees the least recently used step first", "[hot_cache]") {
  auto pool = MakePool(4);
  HotCache cache(pool.get());
  cache.Adopt("a", 1, kFile, 0, kWindow, FilledSlot(*pool, 1));
  cache.Adopt("b", 1, kFile, 0, kWindow, FilledSlot(*pool, 2));
  cache.Adopt("c", 1, kFile, 0, kWindow, FilledSlot(*pool, 3));
  REQUIRE(cache.Find("a", 1, kFile, 0, 10) != nullptr);  // "a" is now the most recent
  REQUIRE(cache.ReclaimOne());
  CHECK(cache.Find("b", 1, kFile, 0, 10) == nullptr);
  CHECK(cache.Find("a", 1, kFile, 0, 10) != nullptr);
  CHECK(cache.Find("c", 1, kFile, 0, 10) != nullptr);
  CHECK(pool->free_slots() == 2);
  // The checks above found "a" before "c": "a" is now the least recently used.
  REQUIRE(cache.ReclaimOne());
  CHECK(cache.Find("a", 1, kFile, 0, 10) == nullptr);
  CHECK(cache.Find("c", 1, kFile, 0, 10) != nullptr);
  CHECK(pool->free_slots() == 3);
}

TEST_CASE("Drop of a pinned step frees it on the last Unpin", "[hot_cache]") {
  auto pool = MakePool(2);
  HotCache cache(pool.get());
  const auto s = FilledSlot(*pool, 9);
  cache.Adopt("job", 4, kFile, 0, kWindow, s);
  cache.Pin("job", 4);
  cache.Pin("job", 4);
  const std::byte* p = cache.Find("job", 4, kFile, 0, kWindow);
  REQUIRE(p == pool->slot_data(s));
  cache.Drop("job", 4);
  CHECK(pool->free_slots() == 1);                             // still pinned: not freed
  CHECK(cache.Find("job", 4, kFile, 0, kWindow) == nullptr);  // but forgotten
  CHECK(static_cast<int>(p[5]) == ((5 * 7 + 9) & 0xff));      // the pinned pointer is still intact
  CHECK_FALSE(cache.ReclaimOne());
  cache.Unpin("job", 4);
  CHECK(pool->free_slots() == 1);
  cache.Unpin("job", 4);
  CHECK(pool->free_slots() == 2);
  CHECK(cache.resident_bytes() == 0);
}

TEST_CASE("Drop of an unpinned step frees it at once, unknown steps are ignored", "[hot_cache]") {
  auto pool = MakePool(2);
  HotCache cache(pool.get());
  cache.Adopt("job", 4, kFile, 0, kWindow, FilledSlot(*pool, 1));
  cache.Drop("job", 5);
  cache.Drop("other", 4);
  CHECK(pool->free_slots() == 1);
  cache.Drop("job", 4);
  CHECK(pool->free_slots() == 2);
  cache.Unpin("job", 4);  // no entry: harmless
  CHECK(pool->free_slots() == 2);
}

TEST_CASE("a pinned older step survives a newer one until its Unpin", "[hot_cache]") {
  auto pool = MakePool(3);
  HotCache cache(pool.get());
  const auto old_slot = FilledSlot(*pool, 1);
  cache.Adopt("job", 1, kFile, 0, kWindow, old_slot);
  cache.Pin("job", 1);  // a load of step 1 is running
  cache.Adopt("job", 2, kFile, 0, kWindow, FilledSlot(*pool, 2));
  CHECK(pool->free_slots() == 1);  // step 1's slot is still held for the load
  CHECK(cache.Find("job", 2, kFile, 0, 10) != nullptr);
  cache.Unpin("job", 1);
  CHECK(pool->free_slots() == 2);
  CHECK(cache.Find("job", 1, kFile, 0, 10) == nullptr);
}

TEST_CASE("a kept step survives newer steps, adopts its late slots, and yields to pool pressure",
          "[hot_cache]") {
  auto pool = MakePool(4);
  HotCache cache(pool.get());
  cache.Keep("job", 1);  // its replication to peers has not run yet
  cache.Adopt("job", 1, kFile, 0, kWindow, FilledSlot(*pool, 1));
  cache.Adopt("job", 2, kFile, 0, kWindow, FilledSlot(*pool, 2));
  // Superseded, but still readable: and a slot of it written after step 2's is adopted too.
  CHECK(cache.Find("job", 1, kFile, 0, 10) != nullptr);
  cache.Adopt("job", 1, kFile, kWindow, kWindow, FilledSlot(*pool, 3));
  CHECK(cache.Find("job", 1, kFile, kWindow, 10) != nullptr);
  CHECK(pool->free_slots() == 1);
  // Pool pressure: a capture needs slots; the kept step is reclaimable (step 2 was used later).
  CHECK(cache.Find("job", 2, kFile, 0, 10) != nullptr);
  CHECK(cache.ReclaimOne());
  CHECK(pool->free_slots() == 3);
  CHECK(cache.Find("job", 1, kFile, 0, 10) == nullptr);
  CHECK(cache.Find("job", 2, kFile, 0, 10) != nullptr);
  cache.Unkeep("job", 1);  // nothing left to free; no harm
  CHECK(pool->free_slots() == 3);

  // Kept and not reclaimed: the last Unkeep frees the superseded step.
  cache.Keep("job", 3);
  cache.Adopt("job", 3, kFile, 0, kWindow, FilledSlot(*pool, 4));
  cache.Adopt("job", 4, kFile, 0, kWindow, FilledSlot(*pool, 5));  // supersedes 2 and 3
  CHECK(pool->free_slots() == 2);
  cache.Unkeep("job", 3);
  CHECK(pool->free_slots() == 3);
  CHECK(cache.Find("job", 3, kFile, 0, 10) == nullptr);
}

TEST_CASE("a kept step that is dropped or reclaimed gives its slots back and stays gone",
          "[hot_cache]") {
  auto pool = MakePool(3);
  HotCache cache(pool.get());
  cache.Keep("job", 1);
  cache.Keep("job", 1);  // two ranks of the node
  cache.Adopt("job", 1, kFile, 0, kWindow, FilledSlot(*pool, 1));
  CHECK(cache.ReclaimOne());  // pool pressure wins over the keeps
  CHECK(pool->free_slots() == 3);
  // A late slot of the reclaimed step is not cached: its bytes are incomplete.
  cache.Adopt("job", 1, kFile, kWindow, kWindow, FilledSlot(*pool, 2));
  CHECK(pool->free_slots() == 3);
  CHECK(cache.Find("job", 1, kFile, kWindow, 10) == nullptr);
  cache.Unkeep("job", 1);
  cache.Unkeep("job", 1);
  cache.Unkeep("job", 1);  // one too many: ignored
  // The entry is gone; a new save of step 1 caches again.
  cache.Adopt("job", 1, kFile, 0, kWindow, FilledSlot(*pool, 3));
  CHECK(cache.Find("job", 1, kFile, 0, 10) != nullptr);
  // Drop of a kept step: the bytes go at once.
  cache.Keep("job", 1);
  cache.Drop("job", 1);
  CHECK(pool->free_slots() == 3);
  CHECK(cache.Find("job", 1, kFile, 0, 10) == nullptr);
  cache.Unkeep("job", 1);
  CHECK(pool->free_slots() == 3);
}

TEST_CASE("InsertRead caches read bytes and merges adjacent ranges", "[hot_cache]") {
  auto pool = MakePool(2);
  HotCache cache(pool.get());
  const auto data = Bytes(kWindow, 3);
  cache.InsertRead("job", 5, kFile, 100, data.data() + 100, 50);
  cache.InsertRead("job", 5, kFile, 200, data.data() + 200, 50);
  CHECK(pool->free_slots() == 1);  // both ranges share the window's one slot
  const std::byte* a = cache.Find("job", 5, kFile, 100, 50);
  REQUIRE(a != nullptr);
  CHECK(std::memcmp(a, data.data() + 100, 50) == 0);
  CHECK(cache.Find("job", 5, kFile, 120, 100) == nullptr);  // across the gap
  cache.InsertRead("job", 5, kFile, 150, data.data() + 150, 50);
  const std::byte* merged = cache.Find("job", 5, kFile, 100, 150);
  REQUIRE(merged != nullptr);
  CHECK(std::memcmp(merged, data.data() + 100, 150) == 0);

  // A read in the next window takes a second slot; one straddling windows is not cached.
  cache.InsertRead("job", 5, kFile, kWindow + 8, data.data(), 16);
  CHECK(cache.Find("job", 5, kFile, kWindow + 8, 16) != nullptr);
  CHECK(pool->free_slots() == 0);
  cache.InsertRead("job", 5, kFile, kWindow - 8, data.data(), 16);
  CHECK(cache.Find("job", 5, kFile, kWindow - 8, 16) == nullptr);
  cache.InsertRead("job", 5, kFile, 0, data.data(), 0);
  CHECK(pool->free_slots() == 0);
}

TEST_CASE("InsertRead never takes a slot when none is free and never evicts", "[hot_cache]") {
  auto pool = MakePool(2);
  HotCache cache(pool.get());
  cache.Adopt("job", 1, kFile, 0, kWindow, FilledSlot(*pool, 1));
  const auto taken = *pool->Acquire(nullptr);  // a capture holds the last slot
  REQUIRE(pool->free_slots() == 0);

  const auto data = Bytes(100, 4);
  cache.InsertRead("job", 1, "rank-00001.data", 0, data.data(), 100);
  cache.InsertRead("other", 3, kFile, 0, data.data(), 100);
  CHECK(cache.Find("job", 1, "rank-00001.data", 0, 100) == nullptr);
  CHECK(cache.Find("other", 3, kFile, 0, 100) == nullptr);
  CHECK(pool->free_slots() == 0);
  CHECK(cache.Find("job", 1, kFile, 0, 10) != nullptr);  // nothing was evicted for it
  CHECK(cache.resident_bytes() == kWindow);
  pool->Release(taken);
}

// Regression: when InsertRead finds no free slot it has already created an entry for the
// step (steps_[{job, step}] and files[file]) and leaves it behind with no window. ReclaimOne
// then picks that empty entry and returns true — "freed a step" — although no slot went back to
// the pool, contrary to the reclaimer contract ("returns true when it released something").
TEST_CASE("ReclaimOne returns false when only a failed InsertRead touched the cache",
          "[hot_cache]") {
  auto pool = MakePool(1);
  HotCache cache(pool.get());
  const auto taken = *pool->Acquire(nullptr);
  const auto data = Bytes(100, 4);
  cache.InsertRead("job", 1, kFile, 0, data.data(), 100);
  CHECK(pool->free_slots() == 0);
  CHECK_FALSE(cache.ReclaimOne());  // nothing resident, nothing to free
  pool->Release(taken);
}

// Regression: "per job only the newest step is kept when a newer one arrives" holds
// for Adopt only; InsertRead of a newer step keeps the older step's slots resident.
TEST_CASE("InsertRead of a newer step drops the job's older step", "[hot_cache]") {
  auto pool = MakePool(3);
  HotCache cache(pool.get());
  cache.Adopt("job", 1, kFile, 0, kWindow, FilledSlot(*pool, 1));
  const auto data = Bytes(100, 4);
  cache.InsertRead("job", 2, kFile, 0, data.data(), 100);
  CHECK(cache.Find("job", 2, kFile, 0, 100) != nullptr);
  CHECK(cache.Find("job", 1, kFile, 0, 10) == nullptr);
  CHECK(pool->free_slots() == 2);
}

TEST_CASE("a capture waiting on a pool full of cached steps gets a slot through the reclaimer",
          "[hot_cache]") {
  auto pool = MakePool(2);
  HotCache cache(pool.get());
  pool->SetReclaimer([&] { return cache.ReclaimOne(); });
  cache.Adopt("a", 1, kFile, 0, kWindow, FilledSlot(*pool, 1));
  cache.Adopt("b", 1, kFile, 0, kWindow, FilledSlot(*pool, 2));
  REQUIRE(pool->free_slots() == 0);
  cache.Pin("b", 1);

  const auto got = pool->Acquire(nullptr);  // capture always wins over the cache
  REQUIRE(got.has_value());
  CHECK(cache.Find("a", 1, kFile, 0, 10) == nullptr);  // the unpinned step went
  CHECK(cache.Find("b", 1, kFile, 0, 10) != nullptr);  // the pinned one stayed

  // Everything cached is pinned now: a second capture waits until the pin goes.
  std::atomic<bool> cancel{false};  // set only if the test fails, to free the waiter
  auto waiter = std::async(std::launch::async, [&] { return pool->Acquire(&cancel); });
  struct CancelOnExit {
    HostPool* pool;
    std::atomic<bool>* flag;
    ~CancelOnExit() {
      *flag = true;
      pool->WakeAll();
    }
  } guard{pool.get(), &cancel};
  cache.Unpin("b", 1);  // makes "b" reclaimable and wakes the waiter
  // A hang guard only: Unpin must have made the waiter's slot available.
  REQUIRE(waiter.wait_for(std::chrono::seconds(60)) == std::future_status::ready);
  const auto second = waiter.get();
  REQUIRE(second.has_value());
  CHECK(cache.Find("b", 1, kFile, 0, 10) == nullptr);
  pool->Release(*got);
  pool->Release(*second);
  pool->SetReclaimer(nullptr);
  CHECK(pool->free_slots() == 2);
}

TEST_CASE("destroying the cache returns every slot, pinned or not", "[hot_cache]") {
  auto pool = MakePool(4);
  {
    HotCache cache(pool.get());
    cache.Adopt("a", 1, kFile, 0, kWindow, FilledSlot(*pool, 1));
    cache.Adopt("b", 2, kFile, kWindow, kWindow, FilledSlot(*pool, 2));
    const auto data = Bytes(64, 1);
    cache.InsertRead("c", 3, kFile, 0, data.data(), data.size());
    cache.Pin("a", 1);
    cache.Drop("b", 2);
    CHECK(pool->free_slots() == 2);
  }
  CHECK(pool->free_slots() == 4);
}

// Bytes already resident never change: a reader may be copying them out after verifying them.
// A range spanning windows is cached window by window.
TEST_CASE("InsertRead fills only the gaps and splits ranges at windows", "[hot_cache]") {
  auto pool = MakePool(4);
  HotCache cache(pool.get());
  const std::vector<std::byte> first(kWindow, std::byte{0x11}),
      second(2 * kWindow, std::byte{0x22});
  cache.InsertRead("job", 5, kFile, 0, first.data(), 100);
  cache.InsertRead("job", 5, kFile, 0, second.data(), kWindow + 50);  // over [0, 100) again
  const std::byte* head = cache.Find("job", 5, kFile, 0, 100);
  REQUIRE(head != nullptr);
  CHECK(std::all_of(head, head + 100, [](std::byte b) { return b == std::byte{0x11}; }));
  const std::byte* rest = cache.Find("job", 5, kFile, 100, kWindow - 100);
  REQUIRE(rest != nullptr);
  CHECK(std::all_of(rest, rest + kWindow - 100, [](std::byte b) { return b == std::byte{0x22}; }));
  const std::byte* next = cache.Find("job", 5, kFile, kWindow, 50);  // the second window
  REQUIRE(next != nullptr);
  CHECK(next[0] == std::byte{0x22});
  CHECK(pool->free_slots() == 2);
}

}  // namespace
}  // namespace ckpt
