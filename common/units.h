// Byte sizes and durations as people write them in flags and YAML: "8GiB", "512MiB", "64k",
// "1.5GB", "4096"; "30s", "500ms", "2m". Binary suffixes (KiB, MiB, GiB, TiB, and the short
// K/M/G/T) are powers of 1024; decimal ones (kB, MB, GB, TB) powers of 1000.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace ckpt {

Result<uint64_t> ParseByteSize(std::string_view text);
Result<std::chrono::milliseconds> ParseDuration(std::string_view text);
// 1536 → "1.5 KiB".
std::string FormatBytes(uint64_t bytes);

}  // namespace ckpt
