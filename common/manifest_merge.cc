#include "common/manifest_merge.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "common/logging.h"
#include "common/manifest_io.h"
#include "common/names.h"

namespace ckpt {
namespace {

using Geometry = ckptd::v1::ShardGeometry;

auto ScalarFields(const Geometry& g) {
  return std::make_tuple(g.kind_case(), g.flat().flat_offset(), g.flat().numel());
}

bool SameGeometry(const Geometry& a, const Geometry& b) {
  return ScalarFields(a) == ScalarFields(b) &&
         std::ranges::equal(a.box().offsets(), b.box().offsets()) &&
         std::ranges::equal(a.box().lengths(), b.box().lengths());
}

bool GeometryLess(const Geometry& a, const Geometry& b) {
  if (ScalarFields(a) != ScalarFields(b)) return ScalarFields(a) < ScalarFields(b);
  if (!std::ranges::equal(a.box().offsets(), b.box().offsets())) {
    return std::ranges::lexicographical_compare(a.box().offsets(), b.box().offsets());
  }
  return std::ranges::lexicographical_compare(a.box().lengths(), b.box().lengths());
}

// Whether two of `shards` have the same geometry. With a writer plan in force no geometry
// repeats, and this is all the replica pass costs.
bool HasRepeatedGeometry(const google::protobuf::RepeatedPtrField<ckptd::v1::StoredShard>& shards) {
  std::vector<const Geometry*> sorted;
  sorted.reserve(shards.size());
  for (const auto& s : shards) sorted.push_back(&s.geometry());
  std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return GeometryLess(*a, *b); });
  return std::adjacent_find(sorted.begin(), sorted.end(),
                            [](auto* a, auto* b) { return SameGeometry(*a, *b); }) != sorted.end();
}

bool SameShape(const google::protobuf::RepeatedField<uint64_t>& a,
               const google::protobuf::RepeatedField<uint64_t>& b) {
  return std::ranges::equal(a, b);
}

}  // namespace

ManifestMerger::ManifestMerger(ckptd::v1::Manifest* out, Options options)
    : out_(out), options_(options) {
  out_->Clear();
}

void ManifestMerger::TrackKeys(const ckptd::v1::TensorEntry& t, std::span<const uint32_t> merged) {
  const std::span<const uint64_t> shape(t.global_shape().data(),
                                        static_cast<size_t>(t.global_shape_size()));
  std::string key;
  size_t prefix = 0;
  for (const auto& s : t.shards()) {
    if (std::binary_search(merged.begin(), merged.end(), s.writer_rank())) continue;
    if (key.empty()) {
      key = ReplicaKeyPrefix(t.name(), t.dtype(), shape);
      prefix = key.size();
    }
    key.resize(prefix);
    s.geometry().AppendToString(&key);
    written_keys_.insert(DigestReplicaKey(key));
  }
}

Status ManifestMerger::Add(const ckptd::v1::NodeManifest& n, std::span<const uint32_t> merged) {
  if (!failed_.ok()) return failed_;
  if (finished_) return failed_ = FailedPrecondition("the merge is finished");
  if (nodes_.empty()) {
    out_->set_format_version(kFormatVersion);
    out_->set_job(n.job());
    out_->set_step(n.step());
    out_->set_world_size(n.world_size());
  } else if (n.job() != out_->job() || n.step() != out_->step() ||
             n.world_size() != out_->world_size()) {
    return failed_ = InvalidArgument(
               "node manifest of node '" + n.node_id() + "' is for job '" + n.job() + "' step " +
               std::to_string(n.step()) + " world size " + std::to_string(n.world_size()) +
               ", expected job '" + out_->job() + "' step " + std::to_string(out_->step()) +
               " world size " + std::to_string(out_->world_size()));
  }
  const auto fresh = [&](uint32_t rank) {
    return !std::binary_search(merged.begin(), merged.end(), rank);
  };
  const auto from = static_cast<uint32_t>(nodes_.size());
  nodes_.push_back(n.node_id());
  for (const auto& t : n.tensors()) {
    if (options_.track_replica_keys) TrackKeys(t, merged);
    const bool whole = std::ranges::all_of(
        t.shards(), [&](const ckptd::v1::StoredShard& s) { return fresh(s.writer_rank()); });
    if (!whole && std::ranges::none_of(t.shards(), [&](const ckptd::v1::StoredShard& s) {
          return fresh(s.writer_rank());
        })) {
      continue;  // merged with the node's earlier report
    }
    auto it = index_.find(t.name());
    if (it == index_.end()) {
      ckptd::v1::TensorEntry* copy = out_->add_tensors();
      *copy = t;
      if (!whole) {
        copy->clear_shards();
        for (const auto& s : t.shards()) {
          if (fresh(s.writer_rank())) *copy->add_shards() = s;
        }
      }
      // Keyed by the copy's own name, which stays put while the repeated field grows (it holds
      // pointers to its entries).
      index_.emplace(copy->name(), Entry{copy, from});
      continue;
    }
    ckptd::v1::TensorEntry& have = *it->second.tensor;
    if (have.dtype() != t.dtype() || !SameShape(have.global_shape(), t.global_shape())) {
      return failed_ = InvalidArgument("tensor '" + EscapeForLog(t.name()) + "' has dtype " +
                                       have.dtype() + " on node '" + nodes_[it->second.from] +
                                       "' but " + t.dtype() + " on node '" + n.node_id() +
                                       "' (or a different global shape)");
    }
    for (const auto& s : t.shards()) {
      if (fresh(s.writer_rank())) *have.add_shards() = s;
    }
    if (t.partial()) have.set_partial(true);  // one rank's opt-in is the tensor's
  }
  for (const auto& r : n.ranks()) {
    if (!fresh(r.rank())) continue;
    if (!ranks_.insert(r.rank()).second) {
      return failed_ = InvalidArgument("rank " + std::to_string(r.rank()) +
                                       " is reported by two nodes (second: '" + n.node_id() + "')");
    }
    *out_->add_ranks() = r;
  }
  // A skipped shard some node already wrote stays written (shards are only ever added, and the
  // replica pass keeps one of each geometry): settle it now, keep the rest for Finish.
  for (const auto& k : n.skipped()) {
    if (fresh(k.rank()) && !Written(k)) pending_.push_back(Pending{k, from});
  }
  return Status::Ok();
}

