#include "daemon/coordinator/holder_registry.h"

#include <algorithm>

#include <spdlog/spdlog.h>

namespace ckpt {

void HolderRegistry::MarkDue(Clock::time_point now) {
  if (!due_) due_ = now + delay_;
}

void HolderRegistry::Set(const std::string& node_id, Node node, Clock::time_point now) {
  auto [it, inserted] = nodes_.try_emplace(node_id, node);
  if (!inserted) {
    if (it->second == node) return;
    if (it->second.peer_address != node.peer_address) readdressed_.insert(node_id);
    it->second = std::move(node);
  }
  unplanned_.insert(node_id);
  MarkDue(now);
}

void HolderRegistry::Remove(const std::string& node_id, Clock::time_point now) {
  unplanned_.erase(node_id);
  if (nodes_.erase(node_id) != 0) {
    readdressed_.insert(node_id);  // back later, perhaps at another address
    MarkDue(now);
  }
}

std::optional<HolderRegistry::Replan> HolderRegistry::TakeDue(Clock::time_point now) {
  if (planning_ || !due_ || *due_ > now) return std::nullopt;
  due_.reset();
  planning_ = true;
  in_flight_ = std::move(unplanned_);
  unplanned_.clear();
  Replan r;
  r.nodes.reserve(nodes_.size());
  for (const auto& [id, n] : nodes_) {
    r.nodes.push_back(
        {id, n.failure_domain, !n.peer_address.empty() && n.pool_bytes > 0, n.replicas > 0});
    r.replicas = std::max(r.replicas, n.replicas);
  }
  r.previous = plan_;
  return r;
}

std::vector<std::string> HolderRegistry::Apply(HolderPlan plan) {
  planning_ = false;
  plan_ = std::make_shared<const HolderPlan>(std::move(plan));
  std::map<std::string, std::vector<std::string>> assigned;
  for (const auto& [id, holders] : plan_->holders) {
    auto self = nodes_.find(id);
    if (self == nodes_.end()) continue;  // gone while the plan was computed
    const uint32_t wants = self->second.replicas;
    std::vector<std::string> cut;
    for (const std::string& h : holders) {
      if (cut.size() == wants) break;
      if (nodes_.count(h) != 0) cut.push_back(h);  // else gone meanwhile: the next plan refills
    }
    if (holders.size() < wants) {
      spdlog::warn(
          "node '{}' asked for {} holder(s) of its steps in memory; only {} other "
          "node(s) can hold (a data plane and a --peer-pool)",
          id, wants, holders.size());
    }
    assigned.emplace(id, std::move(cut));
  }
  std::set<std::string> changed;
  for (const auto& [id, holders] : assigned) {
    auto before = assigned_.find(id);
    // A holder whose address changed (its daemon restarted on another port) is news too.
    const bool readdressed = std::any_of(holders.begin(), holders.end(),
                                         [&](const auto& h) { return readdressed_.count(h) != 0; });
    if (before == assigned_.end() || before->second != holders || readdressed) {
      changed.insert(id);
    }
  }
  for (const auto& [id, holders] : assigned_) {
    if (assigned.count(id) == 0 && !holders.empty()) changed.insert(id);
  }
  // Told `planning` before: told that the plan includes it now, even with the same holders.
  for (const std::string& id : in_flight_) {
    if (nodes_.count(id) != 0 && unplanned_.count(id) == 0) changed.insert(id);
  }
  in_flight_.clear();
  readdressed_.clear();
  assigned_ = std::move(assigned);
  if (!changed.empty()) ++version_;
  return {changed.begin(), changed.end()};
}

std::vector<std::string> HolderRegistry::ReplanIfDue(Clock::time_point now) {
  auto r = TakeDue(now);
  if (!r) return {};
  return Apply(PlanHolders(std::move(r->nodes), r->replicas, r->previous.get()));
}

std::vector<std::string> HolderRegistry::HoldersOf(const std::string& node_id) const {
  auto it = assigned_.find(node_id);
  return it == assigned_.end() ? std::vector<std::string>{} : it->second;
}

ckptd::v1::HolderAssignment HolderRegistry::AssignmentFor(const std::string& node_id) const {
  ckptd::v1::HolderAssignment a;
  a.set_version(version_);
  a.set_planning(unplanned_.count(node_id) != 0 || in_flight_.count(node_id) != 0);
  const auto& self = nodes_.find(node_id);
  for (const std::string& h : HoldersOf(node_id)) {
    auto n = nodes_.find(h);
    if (n == nodes_.end()) continue;
    auto* out = a.add_holders();
    out->set_node_id(h);
    out->set_peer_address(n->second.peer_address);
    if (self != nodes_.end() && !self->second.failure_domain.empty() &&
        n->second.failure_domain == self->second.failure_domain) {
      a.add_same_domain(h);
    }
  }
  return a;
}

}  // namespace ckpt
