#include "daemon/coordinator/writer_plan.h"

#include <algorithm>
#include <optional>

namespace ckpt {

namespace {

bool SameInputs(const std::vector<PlanRank>& a, const std::vector<PlanRank>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].rank != b[i].rank || a[i].layout != b[i].layout || a[i].node_id != b[i].node_id) {
      return false;
    }
  }
  return true;
}

// A candidate writer as one layout's heap saw it: its node's and its own bytes at the time.
struct Candidate {
  uint64_t node_load;
  uint32_t node;
  uint64_t rank_load;
  uint32_t index;  // into the sorted ranks, so lower index = lower rank
};

// Orders candidates best first: fewest node bytes, node name, fewest rank bytes, lowest rank.
bool Better(const Candidate& a, const Candidate& b) {
  if (a.node_load != b.node_load) return a.node_load < b.node_load;
  if (a.node != b.node) return a.node < b.node;
  if (a.rank_load != b.rank_load) return a.rank_load < b.rank_load;
  return a.index < b.index;
}

// std heaps keep the *largest* element first under the comparator given.
bool HeapOrder(const Candidate& a, const Candidate& b) { return Better(b, a); }

}  // namespace

ptrdiff_t WriterAssignment::IndexOf(uint32_t rank) const {
  auto it = std::lower_bound(inputs.begin(), inputs.end(), rank,
                             [](const PlanRank& r, uint32_t v) { return r.rank < v; });
  if (it == inputs.end() || it->rank != rank) return -1;
  return it - inputs.begin();
}

