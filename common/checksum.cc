#include "common/checksum.h"

#include <xxhash.h>

namespace ckpt {

uint64_t Xxh3(const void* data, size_t size) { return XXH3_64bits(data, size); }

}  // namespace ckpt
