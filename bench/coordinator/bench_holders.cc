// bench_holders: what the coordinator's holder plan (daemon/coordinator/holder_plan.h) costs at
// frontier scale — N nodes in D failure domains, K holders each — for the three plans it makes
// while a job runs: from scratch (a coordinator's start), one node joining (a replacement or a
// late joiner, with the rebalancing pass moving its share to it) and one node leaving. Each is
// the median of --repeat runs, beside the copies the join and the leave moved (holders that
// changed for nodes that were there before) and the spread of the loads. Last, the part the
// coordinator does under its mutex for a join and a leave (HolderRegistry::TakeDue, the input,
// and Apply, the assignments compared and kept): the plan itself runs outside it.
//
//   bench_holders [--nodes 12500] [--replicas 2] [--domains 16] [--repeat 5] [--json]
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "daemon/coordinator/holder_plan.h"
#include "daemon/coordinator/holder_registry.h"

namespace {

using ckpt::HolderNode;
using ckpt::HolderPlan;

double MedianMs(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Holders that changed for the nodes of `before` still in `after`.
size_t Moved(const HolderPlan& before, const HolderPlan& after) {
  size_t moved = 0;
  for (const auto& [node, was] : before.holders) {
    auto now = after.holders.find(node);
    if (now == after.holders.end()) continue;
    for (const auto& h : was) {
      if (std::find(now->second.begin(), now->second.end(), h) == now->second.end()) ++moved;
    }
  }
  return moved;
}

uint32_t Spread(const HolderPlan& p) {
  uint32_t lo = UINT32_MAX, hi = 0;
  for (const auto& [node, n] : p.held_for) {
    lo = std::min(lo, n);
    hi = std::max(hi, n);
  }
  return p.held_for.empty() ? 0 : hi - lo;
}

// The registry's time under the coordinator's mutex for one change (TakeDue + Apply, in ms),
// the plan between them not counted.
double LockedMs(ckpt::HolderRegistry& r) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  auto replan = r.TakeDue(Clock::now());
  const auto t1 = Clock::now();
  auto planned = ckpt::HolderRegistry::Plan(*replan);
  const auto t2 = Clock::now();
  r.Apply(planned);
  const auto t3 = Clock::now();
  return std::chrono::duration<double, std::milli>((t1 - t0) + (t3 - t2)).count();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"cost of the peer-memory tier's holder plan at scale"};
  uint32_t nodes = 12500, replicas = 2, domains = 16, repeat = 5;
  bool json = false;
  app.add_option("--nodes", nodes, "nodes (100,000 GPUs at 8 per node: 12,500)")
      ->capture_default_str();
  app.add_option("--replicas", replicas, "holders per node (--replicas K)")->capture_default_str();
  app.add_option("--domains", domains, "failure domains (0: each node its own)")
      ->capture_default_str();
  app.add_option("--repeat", repeat, "runs per plan (median reported)")->capture_default_str();
  app.add_flag("--json", json, "print one JSON object on stdout instead of the table");
  CLI11_PARSE(app, argc, argv);
  if (nodes < 2 || repeat == 0) {
    std::fprintf(stderr, "bench_holders: --nodes must be at least 2 and --repeat at least 1\n");
    return 2;
  }

  std::vector<HolderNode> all;
  for (uint32_t i = 0; i < nodes; ++i) {
    all.push_back({"node-" + std::to_string(i),
                   domains == 0 ? std::string() : "rack-" + std::to_string(i % domains)});
  }
  const std::vector<HolderNode> without_last(all.begin(), all.end() - 1);
  using Clock = std::chrono::steady_clock;
  auto time_ms = [](auto&& plan) {
    const auto t0 = Clock::now();
    HolderPlan p = plan();
    return std::pair(std::chrono::duration<double, std::milli>(Clock::now() - t0).count(),
                     std::move(p));
  };
  std::vector<double> scratch_ms, join_ms, leave_ms;
  HolderPlan before_join = ckpt::PlanHolders(without_last, replicas);
  HolderPlan full, joined, left;
  for (uint32_t r = 0; r < repeat; ++r) {
    auto [s, plan] = time_ms([&] { return ckpt::PlanHolders(all, replicas); });
    scratch_ms.push_back(s);
    full = std::move(plan);
    auto [j, join] = time_ms([&] { return ckpt::PlanHolders(all, replicas, &before_join); });
    join_ms.push_back(j);
    joined = std::move(join);
    auto [l, leave] = time_ms([&] { return ckpt::PlanHolders(without_last, replicas, &full); });
    leave_ms.push_back(l);
    left = std::move(leave);
  }
  ckpt::HolderRegistry registry(std::chrono::milliseconds(0));
  const auto now = Clock::now();
  for (const HolderNode& n : without_last) {
    registry.Set(n.node_id, {n.node_id + ":7070", n.failure_domain, 64ull << 30, replicas}, now);
  }
  registry.ReplanIfDue(now);
  std::vector<double> locked_join_ms, locked_leave_ms;
  for (uint32_t r = 0; r < repeat; ++r) {
    const HolderNode& last = all.back();
    registry.Set(last.node_id, {last.node_id + ":7070", last.failure_domain, 64ull << 30, replicas},
                 Clock::now());
    locked_join_ms.push_back(LockedMs(registry));
    registry.Remove(last.node_id, Clock::now());
    locked_leave_ms.push_back(LockedMs(registry));
  }
  const size_t join_moved = Moved(before_join, joined);
  const size_t leave_moved = Moved(full, left);
  if (json) {
    std::printf(
        "{\"nodes\": %u, \"replicas\": %u, \"domains\": %u, \"scratch_ms\": %.2f, \"join_ms\": "
        "%.2f, \"leave_ms\": %.2f, \"join_moved\": %zu, \"leave_moved\": %zu, \"join_spread\": "
        "%u, \"short_of\": %zu, \"locked_join_ms\": %.2f, \"locked_leave_ms\": %.2f}\n",
        nodes, replicas, domains, MedianMs(scratch_ms), MedianMs(join_ms), MedianMs(leave_ms),
        join_moved, leave_moved, Spread(joined), joined.short_of.size(), MedianMs(locked_join_ms),
        MedianMs(locked_leave_ms));
    return 0;
  }
  std::printf("holder plan: %u nodes, K = %u, %u domains (median of %u)\n", nodes, replicas,
              domains, repeat);
  std::printf("  from scratch      %9.2f ms   load spread %u\n", MedianMs(scratch_ms),
              Spread(full));
  std::printf("  one node joining  %9.2f ms   %zu copies moved to it, load spread %u\n",
              MedianMs(join_ms), join_moved, Spread(joined));
  std::printf("  one node leaving  %9.2f ms   %zu copies moved (those it held)\n",
              MedianMs(leave_ms), leave_moved);
  std::printf(
      "  under the coordinator's mutex (the plan outside it): %.2f ms for a join, %.2f ms "
      "for a leave\n",
      MedianMs(locked_join_ms), MedianMs(locked_leave_ms));
  return 0;
}
