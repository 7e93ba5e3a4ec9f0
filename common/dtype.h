// The dtype table: PyTorch names (docs/design.md §7.6) and element sizes. Thread safety: immutable.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "common/status.h"

namespace ckpt {

struct DTypeInfo {
  std::string_view name;         // "float32"
  uint32_t element_size;         // bytes
  std::string_view safetensors;  // "F32" — the safetensors spelling
};

// Every supported dtype, in a stable order.
std::span<const DTypeInfo> AllDTypes();

// Looks a dtype up by its PyTorch name; kInvalidArgument naming the bad name otherwise.
Result<DTypeInfo> LookupDType(std::string_view name);

// numel × element size; kInvalidArgument when it does not fit in 64 bits.
Result<uint64_t> ByteSize(uint64_t numel, const DTypeInfo& dtype);

}  // namespace ckpt
