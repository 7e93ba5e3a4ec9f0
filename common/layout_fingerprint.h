// A rank's registered layout, reduced to what the coordinator plans with, and its fingerprint.
//
// A layout is the ordered list of a rank's shards: name, dtype, global shape, geometry and
// bytes (ckptd.v1.ShardKey). Two shards are replicas of each other iff their replica keys are
// equal (same name, dtype, global shape and geometry). The fingerprint is the XXH3-128 of
// every shard's replica key and size, each length-prefixed, in order: two ranks with equal
// fingerprints hold the same shards, so the coordinator keeps one copy of a layout however
// many ranks register it, and a daemon sends a layout only when the coordinator does not know
// its fingerprint yet (proto/README.md, "Registration by fingerprint").
//
// The coordinator recomputes the fingerprint of every layout it receives and refuses one that
// does not match, so a daemon cannot plant a layout under another's fingerprint. A collision of
// two distinct layouts (probability about 2^-128 per pair) would give a plan in which a shard
// might be written by nobody; the commit's coverage check (manifest_io.h) refuses such a step,
// it never commits a hole.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>

#include "ckptd/v1/coordinator.pb.h"

namespace ckpt {

struct LayoutFingerprint {
  uint64_t high = 0;
  uint64_t low = 0;
  bool operator==(const LayoutFingerprint&) const = default;
  auto operator<=>(const LayoutFingerprint&) const = default;
  bool empty() const { return high == 0 && low == 0; }
  // 16 bytes, big-endian: the wire form (ReportRegistrationRequest.layout_fingerprint).
  std::string ToBytes() const;
  // False when `bytes` is not 16 bytes long.
  static bool FromBytes(std::string_view bytes, LayoutFingerprint* out);
  std::string ToHex() const;  // for logs
};

struct LayoutFingerprintHash {
  size_t operator()(const LayoutFingerprint& f) const { return static_cast<size_t>(f.low); }
};

// Equal for two shards iff they are replicas of each other.
std::string ReplicaKey(const ckptd::v1::ShardKey& shard);
// The same key from its parts: a stored shard's (a manifest's tensor entry and the shard's
// geometry) equals the ShardKey's of the registered shard it holds.
std::string ReplicaKey(std::string_view name, std::string_view dtype,
                       std::span<const uint64_t> global_shape,
                       const ckptd::v1::ShardGeometry& geometry);
// The part of the key before the geometry, which every shard of one tensor shares: the key is
// this followed by the serialized geometry.
std::string ReplicaKeyPrefix(std::string_view name, std::string_view dtype,
                             std::span<const uint64_t> global_shape);

// XXH3-128 of a replica key: what a commit compares the shards ranks skipped with the shards
// stored (rank_layout.h, CheckSkippedLayoutsWritten), 16 bytes a shard instead of the key.
LayoutFingerprint DigestReplicaKey(std::string_view key);

// The fingerprint of `shards`, in order.
LayoutFingerprint FingerprintLayout(
    const google::protobuf::RepeatedPtrField<ckptd::v1::ShardKey>& shards);

}  // namespace ckpt
