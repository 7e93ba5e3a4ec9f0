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
// current assignment at once. A node not in the plan in force yet (new, back, or changed) is
// told so (HolderAssignment.planning), and told again once a plan includes it, whether or not
// its holders changed: it holds back replication in between instead of reporting its steps
// not replicated for want of holders it is about to get.
//
// A node's list is the plan's, cut to its own `--replicas` (the plan is computed for the
// largest K asked). Holders are only nodes with an address and a budget; a node with
// `--replicas 0` holds for others but replicates nothing.
//
// Planning is split so that the work runs outside the coordinator's mutex (~40 ms at 12,500
// nodes, bench/coordinator/bench_holders.cc; reports would wait that long): TakeDue hands out
// the input in O(1) (shared, immutable snapshots), one plan at a time; Plan computes the plan,
// each node's list and which lists changed; Apply puts the result in force. Nodes that changed
// meanwhile have made the next plan due already, so Apply uses the result as it is, leaving
// out the nodes gone since; dropping it instead would starve the plan under steady churn.
//
// Thread safety: none; the coordinator calls it with its mutex held (PlanHolders runs between
// TakeDue and Apply without it).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
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

  // When the plan is due (a change waits `delay` for more), or nullopt: none due, or one in
  // flight (the next is due once it is applied).
  std::optional<Clock::time_point> due() const { return planning_ ? std::nullopt : due_; }

  using Nodes = std::map<std::string, Node>;
  using Assignments = std::map<std::string, std::vector<std::string>>;  // node → its holders
  // A plan's input, taken in O(1): the nodes now and the plan and assignments in force, shared
  // and immutable (a change while the plan is in flight copies the nodes first).
  struct Replan {
    std::shared_ptr<const Nodes> nodes;
    std::shared_ptr<const HolderPlan> previous;
    std::shared_ptr<const Assignments> assigned;
    std::set<std::string> readdressed;  // holders whose nodes must hear them again
  };
  // What Plan computed; after Apply it holds what Apply replaced, to be freed off the lock.
  struct Planned {
    HolderPlan plan;
    Assignments assigned;
    std::vector<std::string> changed;  // nodes whose list differs from the one in force
    std::shared_ptr<const Assignments> replaced;
  };

  // The input when a plan is due by `now` and none is in flight; the plan is then in flight
  // until Apply.
  std::optional<Replan> TakeDue(Clock::time_point now);
  // The plan (PlanHolders) and each node's list cut to its --replicas, compared with the lists
  // in force: the expensive part, which needs no lock (a pure function of `replan`).
  static Planned Plan(const Replan& replan);
  // Puts a plan made from TakeDue's input in force, leaving out the nodes that left since;
  // returns the nodes to tell their assignment. O(nodes told) when no node left meanwhile.
  std::vector<std::string> Apply(Planned& planned);
  // TakeDue, Plan and Apply in one (with the caller's lock held throughout).
  std::vector<std::string> ReplanIfDue(Clock::time_point now);

  // What the node replicates to now (empty list: nothing); version() as of the last plan.
  ckptd::v1::HolderAssignment AssignmentFor(const std::string& node_id) const;
  // The nodes holding for `node_id` now (node ids), in pick order.
  std::vector<std::string> HoldersOf(const std::string& node_id) const;
  uint64_t version() const { return version_; }
  // The node's data plane as it registered it ("" when unknown or none).
  std::string AddressOf(const std::string& node_id) const {
    auto it = nodes_->find(node_id);
    return it == nodes_->end() ? std::string() : it->second.peer_address;
  }

 private:
  void MarkDue(Clock::time_point now);
  // The nodes to change: a copy first when a plan in flight still reads them.
  Nodes& MutableNodes();

  const std::chrono::milliseconds delay_;
  std::shared_ptr<Nodes> nodes_ = std::make_shared<Nodes>();
  std::shared_ptr<const HolderPlan> plan_ = std::make_shared<HolderPlan>();
  std::shared_ptr<const Assignments> assigned_ = std::make_shared<Assignments>();
  bool planning_ = false;              // between TakeDue and Apply
  std::set<std::string> readdressed_;  // since the last plan: lost, or a new peer address
  // Nodes registered (new or changed) since the plan in flight, or the one in force, took its
  // input; those the plan in flight includes; and those lost while it was in flight.
  std::set<std::string> unplanned_;
  std::set<std::string> in_flight_;
  std::set<std::string> left_in_flight_;
  uint64_t version_ = 0;
  std::optional<Clock::time_point> due_;
};

}  // namespace ckpt
