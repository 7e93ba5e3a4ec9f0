// Checksums of stored bytes: XXH3-64 (seed 0) from libxxhash, ~20 GB/s per core, so computing
// it while bytes pass through the pool costs a few percent of a memcpy.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ckpt {

uint64_t Xxh3(const void* data, size_t size);

}  // namespace ckpt
