// Helpers shared by the Catch2 suites.
#pragma once

#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>

#include "common/status.h"

// REQUIRE_OK(expr): expr is a Status or Result<T>; on failure prints the status.
#define REQUIRE_OK(expr)                                              \
  do {                                                                \
    ::ckpt::Status _s = ::ckpt::detail::AsStatus(expr);               \
    INFO(#expr << " -> " << _s.ToString());                           \
    REQUIRE(_s.ok());                                                 \
  } while (0)
#define CHECK_OK(expr)                                                \
  do {                                                                \
    ::ckpt::Status _s = ::ckpt::detail::AsStatus(expr);               \
    INFO(#expr << " -> " << _s.ToString());                           \
    CHECK(_s.ok());                                                   \
  } while (0)

namespace ckpt::testing {

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
