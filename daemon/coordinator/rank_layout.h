// RankLayout: one registered layout as the coordinator keeps it — one object per distinct
// fingerprint (common/layout_fingerprint.h), shared by every rank that registered it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/layout_fingerprint.h"
#include "common/status.h"

namespace ckpt {

struct LayoutShard {
  std::string name;  // tensor name (unique within one layout)
  std::string key;   // replica key (ReplicaKey): equal iff replicas
  uint64_t bytes = 0;
};

struct RankLayout {
  LayoutFingerprint fingerprint;
  std::vector<LayoutShard> shards;
  uint64_t bytes = 0;     // sum of the shards' bytes
  size_t wire_bytes = 0;  // serialized size of the shards as received
};

// The layout of `shards`, checked against `claimed` when it is not empty. Errors name `ctx`.
Result<std::shared_ptr<const RankLayout>> MakeRankLayout(
    const google::protobuf::RepeatedPtrField<ckptd::v1::ShardKey>& shards,
    const LayoutFingerprint& claimed, const std::string& ctx);

}  // namespace ckpt
