// HolderRegistry (daemon/coordinator/holder_registry.h): the coordinator's holder plan as nodes
// register and are lost — one plan per burst of changes, only nodes with a data plane and a
// peer pool hold, each node's list cut to its own --replicas, and exactly the nodes whose
// holders changed (or moved to another address) are told.
#include "daemon/coordinator/holder_registry.h"

#include <algorithm>
#include <catch2/catch.hpp>

namespace ckpt {
namespace {

using Clock = HolderRegistry::Clock;
using std::chrono::milliseconds;

HolderRegistry::Node Holder(const std::string& address, uint32_t replicas = 1,
                            const std::string& domain = "") {
  return {address, domain, 64ull << 20, replicas};
}

std::vector<std::string> Sorted(std::vector<std::string> v) {
  std::sort(v.begin(), v.end());
  return v;
}

TEST_CASE("HolderRegistry plans once per burst, after the delay", "[holders]") {
  HolderRegistry r(milliseconds(100));
  const auto t0 = Clock::now();
  r.Set("a", Holder("10.0.0.1:1"), t0);
  r.Set("b", Holder("10.0.0.2:1"), t0 + milliseconds(50));
  REQUIRE(r.due());
  CHECK(*r.due() == t0 + milliseconds(100));  // the first change starts the clock
  CHECK(r.ReplanIfDue(t0 + milliseconds(99)).empty());
  CHECK(Sorted(r.ReplanIfDue(t0 + milliseconds(100))) == std::vector<std::string>{"a", "b"});
  CHECK_FALSE(r.due());
  CHECK(r.HoldersOf("a") == std::vector<std::string>{"b"});
  CHECK(r.HoldersOf("b") == std::vector<std::string>{"a"});
  const auto a = r.AssignmentFor("a");
  REQUIRE(a.holders_size() == 1);
  CHECK(a.holders(0).node_id() == "b");
  CHECK(a.holders(0).peer_address() == "10.0.0.2:1");
  CHECK(a.version() == r.version());
  // The same registration again changes nothing.
  r.Set("a", Holder("10.0.0.1:1"), t0 + milliseconds(200));
  CHECK_FALSE(r.due());
}

TEST_CASE("HolderRegistry: only nodes with an address and a pool hold, replicas cut per node",
          "[holders]") {
  HolderRegistry r(milliseconds(0));
  const auto t = Clock::now();
  r.Set("a", Holder("10.0.0.1:1", 2), t);
  r.Set("b", Holder("10.0.0.2:1", 1), t);
  r.Set("c", Holder("10.0.0.3:1", 0), t);   // holds, replicates nothing
  r.Set("d", {"", "", 64ull << 20, 1}, t);  // no data plane: cannot hold
  r.Set("e", {"10.0.0.5:1", "", 0, 1}, t);  // no pool: cannot hold
  r.ReplanIfDue(t);
  CHECK(r.HoldersOf("a").size() == 2);
  CHECK(r.HoldersOf("b").size() == 1);
  CHECK(r.HoldersOf("c").empty());
  CHECK(r.HoldersOf("d").size() == 1);
  CHECK(r.HoldersOf("e").size() == 1);
  for (const std::string node : {"a", "b", "c", "d", "e"}) {
    for (const auto& h : r.HoldersOf(node)) {
      INFO(node << " held by " << h);
      CHECK(h != node);
      CHECK((h == "a" || h == "b" || h == "c"));
    }
  }
}

TEST_CASE("HolderRegistry: a lost holder is replaced, a holder back at a new address is news",
          "[holders]") {
  HolderRegistry r(milliseconds(0));
  auto t = Clock::now();
  r.Set("a", Holder("10.0.0.1:1"), t);
  r.Set("b", Holder("10.0.0.2:1"), t);
  r.Set("c", Holder("10.0.0.3:1"), t);
  r.ReplanIfDue(t);
  const std::string holder_of_a = r.HoldersOf("a").at(0);
  const uint64_t v = r.version();

  r.Remove(holder_of_a, t);
  const auto changed = r.ReplanIfDue(t);
  CHECK(std::count(changed.begin(), changed.end(), "a") == 1);
  CHECK(r.version() > v);
  REQUIRE(r.HoldersOf("a").size() == 1);
  CHECK(r.HoldersOf("a").at(0) != holder_of_a);
  CHECK(r.HoldersOf(holder_of_a).empty());

  // Its daemon restarts at another port; the node it then holds for is told the new address.
  r.Set(holder_of_a, Holder("10.0.0.9:7"), t);
  r.ReplanIfDue(t);
  const std::string now_of_a = r.HoldersOf("a").at(0);
  r.Remove(now_of_a, t);
  r.Set(now_of_a, Holder("10.0.0.8:8"), t);  // lost and back within one burst
  const auto told = r.ReplanIfDue(t);
  for (const auto& [node, holders] : std::map<std::string, std::vector<std::string>>{
           {"a", r.HoldersOf("a")}, {"b", r.HoldersOf("b")}, {"c", r.HoldersOf("c")}}) {
    if (std::find(holders.begin(), holders.end(), now_of_a) == holders.end()) continue;
    INFO(node << " is held by " << now_of_a);
    CHECK(std::count(told.begin(), told.end(), node) == 1);
    bool found = false;
    const auto assignment = r.AssignmentFor(node);
    for (const auto& h : assignment.holders()) {
      found = found || (h.node_id() == now_of_a && h.peer_address() == "10.0.0.8:8");
    }
    CHECK(found);
  }
}

TEST_CASE("HolderRegistry: a plan computed off the lock takes force with what changed meanwhile",
          "[holders]") {
  HolderRegistry r(milliseconds(10));
  const auto t = Clock::now();
  for (const char* node : {"a", "b", "c"}) r.Set(node, Holder(std::string(node) + ":1"), t);
  CHECK(r.AssignmentFor("a").planning());  // not in a plan yet: it holds back replication
  auto replan = r.TakeDue(t + milliseconds(10));
  REQUIRE(replan);
  CHECK(replan->nodes->size() == 3);
  CHECK(r.AssignmentFor("a").planning());
  // One plan at a time: none is due while it is in flight, even after more changes.
  r.Remove("b", t + milliseconds(11));
  r.Set("d", Holder("d:1"), t + milliseconds(11));
  CHECK_FALSE(r.due());
  CHECK_FALSE(r.TakeDue(t + milliseconds(100)));
  // The plan, computed without the registry (as the coordinator's plan thread does).
  auto planned = HolderRegistry::Plan(*replan);
  const auto changed = r.Apply(planned);
  // 'b' left meanwhile: nobody is told it holds, nor is it given holders; 'd' waits for the next
  // plan, due now.
  CHECK(std::count(changed.begin(), changed.end(), "b") == 0);
  for (const char* node : {"a", "c"}) {
    for (const auto& h : r.HoldersOf(node)) CHECK(h != "b");
  }
  CHECK(r.HoldersOf("b").empty());
  CHECK(r.HoldersOf("d").empty());
  CHECK(std::count(changed.begin(), changed.end(), "a") == 1);
  for (const char* node : {"a", "c"}) {
    // Planned now; but one whose holder was 'b' is short of one, and planning again.
    INFO(node);
    CHECK(r.AssignmentFor(node).planning() == r.HoldersOf(node).empty());
  }
  CHECK(r.AssignmentFor("d").planning());  // registered after the plan took its input
  REQUIRE(r.due());
  CHECK(*r.due() == t + milliseconds(21));
  r.ReplanIfDue(t + milliseconds(21));
  CHECK(r.HoldersOf("a").size() == 1);
  CHECK(r.HoldersOf("c").size() == 1);
  CHECK(r.HoldersOf("d").size() == 1);
  CHECK_FALSE(r.AssignmentFor("d").planning());

  // A node whose holders the plan leaves as they were (none: it replicates nothing) is still
  // told once the plan includes it, so that it stops waiting.
  r.Set("z", Holder("z:1", 0), t + milliseconds(30));
  CHECK(r.AssignmentFor("z").planning());
  const auto told = r.ReplanIfDue(t + milliseconds(40));
  CHECK(std::count(told.begin(), told.end(), "z") == 1);
  CHECK_FALSE(r.AssignmentFor("z").planning());
}

TEST_CASE("HolderRegistry: holders outside the failure domain, and same-domain ones named",
          "[holders]") {
  HolderRegistry r(milliseconds(0));
  const auto t = Clock::now();
  r.Set("a1", Holder("10.0.1.1:1", 1, "rack-a"), t);
  r.Set("a2", Holder("10.0.1.2:1", 1, "rack-a"), t);
  r.Set("b1", Holder("10.0.2.1:1", 1, "rack-b"), t);
  r.Set("b2", Holder("10.0.2.2:1", 1, "rack-b"), t);
  r.ReplanIfDue(t);
  for (const std::string node : {"a1", "a2"}) {
    CHECK(r.HoldersOf(node).at(0).starts_with("b"));
    CHECK(r.AssignmentFor(node).same_domain_size() == 0);
  }
  for (const std::string node : {"b1", "b2"}) CHECK(r.HoldersOf(node).at(0).starts_with("a"));
  // Rack b lost: rack a's nodes can only hold for each other, and are told so.
  r.Remove("b1", t);
  r.Remove("b2", t);
  r.ReplanIfDue(t);
  CHECK(r.HoldersOf("a1") == std::vector<std::string>{"a2"});
  const auto a1 = r.AssignmentFor("a1");
  REQUIRE(a1.same_domain_size() == 1);
  CHECK(a1.same_domain(0) == "a2");
}

}  // namespace
}  // namespace ckpt
