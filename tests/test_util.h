// Helpers shared by the Catch2 suites.
#pragma once

#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>

#include "common/status.h"

// REQUIRE_OK(expr): expr is a Status or Result<T>; on failure prints the status.
#define REQUIRE_OK(expr)                                \
  do {                                                  \
    ::ckpt::Status _s = ::ckpt::detail::AsStatus(expr); \
    INFO(#expr << " -> " << _s.ToString());             \
    REQUIRE(_s.ok());                                   \
  } while (0)
#define CHECK_OK(expr)                                  \
  do {                                                  \
    ::ckpt::Status _s = ::ckpt::detail::AsStatus(expr); \
    INFO(#expr << " -> " << _s.ToString());             \
    CHECK(_s.ok());                                     \
  } while (0)

// CHECK_TIMING(cond, measured): `cond` compares a measured wall-clock time with a performance or
// latency bound ("Save returned within 100 ms"); `measured` streams what was measured, for the
// report. Asserted in plain builds. Under AddressSanitizer or ThreadSanitizer (kUnderSanitizer)
// every instrumented access is several times slower, and unevenly so, so a missed bound says
// nothing about ckptd: it is not asserted there, only reported as a Catch WARN with the
// expression and `measured`, and the test goes on. Deadlines that only turn a hang into a
// failure (kHang, PollUntil) are not timing bounds and stay plain assertions in every build.
#define CHECK_TIMING(cond, measured)                                                        \
  do {                                                                                      \
    if constexpr (::ckpt::testing::kUnderSanitizer) {                                       \
      if (!(cond)) {                                                                        \
        WARN("timing bound missed under a sanitizer, not asserted: " #cond " (" << measured \
                                                                                << ")");    \
      }                                                                                     \
    } else {                                                                                \
      INFO(measured);                                                                       \
      CHECK(cond);                                                                          \
    }                                                                                       \
  } while (0)

namespace ckpt::testing {

// True when this test binary is built with AddressSanitizer or ThreadSanitizer (GCC defines
// __SANITIZE_*__, Clang answers __has_feature). The one place the tests ask; see CHECK_TIMING.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kUnderSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
inline constexpr bool kUnderSanitizer = true;
#else
inline constexpr bool kUnderSanitizer = false;
#endif
#else
inline constexpr bool kUnderSanitizer = false;
#endif

// A fresh directory under $TMPDIR (or /tmp), removed when the object dies unless
// CKPT_KEEP_TEST_DIRS is set (to read a failed test's logs afterwards).
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/ckpt-test-XXXXXX";
    char* p = ::mkdtemp(tmpl.data());
    if (p == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = p;
  }
  ~TempDir() {
    const char* keep = std::getenv("CKPT_KEEP_TEST_DIRS");
    if (keep != nullptr && *keep != '\0') return;
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// The seed of a randomized test: CKPT_TEST_SEED if set, else a fixed default; printed by
// Catch on failure through INFO at the call site.
inline uint64_t TestSeed(uint64_t fallback = 20261122) {
  const char* s = std::getenv("CKPT_TEST_SEED");
  return s && *s ? std::strtoull(s, nullptr, 10) : fallback;
}

}  // namespace ckpt::testing
