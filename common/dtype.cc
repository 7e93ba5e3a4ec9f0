#include "common/dtype.h"

#include <array>
#include <cstdint>

namespace ckpt {
namespace {
constexpr std::array kDTypes = {
    DTypeInfo{"float32", 4, "F32"},
    DTypeInfo{"bfloat16", 2, "BF16"},
    DTypeInfo{"float16", 2, "F16"},
    DTypeInfo{"float64", 8, "F64"},
    DTypeInfo{"int8", 1, "I8"},
    DTypeInfo{"uint8", 1, "U8"},
    DTypeInfo{"int16", 2, "I16"},
    DTypeInfo{"int32", 4, "I32"},
    DTypeInfo{"int64", 8, "I64"},
    DTypeInfo{"bool", 1, "BOOL"},
    DTypeInfo{"float8_e4m3fn", 1, "F8_E4M3"},
    DTypeInfo{"float8_e5m2", 1, "F8_E5M2"},
};
}  // namespace

std::span<const DTypeInfo> AllDTypes() { return kDTypes; }

Result<DTypeInfo> LookupDType(std::string_view name) {
  for (const auto& d : kDTypes) {
    if (d.name == name) return d;
  }
  std::string known;
  for (const auto& d : kDTypes) {
    if (!known.empty()) known += ", ";
    known += d.name;
  }
  return InvalidArgument("unknown dtype '" + std::string(name) + "' (known: " + known + ")");
}

Result<uint64_t> ByteSize(uint64_t numel, const DTypeInfo& dtype) {
  // At most 2^63 - 1 bytes: every byte count and offset fits a signed 64-bit file offset.
  if (numel > static_cast<uint64_t>(INT64_MAX) / dtype.element_size) {
    return InvalidArgument(std::to_string(numel) + " elements of " + std::string(dtype.name) +
                           " take more than 2^63 bytes");
  }
  return numel * dtype.element_size;
}

}  // namespace ckpt
