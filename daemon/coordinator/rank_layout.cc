#include "daemon/coordinator/rank_layout.h"

#include <unordered_set>

#include "common/names.h"

namespace ckpt {

Result<std::shared_ptr<const RankLayout>> MakeRankLayout(
    const google::protobuf::RepeatedPtrField<ckptd::v1::ShardKey>& shards,
    const LayoutFingerprint& claimed, const std::string& ctx) {
  constexpr int kMaxShards = 1 << 22;
  if (shards.size() > kMaxShards) {
    return InvalidArgument(ctx + ": " + std::to_string(shards.size()) +
                           " shards in one registration (at most " + std::to_string(kMaxShards) +
                           ")");
  }
  auto layout = std::make_shared<RankLayout>();
  layout->fingerprint = FingerprintLayout(shards);
  if (!claimed.empty() && claimed != layout->fingerprint) {
    return InvalidArgument(ctx + ": the layout's fingerprint is " + layout->fingerprint.ToHex() +
                           ", not the " + claimed.ToHex() + " it was sent under");
  }
  layout->shards.reserve(static_cast<size_t>(shards.size()));
  std::unordered_set<std::string_view> names;
  names.reserve(static_cast<size_t>(shards.size()));
  for (const auto& s : shards) {
    RETURN_IF_ERROR(ValidateTensorName(s.name()), ctx);
    layout->wire_bytes += s.ByteSizeLong();
    layout->bytes += s.bytes();
    std::string key = ReplicaKey(s);
    const LayoutFingerprint digest = DigestReplicaKey(key);
    layout->shards.push_back(LayoutShard{s.name(), std::move(key), s.bytes(), digest});
  }
  for (const auto& s : layout->shards) {
    if (!names.insert(s.name).second) {
      return InvalidArgument(ctx + ": tensor '" + EscapeForLog(s.name) + "' is registered twice");
    }
  }
  return std::shared_ptr<const RankLayout>(std::move(layout));
}

Status CheckSkippedLayoutsWritten(const ManifestMerger& merged,
                                  std::span<const SkippedLayout> skipped) {
  for (const SkippedLayout& k : skipped) {
    for (const LayoutShard& shard : k.layout->shards) {
      if (merged.Wrote(shard.key_digest)) continue;
      return FailedPrecondition(
          "tensor '" + EscapeForLog(shard.name) + "': a rank of the layout of rank " +
          std::to_string(k.rank) +
          " left a shard to another rank under the writer plan, and no rank wrote it (the plan "
          "changed while the step was in flight); the next step uses one plan");
    }
  }
  return Status::Ok();
}

}  // namespace ckpt