std::shared_ptr<const WriterAssignment> PlanWriters(
    std::vector<PlanRank> ranks, std::shared_ptr<const WriterAssignment> previous) {
  std::sort(ranks.begin(), ranks.end(),
            [](const PlanRank& a, const PlanRank& b) { return a.rank < b.rank; });
  if (previous != nullptr && SameInputs(previous->inputs, ranks)) return previous;

  auto out = std::make_shared<WriterAssignment>();
  out->inputs = std::move(ranks);
  const std::vector<PlanRank>& in = out->inputs;

  // Nodes, indexed in name order (ties between nodes go to the lower name).
  std::vector<std::string_view> nodes;
  nodes.reserve(in.size());
  for (const PlanRank& r : in) nodes.push_back(r.node_id);
  std::sort(nodes.begin(), nodes.end());
  nodes.erase(std::unique(nodes.begin(), nodes.end()), nodes.end());
  std::vector<uint32_t> node_of(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    node_of[i] = static_cast<uint32_t>(
        std::lower_bound(nodes.begin(), nodes.end(), std::string_view(in[i].node_id)) -
        nodes.begin());
  }

  // Ranks grouped by layout object, in order of their first rank.
  struct Group {
    const RankLayout* layout;
    std::vector<uint32_t> members;  // indexes into `in`, ascending
  };
  std::vector<Group> groups;
  std::unordered_map<const RankLayout*, uint32_t> group_index;
  std::vector<uint32_t> group_of(in.size());
  for (uint32_t i = 0; i < in.size(); ++i) {
    auto [it, fresh] =
        group_index.try_emplace(in[i].layout.get(), static_cast<uint32_t>(groups.size()));
    if (fresh) groups.push_back(Group{in[i].layout.get(), {}});
    groups[it->second].members.push_back(i);
    group_of[i] = it->second;
    out->registered_bytes += in[i].layout->bytes;
  }
  out->distinct_layouts = groups.size();

  // Distinct shards across the distinct layouts; each knows which layouts hold it.
  struct Distinct {
    std::string_view key;
    uint64_t bytes = 0;
    uint64_t holders = 0;                                // ranks
    std::vector<std::pair<uint32_t, uint32_t>> layouts;  // (group, shard index in its layout)
  };
  std::vector<Distinct> distinct;
  std::unordered_map<std::string_view, uint32_t> distinct_index;
  size_t total = 0;
  for (const Group& g : groups) total += g.layout->shards.size();
  distinct_index.reserve(total);
  for (uint32_t gi = 0; gi < groups.size(); ++gi) {
    const auto& shards = groups[gi].layout->shards;
    for (uint32_t si = 0; si < shards.size(); ++si) {
      auto [it, fresh] =
          distinct_index.try_emplace(shards[si].key, static_cast<uint32_t>(distinct.size()));
      if (fresh) distinct.push_back(Distinct{shards[si].key, shards[si].bytes, 0, {}});
      Distinct& d = distinct[it->second];
      d.holders += groups[gi].members.size();
      d.layouts.emplace_back(gi, si);
    }
  }
  out->distinct_shards = distinct.size();
  out->writer.reserve(distinct.size());
  out->writes.resize(in.size());
  std::vector<uint64_t> node_load(nodes.size(), 0);
  std::vector<uint64_t> rank_load(in.size(), 0);
  auto assign = [&](const Distinct& d, uint32_t index, uint32_t shard) {
    out->writes[index].push_back(shard);
    node_load[node_of[index]] += d.bytes;
    rank_load[index] += d.bytes;
    out->writer.emplace(d.key, in[index].rank);
  };

  std::vector<uint32_t> replicated;
  for (uint32_t di = 0; di < distinct.size(); ++di) {
    const Distinct& d = distinct[di];
    out->unique_bytes += d.bytes;
    if (d.holders == 1) {
      assign(d, groups[d.layouts[0].first].members[0], d.layouts[0].second);
    } else {
      replicated.push_back(di);
    }
  }
  // Largest first; equal sizes in a fixed order (first holding layout, then position in it)
  // so every run plans the same.
  std::sort(replicated.begin(), replicated.end(), [&](uint32_t a, uint32_t b) {
    const Distinct& da = distinct[a];
    const Distinct& db = distinct[b];
    if (da.bytes != db.bytes) return da.bytes > db.bytes;
    return da.layouts[0] < db.layouts[0];
  });

  // One lazy heap of candidates per layout. Loads only grow, so an entry whose recorded loads
  // are out of date ranks too high at worst: it is refreshed and sifted down until the top is
  // current, and a current top is the layout's best holder.
  std::vector<std::vector<Candidate>> heaps(groups.size());
  auto best_of = [&](uint32_t gi) -> Candidate {
    std::vector<Candidate>& h = heaps[gi];
    if (h.empty()) {
      for (uint32_t index : groups[gi].members) {
        h.push_back(Candidate{node_load[node_of[index]], node_of[index], rank_load[index], index});
      }
      std::make_heap(h.begin(), h.end(), HeapOrder);
    }
    while (true) {
      Candidate& top = h.front();
      if (top.node_load == node_load[top.node] && top.rank_load == rank_load[top.index]) {
        return top;
      }
      std::pop_heap(h.begin(), h.end(), HeapOrder);
      h.back().node_load = node_load[h.back().node];
      h.back().rank_load = rank_load[h.back().index];
      std::push_heap(h.begin(), h.end(), HeapOrder);
    }
  };

  for (uint32_t di : replicated) {
    const Distinct& d = distinct[di];
    // Stability: the previous writer keeps the shard while it still holds it.
    if (previous != nullptr) {
      if (auto was = previous->writer.find(d.key); was != previous->writer.end()) {
        const ptrdiff_t index = out->IndexOf(was->second);
        if (index >= 0) {
          const uint32_t gi = group_of[static_cast<size_t>(index)];
          auto held = std::find_if(d.layouts.begin(), d.layouts.end(),
                                   [&](const auto& l) { return l.first == gi; });
          if (held != d.layouts.end()) {
            assign(d, static_cast<uint32_t>(index), held->second);
            continue;
          }
        }
      }
    }
    std::optional<Candidate> best;
    uint32_t best_shard = 0;
    for (const auto& [gi, si] : d.layouts) {
      const Candidate c = best_of(gi);
      if (!best || Better(c, *best)) {
        best = c;
        best_shard = si;
      }
    }
    assign(d, best->index, best_shard);
  }

  for (auto& w : out->writes) std::sort(w.begin(), w.end());
  for (uint32_t n = 0; n < nodes.size(); ++n) out->node_bytes.emplace(nodes[n], node_load[n]);
  return out;
}

}  // namespace ckpt
