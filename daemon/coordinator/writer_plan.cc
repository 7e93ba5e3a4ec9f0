#include "daemon/coordinator/writer_plan.h"

#include <algorithm>
#include <functional>
#include <unordered_map>

namespace ckpt {

WriterAssignment PlanWriters(const std::vector<const RankRegistration*>& rank_ptrs,
                             const WriterAssignment* previous) {
  std::vector<std::reference_wrapper<const RankRegistration>> ranks;
  ranks.reserve(rank_ptrs.size());
  for (const RankRegistration* r : rank_ptrs) ranks.emplace_back(*r);
  struct Holder {
    uint32_t rank_index;
    uint32_t shard_index;
  };
  struct Group {
    uint64_t bytes = 0;
    std::vector<Holder> holders;
  };
  WriterAssignment out;
  std::unordered_map<std::string_view, Group> groups;
  size_t total = 0;
  for (const RankRegistration& r : ranks) total += r.shards.size();
  groups.reserve(total);
  for (uint32_t ri = 0; ri < ranks.size(); ++ri) {
    for (uint32_t si = 0; si < ranks[ri].get().shards.size(); ++si) {
      const PlannedShard& s = ranks[ri].get().shards[si];
      Group& g = groups[s.key];
      g.bytes = s.bytes;
      g.holders.push_back({ri, si});
      out.registered_bytes += s.bytes;
    }
  }
  std::map<std::string, uint64_t>& node_load = out.node_bytes;
  std::vector<uint64_t> rank_load(ranks.size(), 0);
  for (const RankRegistration& r : ranks) node_load.try_emplace(r.node_id, 0);
  std::vector<std::pair<std::string_view, const Group*>> replicated;
  out.writer.reserve(groups.size());
  for (const auto& [key, g] : groups) {
    out.unique_bytes += g.bytes;
    if (g.holders.size() == 1) {
      node_load[ranks[g.holders[0].rank_index].get().node_id] += g.bytes;
      rank_load[g.holders[0].rank_index] += g.bytes;
      out.writer.emplace(std::string(key), ranks[g.holders[0].rank_index].get().rank);
    } else {
      replicated.emplace_back(key, &g);
    }
  }
  // Largest first; equal sizes in a fixed order (first holder) so every run plans the same.
  std::sort(replicated.begin(), replicated.end(), [&](const auto& pa, const auto& pb) {
    const Group* a = pa.second;
    const Group* b = pb.second;
    if (a->bytes != b->bytes) return a->bytes > b->bytes;
    const Holder& ha = a->holders[0];
    const Holder& hb = b->holders[0];
    if (ha.rank_index != hb.rank_index) return ha.rank_index < hb.rank_index;
    return ha.shard_index < hb.shard_index;
  });
  for (const auto& [key, g] : replicated) {
    const Holder* best = nullptr;
    uint64_t best_node = 0;
    const std::string* best_name = nullptr;
    if (previous != nullptr) {  // stability: the previous writer keeps it if it still holds it
      if (auto was = previous->writer.find(std::string(key)); was != previous->writer.end()) {
        for (const Holder& h : g->holders) {
          if (ranks[h.rank_index].get().rank != was->second) continue;
          best = &h;
          best_name = &ranks[h.rank_index].get().node_id;
          break;
        }
      }
    }
    const bool kept = best != nullptr;
    for (const Holder& h : g->holders) {
      if (kept) break;
      const std::string& node = ranks[h.rank_index].get().node_id;
      const uint64_t load = node_load[node];
      const bool better = best == nullptr || load < best_node ||
                          (load == best_node && node < *best_name) ||
                          (load == best_node && node == *best_name &&
                           (rank_load[h.rank_index] < rank_load[best->rank_index] ||
                            (rank_load[h.rank_index] == rank_load[best->rank_index] &&
                             ranks[h.rank_index].get().rank < ranks[best->rank_index].get().rank)));
      if (better) {
        best = &h;
        best_node = load;
        best_name = &node;
      }
    }
    out.writer.emplace(std::string(key), ranks[best->rank_index].get().rank);
    node_load[*best_name] += g->bytes;
    rank_load[best->rank_index] += g->bytes;
    for (const Holder& h : g->holders) {
      if (&h == best) continue;
      const RankRegistration& holder = ranks[h.rank_index];
      out.skips[holder.rank].push_back(holder.shards[h.shard_index].name);
    }
  }
  return out;
}

}  // namespace ckpt
