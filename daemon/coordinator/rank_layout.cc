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
    layout->shards.push_back(LayoutShard{s.name(), ReplicaKey(s), s.bytes()});
  }
  for (const auto& s : layout->shards) {
    if (!names.insert(s.name).second) {
      return InvalidArgument(ctx + ": tensor '" + EscapeForLog(s.name) + "' is registered twice");
    }
  }
  return std::shared_ptr<const RankLayout>(std::move(layout));
}

}  // namespace ckpt
