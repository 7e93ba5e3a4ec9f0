// ParseByteSize, ParseDuration and FormatBytes (common/units.h).
#include "common/units.h"

#include <chrono>
#include <cstdint>
#include <limits>
#include <string>

#include "tests/test_util.h"

namespace ckpt {
namespace {

using Catch::Matchers::Contains;
using std::chrono::milliseconds;

constexpr uint64_t kKiB = 1024, kMiB = kKiB << 10, kGiB = kMiB << 10, kTiB = kGiB << 10;

uint64_t Bytes(std::string_view text) {
  auto r = ParseByteSize(text);
  INFO("ParseByteSize(\"" << text << "\")");
  REQUIRE_OK(r);
  return *r;
}

milliseconds Millis(std::string_view text) {
  auto r = ParseDuration(text);
  INFO("ParseDuration(\"" << text << "\")");
  REQUIRE_OK(r);
  return *r;
}

TEST_CASE("ParseByteSize: plain numbers are bytes", "[units]") {
  CHECK(Bytes("512") == 512);
  CHECK(Bytes("0") == 0);
  CHECK(Bytes("4096") == 4096);
  CHECK(Bytes("512B") == 512);
  CHECK(Bytes("9007199254740992") == 9'007'199'254'740'992ull);  // 2^53
}

TEST_CASE("ParseByteSize: binary suffixes are powers of 1024", "[units]") {
  CHECK(Bytes("8GiB") == 8 * kGiB);
  CHECK(Bytes("512MiB") == 512 * kMiB);
  CHECK(Bytes("64KiB") == 64 * kKiB);
  CHECK(Bytes("2TiB") == 2 * kTiB);
  // Short forms.
  CHECK(Bytes("64k") == 64 * kKiB);
  CHECK(Bytes("64K") == 64 * kKiB);
  CHECK(Bytes("16M") == 16 * kMiB);
  CHECK(Bytes("8G") == 8 * kGiB);
  CHECK(Bytes("1T") == kTiB);
  // Fractions of a binary unit.
  CHECK(Bytes("1.5KiB") == 1536);
  CHECK(Bytes("0.5GiB") == 512 * kMiB);
  CHECK(Bytes(".5MiB") == 512 * kKiB);
}

TEST_CASE("ParseByteSize: decimal suffixes are powers of 1000", "[units]") {
  CHECK(Bytes("1.5GB") == 1'500'000'000ull);
  CHECK(Bytes("2GB") == 2'000'000'000ull);
  CHECK(Bytes("10MB") == 10'000'000ull);
  CHECK(Bytes("3kB") == 3000);
  CHECK(Bytes("3KB") == 3000);
  CHECK(Bytes("4TB") == 4'000'000'000'000ull);
}

TEST_CASE("ParseByteSize: surrounding and inner spaces are tolerated", "[units]") {
  CHECK(Bytes(" 8GiB ") == 8 * kGiB);
  CHECK(Bytes("8 GiB") == 8 * kGiB);
  CHECK(Bytes("1.5 KiB") == 1536);  // what FormatBytes prints
}

TEST_CASE("ParseByteSize: bad input is kInvalidArgument quoting the text", "[units]") {
  for (std::string_view bad : {"", "   ", "GiB", "abc", "8XiB", "8 gigs", "8gib", "8iB", "1.5.5GiB",
                               "0x", "8GiBs", "nan", "inf"}) {
    INFO("input \"" << bad << "\"");
    auto r = ParseByteSize(bad);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kInvalidArgument);
    CHECK_THAT(r.status().message(), Contains("'" + std::string(bad) + "'"));
  }
}

TEST_CASE("ParseByteSize: an unknown unit is named in the error", "[units]") {
  auto r = ParseByteSize("8XiB");
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(r.status().message(), Contains("unknown size unit 'XiB'"));
}

TEST_CASE("ParseByteSize: negative sizes are rejected", "[units]") {
  for (std::string_view bad : {"-1", "-8GiB", " -1", "-0.5KiB"}) {
    INFO("input \"" << bad << "\"");
    auto r = ParseByteSize(bad);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kInvalidArgument);
  }
}

TEST_CASE("ParseByteSize: sizes past 2^64 bytes are rejected, not wrapped", "[units]") {
  for (std::string_view bad : {"17179869184GiB",  // exactly 2^64
                               "16777216TiB",     // 2^64
                               "100000000TB", "1e30", "99999999999999999999999"}) {
    INFO("input \"" << bad << "\"");
    auto r = ParseByteSize(bad);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kInvalidArgument);
    CHECK_THAT(r.status().message(), Contains("too large"));
  }
}

// Regression: sizes between 2^63 and the 1.8e19 cut-off go through std::llround, whose
// result is a signed long long; past LLONG_MAX it is unspecified (x86-64 gives LLONG_MIN), so
// "10000000000GiB" parses as 9223372036854775808 instead of 10737418240000000000.
TEST_CASE("ParseByteSize: sizes between 2^63 and 2^64 are exact or rejected", "[units]") {
  struct Case {
    std::string_view text;
    uint64_t exact;
  };
  for (const Case& c : {Case{"10000000000GiB", 10'000'000'000ull * kGiB},
                        Case{"10000000000000000000", 10'000'000'000'000'000'000ull}}) {
    INFO("input \"" << c.text << "\"");
    auto r = ParseByteSize(c.text);
    if (r.ok()) CHECK(*r == c.exact);
  }
}

TEST_CASE("ParseDuration: units", "[units]") {
  CHECK(Millis("30s") == milliseconds(30'000));
  CHECK(Millis("500ms") == milliseconds(500));
  CHECK(Millis("2m") == milliseconds(120'000));
  CHECK(Millis("2min") == milliseconds(120'000));
  CHECK(Millis("1h") == milliseconds(3'600'000));
  CHECK(Millis("1.5s") == milliseconds(1500));
  CHECK(Millis("0s") == milliseconds(0));
  CHECK(Millis(" 10 s ") == milliseconds(10'000));
}

TEST_CASE("ParseDuration: bad input is kInvalidArgument", "[units]") {
  for (std::string_view bad : {"", "s", "ten seconds", "-1s", "5x", "5 hours", "1d", "5S"}) {
    INFO("input \"" << bad << "\"");
    auto r = ParseDuration(bad);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kInvalidArgument);
  }
  auto r = ParseDuration("5x");
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(r.status().message(), Contains("'x'"));
}

// Regression: ParseDuration converts with std::llround without a range check, so a
// duration past INT64_MAX milliseconds (about 292 million years) becomes an unspecified value
// (LLONG_MIN on x86-64: a negative timeout) instead of an error.
TEST_CASE("ParseDuration: a duration past int64 milliseconds is rejected", "[units]") {
  auto r = ParseDuration("1e20s");
  if (r.ok()) {
    INFO("parsed as " << r->count() << " ms");
    CHECK(r->count() > 0);
  }
  CHECK_FALSE(r.ok());
}

TEST_CASE("FormatBytes", "[units]") {
  CHECK(FormatBytes(0) == "0 B");
  CHECK(FormatBytes(1) == "1 B");
  CHECK(FormatBytes(1023) == "1023 B");
  CHECK(FormatBytes(1024) == "1.0 KiB");
  CHECK(FormatBytes(1536) == "1.5 KiB");
  CHECK(FormatBytes(16 * kMiB) == "16.0 MiB");
  CHECK(FormatBytes(8 * kGiB) == "8.0 GiB");
  CHECK(FormatBytes(3 * kTiB / 2) == "1.5 TiB");
  CHECK(FormatBytes(kTiB * 1024) == "1.0 PiB");
  const std::string max = FormatBytes(std::numeric_limits<uint64_t>::max());
  CHECK_THAT(max, Contains("PiB"));
}

TEST_CASE("FormatBytes output parses back for whole and half units", "[units]") {
  // Up to TiB: ParseByteSize has no PiB.
  for (int shift = 0; shift < 49; ++shift) {
    for (uint64_t mult : {1ull, 3ull}) {
      const uint64_t v = mult << shift;
      INFO(v << " -> \"" << FormatBytes(v) << "\"");
      CHECK(Bytes(FormatBytes(v)) == v);
    }
  }
}

}  // namespace
}  // namespace ckpt
