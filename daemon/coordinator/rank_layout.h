// RankLayout: one registered layout as the coordinator keeps it — one object per distinct
// fingerprint (common/layout_fingerprint.h), shared by every rank that registered it.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/layout_fingerprint.h"
#include "common/manifest_merge.h"
#include "common/status.h"

namespace ckpt {

struct LayoutShard {
  std::string name;  // tensor name (unique within one layout)
  std::string key;   // replica key (ReplicaKey): equal iff replicas
  uint64_t bytes = 0;
  LayoutFingerprint key_digest;  // DigestReplicaKey(key)
};

struct RankLayout {
  LayoutFingerprint fingerprint;
  std::vector<LayoutShard> shards;
  uint64_t bytes = 0;     // sum of the shards' bytes
  size_t wire_bytes = 0;  // serialized size of the shards as received
};

// A layout whose shards a rank left to other ranks under the writer plan
// (NodeManifest.skipped_under), kept once per distinct layout for a step's commit.
struct SkippedLayout {
  std::shared_ptr<const RankLayout> layout;
  uint32_t rank = 0;  // a rank that skipped under it, for errors
};

// Every shard of every layout in `skipped` is stored in `merged` (same name, dtype, global shape
// and geometry). A rank writes all of its layout but what the plan left to others, so this holds
// iff every shard it skipped was written by some rank: a plan that changed while the step was in
// flight can fail the step (FAILED_PRECONDITION naming the tensor and the rank), never commit a
// hole. O(distinct layouts × their shards) lookups of 16-byte digests: what is distinct, not
// ranks × tensors.
// `merged` tracks replica keys (ManifestMerger::Options::track_replica_keys).
Status CheckSkippedLayoutsWritten(const ManifestMerger& merged,
                                  std::span<const SkippedLayout> skipped);

// The layout of `shards`, checked against `claimed` when it is not empty. Errors name `ctx`.
Result<std::shared_ptr<const RankLayout>> MakeRankLayout(
    const google::protobuf::RepeatedPtrField<ckptd::v1::ShardKey>& shards,
    const LayoutFingerprint& claimed, const std::string& ctx);

}  // namespace ckpt
