// HolderRegistry: the coordinator's side of the peer-memory tier — which nodes can hold other
// nodes' captured steps in memory, which want holders, and the current HolderPlan
// (holder_plan.h) that answers who holds for whom.
//
// A node tells its data plane (`--peer-listen`), failure domain, budget for others' copies
// (`--peer-pool`) and `--replicas` when it registers (RegisterNodeRequest). Each change — a node
// registering, changing or lost — marks the plan due; the coordinator's timer replans at most
// once per `delay` (a cluster starting registers thousands of nodes in a burst: one plan, not
// one per node), keeping every holder that is still fit (PlanHolders' stability rule), and
// sends a HolderAssignment to each node whose holders changed. A node attaching gets its
// current assignment at once.
//
// A node's list is the plan's, cut to its own `--replicas` (the plan is computed for the
// largest K asked). Holders are only nodes with an address and a budget; a node with
// `--replicas 0` holds for others but replicates nothing.
//
// Thread safety: none; the coordinator calls it with its mutex held.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "ckptd/v1/coordinator.pb.h"
#include "daemon/coordinator/holder_plan.h"

namespace ckpt {

class HolderRegistry {
 public:
  using Clock = std::chrono::steady_clock;
  explicit HolderRegistry(std::chrono::milliseconds delay) : delay_(delay) {}

  struct Node {
    std::string peer_address;
    std::string failure_domain;
    uint64_t pool_bytes = 0;
    uint32_t replicas = 0;
    bool operator==(const Node&) const = default;
  };
  // A node registered (or registered again, possibly changed).
  void Set(const std::string& node_id, Node node, Clock::time_point now);
  // A node was lost: it neither holds nor replicates until it registers again.
  void Remove(const std::string& node_id, Clock::time_point now);

  // When the plan is due (a change waits `delay` for more), or nullopt.
  std::optional<Clock::time_point> due() const { return due_; }
  // Replans when due by `now`; returns the nodes whose assignment changed.
  std::vector<std::string> ReplanIfDue(Clock::time_point now);

  // What the node replicates to now (empty list: nothing); version() as of the last plan.
  ckptd::v1::HolderAssignment AssignmentFor(const std::string& node_id) const;
  // The nodes holding for `node_id` now (node ids), in pick order.
  std::vector<std::string> HoldersOf(const std::string& node_id) const;
  uint64_t version() const { return version_; }
  // The node's data plane as it registered it ("" when unknown or none).
  std::string AddressOf(const std::string& node_id) const {
    auto it = nodes_.find(node_id);
    return it == nodes_.end() ? std::string() : it->second.peer_address;
  }

 private:
  void MarkDue(Clock::time_point now);

  const std::chrono::milliseconds delay_;
  std::map<std::string, Node> nodes_;
  HolderPlan plan_;
  std::map<std::string, std::vector<std::string>> assigned_;  // node → holders, cut to its K
  std::set<std::string> readdressed_;  // since the last plan: lost, or a new peer address
  uint64_t version_ = 0;
  std::optional<Clock::time_point> due_;
};

}  // namespace ckpt
