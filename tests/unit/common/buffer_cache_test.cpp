// BufferCache: buffers come back for reuse, and what it keeps stays bounded.
#include "common/buffer_cache.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "tests/test_util.h"

namespace ckpt {
namespace {

TEST_CASE("BufferCache lends a given-back buffer again instead of a new one", "[buffer_cache]") {
  BufferCache cache;
  AlignedBuffer a = cache.Take(1 << 20);
  REQUIRE(a.size() >= (1u << 20));
  std::byte* const at = a.data();
  std::memset(at, 0x5A, a.size());
  cache.Give(std::move(a));
  // A smaller request takes the same memory (not zeroed again: a borrower overwrites it).
  AlignedBuffer b = cache.Take(4096);
  CHECK(b.data() == at);
  CHECK(b.data()[0] == std::byte{0x5A});
  // Nothing retained now: a second request gets new, zero-filled memory.
  AlignedBuffer c = cache.Take(4096);
  CHECK(c.data() != at);
  CHECK(c.data()[0] == std::byte{0});
}

TEST_CASE("BufferCache keeps at most kMaxRetained buffers, none over kMaxRetainedBytes",
          "[buffer_cache]") {
  BufferCache cache;
  // Too large to keep: freed, so the next Take of that size is new memory.
  AlignedBuffer big = cache.Take(BufferCache::kMaxRetainedBytes + 4096);
  cache.Give(std::move(big));
  std::vector<AlignedBuffer> taken;
  for (size_t i = 0; i <= BufferCache::kMaxRetained; ++i) taken.push_back(cache.Take(4096));
  std::vector<std::byte*> given;
  for (auto& b : taken) {
    given.push_back(b.data());
    cache.Give(std::move(b));
  }
  // One more than it keeps was given back: the last one was freed. Taking kMaxRetained + 1
  // buffers again returns the first kMaxRetained given, then a new one.
  std::vector<AlignedBuffer> again;
  for (size_t i = 0; i <= BufferCache::kMaxRetained; ++i) again.push_back(cache.Take(4096));
  for (size_t i = 0; i < BufferCache::kMaxRetained; ++i) {
    CHECK(std::find(given.begin(), given.end() - 1, again[i].data()) != given.end() - 1);
  }
  CHECK(again.back().data()[0] == std::byte{0});
}

TEST_CASE("BufferCache lends the smallest buffer that fits, and keeps large ones over small",
          "[buffer_cache]") {
  BufferCache cache;
  AlignedBuffer large = cache.Take(1 << 20);
  AlignedBuffer small = cache.Take(4096);
  std::byte* const large_at = large.data();
  std::byte* const small_at = small.data();
  cache.Give(std::move(large));
  cache.Give(std::move(small));
  AlignedBuffer b = cache.Take(4096);
  CHECK(b.data() == small_at);  // not the 1 MiB one
  cache.Give(std::move(b));
  // Full of small buffers: a large one given back replaces one of them.
  AlignedBuffer big = cache.Take(1 << 20);
  CHECK(big.data() == large_at);
  std::vector<AlignedBuffer> smalls;
  for (size_t i = 0; i < BufferCache::kMaxRetained; ++i) smalls.push_back(cache.Take(4096));
  for (auto& s : smalls) cache.Give(std::move(s));
  cache.Give(std::move(big));
  AlignedBuffer again = cache.Take(1 << 20);
  CHECK(again.data() == large_at);
}

TEST_CASE("BorrowedBuffer grows on demand and goes back to the shared cache", "[buffer_cache]") {
  // Empty the shared cache first (other tests of this process may have left buffers in it).
  std::vector<AlignedBuffer> held;
  for (size_t i = 0; i < BufferCache::kMaxRetained; ++i) {
    held.push_back(BufferCache::Shared().Take(1));
  }
  std::byte* at = nullptr;
  {
    BorrowedBuffer borrowed;
    CHECK(borrowed.size() == 0);
    borrowed.Reserve(64 << 10);
    REQUIRE(borrowed.size() >= (64u << 10));
    at = borrowed.data();
    borrowed.Reserve(4096);  // already large enough: the same buffer
    CHECK(borrowed.data() == at);
  }
  // Given back on scope exit: the shared cache lends it again.
  AlignedBuffer again = BufferCache::Shared().Take(64 << 10);
  CHECK(again.data() == at);
  BufferCache::Shared().Give(std::move(again));
  for (auto& b : held) BufferCache::Shared().Give(std::move(b));
}

}  // namespace
}  // namespace ckpt
