// Checksums of stored bytes: XXH3-64 (seed 0) from libxxhash. Not nearly free: over bytes no
// longer in cache it runs at about memcpy's speed (both bound by memory bandwidth, ~20 GB/s each
// on the CI machines), so hashing a slot costs as much CPU as capturing it. The flush threads
// therefore hash each slot after writing it, off the path wait_snapshot waits for: bench_daemon
// then measured capture at 0.80-0.82 of memcpy, against 0.54-0.63 hashing first
// (daemon/flush_engine.h).
#pragma once

#include <cstddef>
#include <cstdint>

namespace ckpt {

uint64_t Xxh3(const void* data, size_t size);

}  // namespace ckpt
