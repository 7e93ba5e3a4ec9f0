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
  MarkDue(now);
}

void HolderRegistry::Remove(const std::string& node_id, Clock::time_point now) {
  if (nodes_.erase(node_id) != 0) {
    readdressed_.insert(node_id);  // back later, perhaps at another address
    MarkDue(now);
  }
}

std::vector<std::string> HolderRegistry::ReplanIfDue(Clock::time_point now) {
  if (!due_ || *due_ > now) return {};
  due_.reset();
  std::vector<HolderNode> input;
  input.reserve(nodes_.size());
  uint32_t k = 0;
  for (const auto& [id, n] : nodes_) {
    input.push_back(
        {id, n.failure_domain, !n.peer_address.empty() && n.pool_bytes > 0, n.replicas > 0});
    k = std::max(k, n.replicas);
  }
  plan_ = PlanHolders(std::move(input), k, &plan_);
  std::map<std::string, std::vector<std::string>> assigned;
  for (const auto& [id, holders] : plan_.holders) {
    const uint32_t wants = nodes_.at(id).replicas;
    std::vector<std::string> cut(holders.begin(),
                                 holders.begin() + std::min<size_t>(wants, holders.size()));
    if (cut.size() < wants) {
      spdlog::warn(
          "node '{}' asked for {} holder(s) of its steps in memory; only {} other "
          "node(s) can hold (a data plane and a --peer-pool)",
          id, wants, cut.size());
    }
    assigned.emplace(id, std::move(cut));
  }
  std::vector<std::string> changed;
  for (const auto& [id, holders] : assigned) {
    auto before = assigned_.find(id);
    // A holder whose address changed (its daemon restarted on another port) is news too.
    const bool readdressed = std::any_of(holders.begin(), holders.end(),
                                         [&](const auto& h) { return readdressed_.count(h) != 0; });
    if (before == assigned_.end() || before->second != holders || readdressed) {
      changed.push_back(id);
    }
  }
  for (const auto& [id, holders] : assigned_) {
    if (assigned.count(id) == 0 && !holders.empty()) changed.push_back(id);
  }
  readdressed_.clear();
  assigned_ = std::move(assigned);
  if (!changed.empty()) ++version_;
  return changed;
}

std::vector<std::string> HolderRegistry::HoldersOf(const std::string& node_id) const {
  auto it = assigned_.find(node_id);
  return it == assigned_.end() ? std::vector<std::string>{} : it->second;
}

ckptd::v1::HolderAssignment HolderRegistry::AssignmentFor(const std::string& node_id) const {
  ckptd::v1::HolderAssignment a;
  a.set_version(version_);
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
