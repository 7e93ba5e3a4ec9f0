#include "common/units.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace ckpt {
namespace {

// Splits "12.5GiB" into 12.5 and "GiB"; false when no number leads.
bool SplitNumber(std::string_view text, double* number, std::string* suffix) {
  std::string s(text);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  size_t start = 0;
  while (start < s.size() && std::isspace(static_cast<unsigned char>(s[start]))) ++start;
  s = s.substr(start);
  if (s.empty() || !(std::isdigit(static_cast<unsigned char>(s[0])) || s[0] == '.')) return false;
  char* end = nullptr;
  *number = std::strtod(s.c_str(), &end);
  *suffix = std::string(end);
  while (!suffix->empty() && suffix->front() == ' ') suffix->erase(0, 1);
  return std::isfinite(*number) && *number >= 0;
}

}  // namespace

Result<uint64_t> ParseByteSize(std::string_view text) {
  double n = 0;
  std::string suffix;
  if (!SplitNumber(text, &n, &suffix)) {
    return InvalidArgument("'" + std::string(text) + "' is not a size (e.g. 8GiB, 512MiB)");
  }
  struct Unit {
    const char* name;
    double factor;
  };
  static constexpr Unit kUnits[] = {
      {"", 1},
      {"B", 1},
      {"K", 1024.0},
      {"KiB", 1024.0},
      {"k", 1024.0},
      {"kB", 1e3},
      {"KB", 1e3},
      {"M", 1048576.0},
      {"MiB", 1048576.0},
      {"MB", 1e6},
      {"G", 1073741824.0},
      {"GiB", 1073741824.0},
      {"GB", 1e9},
      {"T", 1099511627776.0},
      {"TiB", 1099511627776.0},
      {"TB", 1e12},
      {"P", 1125899906842624.0},
      {"PiB", 1125899906842624.0},
      {"PB", 1e15},
  };
  for (const auto& u : kUnits) {
    if (suffix == u.name) {
      const double bytes = std::round(n * u.factor);
      // 2^64 is exactly representable; anything at or above it does not fit.
      if (bytes >= 18446744073709551616.0) {
        return InvalidArgument("size '" + std::string(text) + "' is too large");
      }
      return static_cast<uint64_t>(bytes);
    }
  }
  return InvalidArgument("unknown size unit '" + suffix + "' in '" + std::string(text) +
                         "' (use B, KiB, MiB, GiB, TiB, kB, MB, GB, TB)");
}

Result<std::chrono::milliseconds> ParseDuration(std::string_view text) {
  double n = 0;
  std::string suffix;
  if (!SplitNumber(text, &n, &suffix)) {
    return InvalidArgument("'" + std::string(text) + "' is not a duration (e.g. 30s, 500ms)");
  }
  double ms = 0;
  if (suffix == "ms")
    ms = n;
  else if (suffix == "s" || suffix.empty())
    ms = n * 1e3;
  else if (suffix == "m" || suffix == "min")
    ms = n * 60e3;
  else if (suffix == "h")
    ms = n * 3600e3;
  else
    return InvalidArgument("unknown duration unit '" + suffix + "' in '" + std::string(text) +
                           "' (use ms, s, m, h)");
  if (ms >= 9.2e18) return InvalidArgument("duration '" + std::string(text) + "' is too long");
  return std::chrono::milliseconds(static_cast<int64_t>(std::llround(ms)));
}

std::string FormatBytes(uint64_t bytes) {
  static constexpr const char* kNames[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(bytes);
  int i = 0;
  while (v >= 1024.0 && i < 5) {
    v /= 1024.0;
    ++i;
  }
  char buf[32];
  if (i == 0)
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
  else
    std::snprintf(buf, sizeof buf, "%.1f %s", v, kNames[i]);
  return buf;
}

}  // namespace ckpt
