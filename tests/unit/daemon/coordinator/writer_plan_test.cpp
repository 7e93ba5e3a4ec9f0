#include "daemon/coordinator/writer_plan.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <map>
#include <set>

namespace ckpt {
namespace {

struct Reg {
  uint32_t rank;
  std::string node;
  std::vector<LayoutShard> shards;
};

// ranks_per_node ranks per node; every rank holds `tensors` TP slices (rank % tp) of tensors of
// growing size, so each slice is replicated over world/tp ranks.
std::vector<Reg> TpDp(uint32_t world, uint32_t tp, uint32_t per_node, uint32_t tensors) {
  std::vector<Reg> out;
  for (uint32_t r = 0; r < world; ++r) {
    Reg reg{r, "node" + std::to_string(r / per_node), {}};
    for (uint32_t t = 0; t < tensors; ++t) {
      reg.shards.push_back({"t" + std::to_string(t),
                            "t" + std::to_string(t) + "/slice" + std::to_string(r % tp),
                            4096ull * (t + 1)});
    }
    out.push_back(std::move(reg));
  }
  return out;
}

std::shared_ptr<const RankLayout> LayoutOf(const std::vector<LayoutShard>& shards) {
  auto l = std::make_shared<RankLayout>();
  l->shards = shards;
  for (const auto& s : shards) l->bytes += s.bytes;
  return l;
}

// Plan inputs. `share`: ranks with equal shard lists share one layout object, as the
// coordinator's registry makes them; otherwise every rank has its own (the plan must not care).
std::vector<PlanRank> Inputs(const std::vector<Reg>& regs, bool share = true) {
  std::map<std::vector<std::string>, std::shared_ptr<const RankLayout>> seen;
  std::vector<PlanRank> out;
  for (const auto& r : regs) {
    std::vector<std::string> keys;
    for (const auto& s : r.shards) keys.push_back(s.key + "#" + std::to_string(s.bytes));
    auto& layout = seen[keys];
    if (!layout || !share) layout = LayoutOf(r.shards);
    out.push_back(PlanRank{r.rank, r.node, layout});
  }
  return out;
}

// rank → names it writes.
std::map<uint32_t, std::set<std::string>> Writes(const WriterAssignment& plan) {
  std::map<uint32_t, std::set<std::string>> out;
  for (size_t i = 0; i < plan.inputs.size(); ++i) {
    auto& names = out[plan.inputs[i].rank];  // a rank may write nothing
    for (uint32_t s : plan.writes[i]) names.insert(plan.inputs[i].layout->shards[s].name);
  }
  return out;
}

TEST_CASE("PlanWriters writes each replicated shard exactly once", "[writer_plan]") {
  const auto ranks = TpDp(12, 2, 4, 8);
  for (bool share : {true, false}) {
    INFO("shared layouts: " << share);
    const auto plan = PlanWriters(Inputs(ranks, share));
    std::map<std::string, int> writers;  // key → number of writers
    const auto writes = Writes(*plan);
    for (const auto& r : ranks) {
      for (const auto& s : r.shards) {
        if (writes.at(r.rank).count(s.name) != 0) ++writers[s.key];
      }
    }
    REQUIRE(writers.size() == 16);  // 8 tensors × 2 slices
    for (const auto& [key, n] : writers) {
      INFO(key);
      CHECK(n == 1);
    }
    uint64_t slice_sum = 0;
    for (uint32_t t = 0; t < 8; ++t) slice_sum += 2 * 4096ull * (t + 1);
    CHECK(plan->unique_bytes == slice_sum);
    CHECK(plan->registered_bytes == slice_sum * 6);
    CHECK(plan->writer.size() == 16);
    CHECK(plan->distinct_shards == 16);
    CHECK(plan->distinct_layouts == (share ? 2 : 12));
  }
}

TEST_CASE("PlanWriters plans the same with shared and with per-rank layouts", "[writer_plan]") {
  const auto ranks = TpDp(16, 4, 4, 20);
  const auto shared = PlanWriters(Inputs(ranks, true));
  const auto separate = PlanWriters(Inputs(ranks, false));
  CHECK(Writes(*shared) == Writes(*separate));
  CHECK(shared->node_bytes == separate->node_bytes);
}

TEST_CASE("PlanWriters balances bytes over the nodes that hold replicas", "[writer_plan]") {
  const auto ranks = TpDp(12, 2, 4, 8);
  const auto plan = PlanWriters(Inputs(ranks));
  REQUIRE(plan->node_bytes.size() == 3);
  uint64_t lo = UINT64_MAX, hi = 0, sum = 0;
  for (const auto& [node, bytes] : plan->node_bytes) {
    lo = std::min(lo, bytes);
    hi = std::max(hi, bytes);
    sum += bytes;
  }
  CHECK(sum == plan->unique_bytes);
  CHECK(static_cast<double>(hi) <= 1.25 * static_cast<double>(lo));
}

TEST_CASE("PlanWriters spreads a shard every layout holds over all of its holders",
          "[writer_plan]") {
  // A norm weight held whole by every TP slice: one distinct shard in 4 distinct layouts. The
  // heaviest node so far must not get it.
  auto ranks = TpDp(8, 4, 4, 4);
  for (auto& r : ranks) r.shards.push_back({"norm", "norm", 1 << 20});
  ranks[0].shards.push_back({"big", "big0", 1 << 24});  // node0 is loaded by a unique shard
  const auto plan = PlanWriters(Inputs(ranks));
  CHECK(plan->writer.at("norm") >= 4);  // on node1
  const auto writes = Writes(*plan);
  int writers = 0;
  for (const auto& [rank, names] : writes) writers += names.count("norm");
  CHECK(writers == 1);
}

TEST_CASE("PlanWriters leaves unique shards to their owner and counts them first",
          "[writer_plan]") {
  // node0 owns a big unique shard; the replicated ones should go to node1.
  std::vector<Reg> ranks = {
      {0, "node0", {{"big", "big", 1 << 20}, {"r1", "r1", 4096}, {"r2", "r2", 8192}}},
      {1, "node1", {{"r1", "r1", 4096}, {"r2", "r2", 8192}}},
  };
  const auto writes = Writes(*PlanWriters(Inputs(ranks)));
  CHECK(writes.at(0) == std::set<std::string>{"big"});
  CHECK(writes.at(1) == std::set<std::string>{"r1", "r2"});
}

TEST_CASE("PlanWriters is deterministic", "[writer_plan]") {
  const auto ranks = TpDp(16, 4, 4, 20);
  const auto a = PlanWriters(Inputs(ranks));
  auto shuffled = Inputs(ranks);
  std::reverse(shuffled.begin(), shuffled.end());
  const auto b = PlanWriters(shuffled);
  CHECK(Writes(*a) == Writes(*b));
  CHECK(a->node_bytes == b->node_bytes);
}

TEST_CASE("PlanWriters reuses the previous plan when every rank came back the same",
          "[writer_plan]") {
  const auto ranks = TpDp(8, 2, 4, 6);
  auto inputs = Inputs(ranks);
  const auto first = PlanWriters(inputs);
  CHECK(PlanWriters(inputs, first) == first);  // a restart: same layouts, same nodes
  inputs[3].node_id = "elsewhere";             // a rank moved: planned anew
  const auto moved = PlanWriters(inputs, first);
  CHECK(moved != first);
  CHECK(moved->node_bytes.count("elsewhere") == 1);
}

TEST_CASE("PlanWriters keeps a replica's writer while it still holds the replica",
          "[writer_plan]") {
  // Rank 0 re-registers with an extra tensor (optimizer state created after the first step):
  // balance alone would move replicas away from rank 0's node; stability keeps every writer of
  // a replica that survived, so ranks that save one step under the two plans never both skip it.
  auto ranks = TpDp(8, 1, 2, 6);
  const auto before = PlanWriters(Inputs(ranks));
  ranks[0].shards.push_back({"exp_avg", "exp_avg", 1 << 22});
  const auto after = PlanWriters(Inputs(ranks), before);
  for (const auto& [key, rank] : before->writer) {
    INFO(key);
    REQUIRE(after->writer.count(key) == 1);
    CHECK(after->writer.at(key) == rank);
  }
  CHECK(after->writer.at("exp_avg") == 0);

  // A writer that no longer holds its replica hands it to a holder.
  const uint32_t old_writer = before->writer.at("t5/slice0");
  std::erase_if(ranks[old_writer].shards, [](const LayoutShard& s) { return s.name == "t5"; });
  const auto moved = PlanWriters(Inputs(ranks), after);
  CHECK(moved->writer.at("t5/slice0") != old_writer);
  int writers = 0;
  for (const auto& [rank, names] : Writes(*moved)) writers += names.count("t5") != 0 ? 1 : 0;
  CHECK(writers == 1);
}

}  // namespace
}  // namespace ckpt