bool ManifestMerger::Written(const ckptd::v1::SkippedShard& k) const {
  auto it = index_.find(k.name());
  if (it == index_.end()) return false;
  const ckptd::v1::TensorEntry& t = *it->second.tensor;
  if (t.dtype() != k.dtype() || !SameShape(t.global_shape(), k.global_shape())) return false;
  return std::ranges::any_of(t.shards(), [&](const ckptd::v1::StoredShard& s) {
    return SameGeometry(s.geometry(), k.geometry());
  });
}

Status ManifestMerger::Finish() {
  if (!failed_.ok()) return failed_;
  if (finished_) return failed_ = FailedPrecondition("the merge is finished");
  finished_ = true;
  if (nodes_.empty()) return failed_ = InvalidArgument("no node manifests to merge");
  for (const auto& p : pending_) {
    if (Written(p.shard)) continue;
    const auto& k = p.shard;
    return failed_ = FailedPrecondition(
               "tensor '" + EscapeForLog(k.name()) + "': rank " + std::to_string(k.rank()) +
               " (node '" + nodes_[p.from] +
               "') left a shard to another rank under the writer plan, and no rank wrote it (the "
               "plan changed while the step was in flight); the next step uses one plan");
  }
  pending_.clear();
  index_.clear();  // its keys point into the entries the sort below reorders
  // Tensors in name order, ranks in rank order; sorting the pointers moves no entry.
  auto* tensors = out_->mutable_tensors();
  std::sort(tensors->pointer_begin(), tensors->pointer_end(),
            [](const ckptd::v1::TensorEntry* a, const ckptd::v1::TensorEntry* b) {
              return a->name() < b->name();
            });
  auto* ranks = out_->mutable_ranks();
  std::sort(ranks->pointer_begin(), ranks->pointer_end(),
            [](const ckptd::v1::RankEntry* a, const ckptd::v1::RankEntry* b) {
              return a->rank() < b->rank();
            });
  if (Status st = KeepReplicasOnce(); !st.ok()) return failed_ = st;
  return Status::Ok();
}

Status ManifestMerger::KeepReplicasOnce() {
  for (auto& entry : *out_->mutable_tensors()) {
    auto& shards = *entry.mutable_shards();
    if (shards.size() < 2 || !HasRepeatedGeometry(shards)) continue;
    std::map<std::string, int> first;  // serialized geometry → index kept
    // On the manifest's arena, so that moving a shard in and swapping the lists copy nothing.
    google::protobuf::RepeatedPtrField<ckptd::v1::StoredShard> kept(out_->GetArena());
    for (auto& s : shards) {
      auto [it, inserted] = first.try_emplace(s.geometry().SerializeAsString(), kept.size());
      if (inserted) {
        *kept.Add() = std::move(s);
        continue;
      }
      const auto& have = kept[it->second];
      if (!std::ranges::equal(have.chunk_xxh3(), s.chunk_xxh3())) {
        size_t chunk = 0;
        while (chunk < static_cast<size_t>(std::min(have.chunk_xxh3_size(), s.chunk_xxh3_size())) &&
               have.chunk_xxh3(chunk) == s.chunk_xxh3(chunk)) {
          ++chunk;
        }
        return InvalidArgument(
            "tensor '" + EscapeForLog(entry.name()) + "': ranks " +
            std::to_string(std::min(have.writer_rank(), s.writer_rank())) + " and " +
            std::to_string(std::max(have.writer_rank(), s.writer_rank())) +
            " saved the same shard with different bytes (first differing chunk " +
            std::to_string(chunk) + " of " + std::to_string(have.chunk_xxh3_size()) +
            "); shards may overlap only as exact replicas");
      }
      if (s.writer_rank() < have.writer_rank()) kept[it->second] = std::move(s);
    }
    shards.Swap(&kept);
  }
  return Status::Ok();
}

namespace {

google::protobuf::ArenaOptions MergeArenaOptions() {
  google::protobuf::ArenaOptions options;
  options.start_block_size = 64 << 10;
  options.max_block_size = 4 << 20;
  return options;
}

}  // namespace

MergeOnArena::MergeOnArena(ManifestMerger::Options options)
    : arena_(MergeArenaOptions()),
      manifest_(google::protobuf::Arena::CreateMessage<ckptd::v1::Manifest>(&arena_)),
      merger_(manifest_, options) {}

Status MergeNodeManifestsInto(std::span<const ckptd::v1::NodeManifest> nodes,
                              ckptd::v1::Manifest* out) {
  ManifestMerger merger(out);
  for (const auto& n : nodes) RETURN_IF_ERROR(merger.Add(n));
  return merger.Finish();
}

Result<ckptd::v1::Manifest> MergeNodeManifests(std::span<const ckptd::v1::NodeManifest> nodes) {
  ckptd::v1::Manifest out;
  RETURN_IF_ERROR(MergeNodeManifestsInto(nodes, &out));
  return out;
}

}  // namespace ckpt
