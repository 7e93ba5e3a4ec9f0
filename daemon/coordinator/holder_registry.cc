#include "daemon/coordinator/holder_registry.h"

#include <algorithm>

#include <spdlog/spdlog.h>

namespace ckpt {

void HolderRegistry::MarkDue(Clock::time_point now) {
  if (!due_) due_ = now + delay_;
}

HolderRegistry::Nodes& HolderRegistry::MutableNodes() {
  // Only TakeDue's snapshots share the map, and they only read it: one still alive means a plan
  // is reading, so the change goes to a copy.
  if (nodes_.use_count() > 1) nodes_ = std::make_shared<Nodes>(*nodes_);
  return *nodes_;
}

void HolderRegistry::Set(const std::string& node_id, Node node, Clock::time_point now) {
  auto have = nodes_->find(node_id);
  if (have != nodes_->end()) {
    if (have->second == node) return;
    if (have->second.peer_address != node.peer_address) readdressed_.insert(node_id);
  }
  MutableNodes().insert_or_assign(node_id, std::move(node));
  unplanned_.insert(node_id);
  MarkDue(now);
}

void HolderRegistry::Remove(const std::string& node_id, Clock::time_point now) {
  unplanned_.erase(node_id);
  if (nodes_->count(node_id) == 0) return;
  MutableNodes().erase(node_id);
  if (planning_) left_in_flight_.insert(node_id);
  readdressed_.insert(node_id);  // back later, perhaps at another address
  MarkDue(now);
}

std::optional<HolderRegistry::Replan> HolderRegistry::TakeDue(Clock::time_point now) {
  if (planning_ || !due_ || *due_ > now) return std::nullopt;
  due_.reset();
  planning_ = true;
  in_flight_ = std::move(unplanned_);
  unplanned_.clear();
  Replan r{nodes_, plan_, assigned_, std::move(readdressed_)};
  readdressed_.clear();
  return r;
}

HolderRegistry::Planned HolderRegistry::Plan(const Replan& replan) {
  std::vector<HolderNode> input;
  input.reserve(replan.nodes->size());
  uint32_t k = 0;
  for (const auto& [id, n] : *replan.nodes) {
    input.push_back(
        {id, n.failure_domain, !n.peer_address.empty() && n.pool_bytes > 0, n.replicas > 0});
    k = std::max(k, n.replicas);
  }
  Planned out;
  out.plan = PlanHolders(std::move(input), k, replan.previous.get());
  for (const auto& [id, holders] : out.plan.holders) {
    const uint32_t wants = replan.nodes->at(id).replicas;
    std::vector<std::string> cut(holders.begin(),
                                 holders.begin() + std::min<size_t>(wants, holders.size()));
    if (cut.size() < wants) {
      spdlog::warn(
          "node '{}' asked for {} holder(s) of its steps in memory; only {} other "
          "node(s) can hold (a data plane and a --peer-pool)",
          id, wants, cut.size());
    }
    auto before = replan.assigned->find(id);
    // A holder whose address changed (its daemon restarted on another port) is news too.
    const bool readdressed = std::any_of(cut.begin(), cut.end(), [&](const std::string& h) {
      return replan.readdressed.count(h) != 0;
    });
    if (before == replan.assigned->end() || before->second != cut || readdressed) {
      out.changed.push_back(id);
    }
    out.assigned.emplace_hint(out.assigned.end(), id, std::move(cut));
  }
  for (const auto& [id, holders] : *replan.assigned) {
    if (out.assigned.count(id) == 0 && !holders.empty()) out.changed.push_back(id);
  }
  return out;
}

std::vector<std::string> HolderRegistry::Apply(Planned& planned) {
  planning_ = false;
  plan_ = std::make_shared<const HolderPlan>(std::move(planned.plan));
  std::vector<std::string> told = std::move(planned.changed);
  if (!left_in_flight_.empty()) {
    // Gone while the plan was computed: neither given holders nor holding (the next plan, due
    // already, places their copies again).
    for (const std::string& id : left_in_flight_) planned.assigned.erase(id);
    for (auto& [id, holders] : planned.assigned) {
      const auto dropped = std::erase_if(
          holders, [&](const std::string& h) { return left_in_flight_.count(h) != 0; });
      if (dropped != 0) {
        told.push_back(id);
        unplanned_.insert(id);  // told `planning`: the next plan, due already, refills it
      }
    }
    left_in_flight_.clear();
  }
  // Told `planning` before: told that the plan includes it now, even with the same holders.
  for (const std::string& id : in_flight_) {
    if (unplanned_.count(id) == 0) told.push_back(id);
  }
  in_flight_.clear();
  std::sort(told.begin(), told.end());
  told.erase(std::unique(told.begin(), told.end()), told.end());
  std::erase_if(told, [&](const std::string& id) { return nodes_->count(id) == 0; });
  // The assignments replaced go back to the caller, to be freed outside its lock.
  planned.replaced =
      std::exchange(assigned_, std::make_shared<const Assignments>(std::move(planned.assigned)));
  if (!told.empty()) ++version_;
  return told;
}

std::vector<std::string> HolderRegistry::ReplanIfDue(Clock::time_point now) {
  auto r = TakeDue(now);
  if (!r) return {};
  Planned planned = Plan(*r);
  return Apply(planned);
}

std::vector<std::string> HolderRegistry::HoldersOf(const std::string& node_id) const {
  auto it = assigned_->find(node_id);
  return it == assigned_->end() ? std::vector<std::string>{} : it->second;
}

ckptd::v1::HolderAssignment HolderRegistry::AssignmentFor(const std::string& node_id) const {
  ckptd::v1::HolderAssignment a;
  a.set_version(version_);
  a.set_planning(unplanned_.count(node_id) != 0 || in_flight_.count(node_id) != 0);
  const auto& self = nodes_->find(node_id);
  for (const std::string& h : HoldersOf(node_id)) {
    auto n = nodes_->find(h);
    if (n == nodes_->end()) continue;
    auto* out = a.add_holders();
    out->set_node_id(h);
    out->set_peer_address(n->second.peer_address);
    if (self != nodes_->end() && !self->second.failure_domain.empty() &&
        n->second.failure_domain == self->second.failure_domain) {
      a.add_same_domain(h);
    }
  }
  return a;
}

}  // namespace ckpt
