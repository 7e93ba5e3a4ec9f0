// PlanHolders (daemon/coordinator/holder_plan.h): each node gets K holders, never itself, outside
// its failure domain where possible, with the load balanced; the plan is deterministic, a node
// leaving moves only the copies it held, and nodes joining one by one still end balanced.
#include "daemon/coordinator/holder_plan.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <random>
#include <set>

namespace ckpt {
namespace {

std::vector<HolderNode> Nodes(uint32_t count, uint32_t domains) {
  std::vector<HolderNode> out;
  for (uint32_t i = 0; i < count; ++i) {
    out.push_back(
        {"n" + std::to_string(i), domains == 0 ? "" : "rack" + std::to_string(i % domains)});
  }
  return out;
}

std::string DomainOf(const std::vector<HolderNode>& nodes, const std::string& id) {
  for (const auto& n : nodes) {
    if (n.node_id == id) return n.failure_domain.empty() ? "self:" + id : n.failure_domain;
  }
  return "?";
}

// Every node has `k` distinct holders other than itself, outside its domain; loads are within 1.
void CheckSpread(const std::vector<HolderNode>& nodes, const HolderPlan& plan, uint32_t k) {
  REQUIRE(plan.holders.size() == nodes.size());
  CHECK(plan.short_of.empty());
  CHECK(plan.same_domain.empty());
  for (const auto& [node, holders] : plan.holders) {
    INFO(node);
    CHECK(holders.size() == k);
    CHECK(std::set<std::string>(holders.begin(), holders.end()).size() == holders.size());
    for (const auto& h : holders) {
      CHECK(h != node);
      CHECK(DomainOf(nodes, h) != DomainOf(nodes, node));
    }
  }
  uint32_t lo = UINT32_MAX, hi = 0, sum = 0;
  for (const auto& [node, n] : plan.held_for) {
    lo = std::min(lo, n);
    hi = std::max(hi, n);
    sum += n;
  }
  CHECK(sum == k * nodes.size());
  CHECK(hi - lo <= 1);
}

TEST_CASE("PlanHolders: K holders per node, outside its domain, balanced", "[holder_plan]") {
  SECTION("4 racks of 2, K = 2") { CheckSpread(Nodes(8, 4), PlanHolders(Nodes(8, 4), 2), 2); }
  SECTION("unlabelled nodes are each a domain of their own") {
    CheckSpread(Nodes(5, 0), PlanHolders(Nodes(5, 0), 1), 1);
  }
  SECTION("1,000 nodes in 10 racks, K = 2") {
    CheckSpread(Nodes(1000, 10), PlanHolders(Nodes(1000, 10), 2), 2);
  }
  SECTION("K = 0 holds nothing") {
    auto plan = PlanHolders(Nodes(4, 2), 0);
    for (const auto& [node, holders] : plan.holders) CHECK(holders.empty());
    CHECK(plan.short_of.empty());
  }
}

TEST_CASE("PlanHolders: the same plan whatever the input order", "[holder_plan]") {
  auto nodes = Nodes(40, 4);
  const HolderPlan first = PlanHolders(nodes, 2);
  std::mt19937 rng(7);
  for (int i = 0; i < 5; ++i) {
    std::shuffle(nodes.begin(), nodes.end(), rng);
    CHECK(PlanHolders(nodes, 2).holders == first.holders);
  }
}

TEST_CASE("PlanHolders: within the domain only when no other domain has room, and says so",
          "[holder_plan]") {
  SECTION("one rack: holders in it, each listed as same-domain") {
    auto plan = PlanHolders(Nodes(3, 1), 2);
    CHECK(plan.short_of.empty());
    CHECK(plan.same_domain.size() == 6);
    for (const auto& [node, holders] : plan.holders) CHECK(holders.size() == 2);
  }
  SECTION("two racks, K = 2: one holder outside, one inside") {
    std::vector<HolderNode> nodes = {{"a", "r0"}, {"b", "r0"}, {"c", "r1"}};
    auto plan = PlanHolders(nodes, 2);
    CHECK(plan.holders["c"] == std::vector<std::string>{"a", "b"});  // both outside r1
    REQUIRE(plan.holders["a"].size() == 2);
    CHECK(plan.holders["a"][0] == "c");  // outside first
    CHECK(plan.holders["a"][1] == "b");
  }
  SECTION("too few nodes: short, never itself") {
    auto plan = PlanHolders(Nodes(2, 2), 2);
    CHECK(plan.short_of == std::vector<std::string>{"n0", "n1"});
    CHECK(plan.holders["n0"] == std::vector<std::string>{"n1"});
    CHECK(plan.holders["n1"] == std::vector<std::string>{"n0"});
  }
  SECTION("duplicate node ids count once") {
    auto nodes = Nodes(3, 3);
    nodes.push_back(nodes[0]);
    auto plan = PlanHolders(nodes, 1);
    CHECK(plan.holders.size() == 3);
  }
}

TEST_CASE("PlanHolders: a node leaving moves only the copies it held", "[holder_plan]") {
  auto nodes = Nodes(12, 4);
  const HolderPlan before = PlanHolders(nodes, 2);
  const std::string gone = "n5";
  std::erase_if(nodes, [&](const HolderNode& n) { return n.node_id == gone; });
  const HolderPlan after = PlanHolders(nodes, 2, &before);
  CheckSpread(nodes, after, 2);
  size_t moved = 0;
  for (const auto& [node, holders] : after.holders) {
    const auto& was = before.holders.at(node);
    for (const auto& h : was) {
      if (h == gone) continue;
      // Every surviving previous holder is kept.
      CHECK(std::find(holders.begin(), holders.end(), h) != holders.end());
    }
    for (const auto& h : holders) {
      if (std::find(was.begin(), was.end(), h) == was.end()) ++moved;
    }
  }
  CHECK(moved == before.held_for.at(gone));  // one new copy for each node `gone` held for
}

TEST_CASE("PlanHolders: nodes joining one by one end balanced, moving few copies",
          "[holder_plan]") {
  // Each plan from the previous one, as the coordinator makes them while daemons register.
  for (uint32_t k : {1u, 2u}) {
    for (uint32_t domains : {0u, 2u}) {
      INFO("K " << k << ", " << domains << " domains");
      const auto all = Nodes(9, domains);
      std::vector<HolderNode> nodes;
      HolderPlan plan;
      for (const auto& joining : all) {
        nodes.push_back(joining);
        const HolderPlan before = plan;
        plan = PlanHolders(nodes, k, &before);
        INFO(nodes.size() << " nodes");
        // With fewer than K + 1 nodes (or domains too small) not everyone can have K holders,
        // and with unequal domains the loads cannot all be within 1; the plan is then as even
        // as one made from scratch.
        const size_t per_domain = domains == 0 ? 1 : (nodes.size() + domains - 1) / domains;
        const bool equal_domains = domains == 0 || nodes.size() % domains == 0;
        if (equal_domains && nodes.size() >= k + per_domain) CheckSpread(nodes, plan, k);
        auto spread = [](const HolderPlan& p) {
          uint32_t lo = UINT32_MAX, hi = 0;
          for (const auto& [node, n] : p.held_for) {
            lo = std::min(lo, n);
            hi = std::max(hi, n);
          }
          return hi - lo;
        };
        CHECK(spread(plan) <= spread(PlanHolders(nodes, k)));
        CHECK(plan.short_of.size() <= PlanHolders(nodes, k).short_of.size());
        // The nodes already there keep all but a few holders: the joiner takes its share of
        // holding from the most loaded (at most K copies move per join, plus K when the
        // previous plan was short).
        size_t moved = 0;
        for (const auto& [node, was] : before.holders) {
          const auto& now = plan.holders.at(node);
          for (const auto& h : was) {
            if (std::find(now.begin(), now.end(), h) == now.end()) ++moved;
          }
        }
        CHECK(moved <= 2 * k);
      }
    }
  }
}

}  // namespace
}  // namespace ckpt
