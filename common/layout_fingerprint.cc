#include "common/layout_fingerprint.h"

#include <xxhash.h>

#include <cstdio>

namespace ckpt {

namespace {

void PutU64(std::string& out, uint64_t v) {
  for (int i = 7; i >= 0; --i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t GetU64(std::string_view in) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | static_cast<uint8_t>(in[i]);
  return v;
}

}  // namespace

std::string LayoutFingerprint::ToBytes() const {
  std::string out;
  out.reserve(16);
  PutU64(out, high);
  PutU64(out, low);
  return out;
}

bool LayoutFingerprint::FromBytes(std::string_view bytes, LayoutFingerprint* out) {
  if (bytes.size() != 16) return false;
  out->high = GetU64(bytes.substr(0, 8));
  out->low = GetU64(bytes.substr(8, 8));
  return true;
}

std::string LayoutFingerprint::ToHex() const {
  char buf[33];
  std::snprintf(buf, sizeof(buf), "%016llx%016llx", static_cast<unsigned long long>(high),
                static_cast<unsigned long long>(low));
  return buf;
}

std::string ReplicaKeyPrefix(std::string_view name, std::string_view dtype,
                             std::span<const uint64_t> global_shape) {
  std::string key(name);
  key += '\0';
  key += dtype;
  key += '\0';
  for (uint64_t d : global_shape) key += std::to_string(d) + ",";
  key += '\0';
  return key;
}

std::string ReplicaKey(std::string_view name, std::string_view dtype,
                       std::span<const uint64_t> global_shape,
                       const ckptd::v1::ShardGeometry& geometry) {
  std::string key = ReplicaKeyPrefix(name, dtype, global_shape);
  geometry.AppendToString(&key);
  return key;
}

LayoutFingerprint DigestReplicaKey(std::string_view key) {
  const XXH128_hash_t h = XXH3_128bits(key.data(), key.size());
  return LayoutFingerprint{h.high64, h.low64};
}

std::string ReplicaKey(const ckptd::v1::ShardKey& shard) {
  return ReplicaKey(shard.name(), shard.dtype(),
                    std::span<const uint64_t>(shard.global_shape().data(),
                                              static_cast<size_t>(shard.global_shape_size())),
                    shard.geometry());
}

LayoutFingerprint FingerprintLayout(
    const google::protobuf::RepeatedPtrField<ckptd::v1::ShardKey>& shards) {
  XXH3_state_t* state = XXH3_createState();
  XXH3_128bits_reset(state);
  std::string frame;
  for (const auto& s : shards) {
    const std::string key = ReplicaKey(s);
    frame.clear();
    PutU64(frame, key.size());
    XXH3_128bits_update(state, frame.data(), frame.size());
    XXH3_128bits_update(state, key.data(), key.size());
    frame.clear();
    PutU64(frame, s.bytes());
    XXH3_128bits_update(state, frame.data(), frame.size());
  }
  const XXH128_hash_t h = XXH3_128bits_digest(state);
  XXH3_freeState(state);
  // The empty fingerprint means "none" on the wire; a real digest of zero is remapped.
  LayoutFingerprint out{h.high64, h.low64};
  if (out.empty()) out.low = 1;
  return out;
}

}  // namespace ckpt
