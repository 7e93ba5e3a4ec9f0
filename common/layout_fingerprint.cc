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

std::string ReplicaKey(const ckptd::v1::ShardKey& shard) {
  std::string key(shard.name());
  key += '\0';
  key += shard.dtype();
  key += '\0';
  for (uint64_t d : shard.global_shape()) key += std::to_string(d) + ",";
  key += '\0';
  key += shard.geometry().SerializeAsString();
  return key;
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
