#include "daemon/coordinator/holder_plan.h"

#include <algorithm>
#include <set>
#include <unordered_map>
#include <utility>

namespace ckpt {
namespace {

// A node without a label is a domain of its own; '\0' keeps such keys apart from labels.
std::string DomainKey(const HolderNode& n) {
  return n.failure_domain.empty() ? std::string(1, '\0') + n.node_id : n.failure_domain;
}

// Keeping previous holders can leave the loads uneven: nodes that registered one by one (the
// first two hold for each other, and the third must pile onto one of them). While the most
// loaded holder holds for two or more nodes more than the least loaded one, one of its copies
// moves to a less loaded candidate that is acceptable for that node (not the node itself, not
// one of its holders already, and outside its domain if the copy was). Each move narrows the
// spread, and a copy moves only to narrow it; when no acceptable move is left, the plan stays.
void Rebalance(std::vector<std::vector<uint32_t>>& chosen, std::vector<uint32_t>& load,
               std::set<std::pair<uint32_t, uint32_t>>& by_load,
               const std::vector<std::string>& domain) {
  std::vector<std::vector<uint32_t>> held_by(chosen.size());  // holder → the nodes it holds for
  for (uint32_t node = 0; node < chosen.size(); ++node) {
    for (uint32_t h : chosen[node]) held_by[h].push_back(node);
  }
  auto move = [&](uint32_t node, uint32_t from, uint32_t to) {
    *std::find(chosen[node].begin(), chosen[node].end(), from) = to;
    std::erase(held_by[from], node);
    held_by[to].push_back(node);
    by_load.erase({load[from], from});
    by_load.emplace(--load[from], from);
    by_load.erase({load[to], to});
    by_load.emplace(++load[to], to);
  };
  // One acceptable move from the most loaded holders to the least loaded; false: none is left.
  auto move_one = [&]() {
    const uint32_t least = by_load.begin()->first;
    for (auto hi = by_load.rbegin(); hi != by_load.rend() && hi->first > least + 1; ++hi) {
      const uint32_t from = hi->second;
      for (auto lo = by_load.begin(); lo != by_load.end() && lo->first + 1 < hi->first; ++lo) {
        const uint32_t to = lo->second;
        for (uint32_t node : held_by[from]) {
          const auto& has = chosen[node];
          if (to == node || std::find(has.begin(), has.end(), to) != has.end()) continue;
          if (domain[from] != domain[node] && domain[to] == domain[node]) continue;
          move(node, from, to);
          return true;
        }
      }
    }
    return false;
  };
  while (!by_load.empty() && move_one()) {
  }
}

}  // namespace

HolderPlan PlanHolders(std::vector<HolderNode> nodes, uint32_t replicas,
                       const HolderPlan* previous) {
  std::sort(nodes.begin(), nodes.end(), [](const HolderNode& a, const HolderNode& b) {
    return std::pair(DomainKey(a), a.node_id) < std::pair(DomainKey(b), b.node_id);
  });
  {
    std::set<std::string> seen;
    std::erase_if(nodes, [&](const HolderNode& n) { return !seen.insert(n.node_id).second; });
  }
  const auto count = static_cast<uint32_t>(nodes.size());
  std::vector<std::string> domain(count);
  std::unordered_map<std::string, uint32_t> index;
  for (uint32_t i = 0; i < count; ++i) {
    domain[i] = DomainKey(nodes[i]);
    index.emplace(nodes[i].node_id, i);
  }
  HolderPlan plan;
  std::vector<std::vector<uint32_t>> chosen(count);
  std::vector<uint32_t> load(count, 0);
  // Candidates by (load, position): the least loaded first.
  std::set<std::pair<uint32_t, uint32_t>> by_load;
  for (uint32_t i = 0; i < count; ++i) {
    if (nodes[i].can_hold) by_load.emplace(0, i);
  }
  auto add = [&](uint32_t node, uint32_t holder) {
    chosen[node].push_back(holder);
    by_load.erase({load[holder], holder});
    by_load.emplace(++load[holder], holder);
  };
  auto taken = [&](uint32_t node, uint32_t holder) {
    return holder == node ||
           std::find(chosen[node].begin(), chosen[node].end(), holder) != chosen[node].end();
  };

  // Previous holders that are still candidates stay, up to the balanced load (K each).
  if (previous != nullptr) {
    for (uint32_t i = 0; i < count; ++i) {
      auto it = previous->holders.find(nodes[i].node_id);
      if (it == previous->holders.end() || !nodes[i].wants_holders) continue;
      for (const std::string& id : it->second) {
        auto h = index.find(id);
        if (h == index.end() || chosen[i].size() >= replicas) continue;
        const uint32_t holder = h->second;
        if (!nodes[holder].can_hold || taken(i, holder) || domain[holder] == domain[i] ||
            load[holder] >= replicas) {
          continue;
        }
        add(i, holder);
      }
    }
  }

  // The least-loaded acceptable candidate, ties to the first after `node` in the ring order.
  auto pick = [&](uint32_t node, bool other_domain) -> int64_t {
    for (auto level = by_load.begin(); level != by_load.end();) {
      const uint32_t l = level->first;
      const auto level_end = by_load.lower_bound({l + 1, 0});
      const auto start = by_load.lower_bound({l, node + 1});
      auto ok = [&](uint32_t c) {
        return !taken(node, c) && (domain[c] != domain[node]) == other_domain;
      };
      for (auto it = start; it != level_end; ++it) {
        if (ok(it->second)) return it->second;
      }
      for (auto it = level; it != start; ++it) {
        if (ok(it->second)) return it->second;
      }
      level = level_end;
    }
    return -1;
  };
  for (uint32_t i = 0; i < count; ++i) {
    while (nodes[i].wants_holders && chosen[i].size() < replicas) {
      int64_t holder = pick(i, /*other_domain=*/true);
      if (holder < 0) holder = pick(i, /*other_domain=*/false);
      if (holder < 0) break;
      add(i, static_cast<uint32_t>(holder));
    }
  }

  Rebalance(chosen, load, by_load, domain);

  for (uint32_t i = 0; i < count; ++i) {
    if (!nodes[i].wants_holders) {
      plan.held_for[nodes[i].node_id] = load[i];
      continue;
    }
    auto& out = plan.holders[nodes[i].node_id];
    for (uint32_t h : chosen[i]) {
      out.push_back(nodes[h].node_id);
      if (domain[h] == domain[i]) plan.same_domain.emplace_back(nodes[i].node_id, nodes[h].node_id);
    }
    if (chosen[i].size() < replicas) plan.short_of.push_back(nodes[i].node_id);
    plan.held_for[nodes[i].node_id] = load[i];
  }
  return plan;
}

}  // namespace ckpt
