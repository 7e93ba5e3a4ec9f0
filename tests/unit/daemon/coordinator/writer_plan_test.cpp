#include "daemon/coordinator/writer_plan.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <map>
#include <set>

namespace ckpt {
namespace {

// ranks_per_node ranks per node; every rank holds `tensors` TP slices (rank % tp) of tensors of
// growing size, so each slice is replicated over world/tp ranks.
std::vector<RankRegistration> TpDp(uint32_t world, uint32_t tp, uint32_t per_node,
                                   uint32_t tensors) {
  std::vector<RankRegistration> out;
  for (uint32_t r = 0; r < world; ++r) {
    RankRegistration reg{r, "node" + std::to_string(r / per_node), {}};
    for (uint32_t t = 0; t < tensors; ++t) {
      reg.shards.push_back({"t" + std::to_string(t),
                            "t" + std::to_string(t) + "/slice" + std::to_string(r % tp),
                            4096ull * (t + 1)});
    }
    out.push_back(std::move(reg));
  }
  return out;
}

std::vector<const RankRegistration*> Ptrs(const std::vector<RankRegistration>& v) {
  std::vector<const RankRegistration*> out;
  for (const auto& r : v) out.push_back(&r);
  return out;
}

// rank → names it writes.
std::map<uint32_t, std::set<std::string>> Writes(const std::vector<RankRegistration>& ranks,
                                                 const WriterAssignment& plan) {
  std::map<uint32_t, std::set<std::string>> out;
  for (const auto& r : ranks) {
    std::set<std::string> skip;
    auto it = plan.skips.find(r.rank);
    if (it != plan.skips.end()) skip.insert(it->second.begin(), it->second.end());
    out[r.rank];  // a rank may write nothing
    for (const auto& s : r.shards) {
      if (skip.count(s.name) == 0) out[r.rank].insert(s.name);
    }
  }
  return out;
}

TEST_CASE("PlanWriters writes each replicated shard exactly once", "[writer_plan]") {
  const auto ranks = TpDp(12, 2, 4, 8);
  const WriterAssignment plan = PlanWriters(Ptrs(ranks));
  std::map<std::string, int> writers;  // key → number of writers
  const auto writes = Writes(ranks, plan);
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
  CHECK(plan.unique_bytes == slice_sum);
  CHECK(plan.registered_bytes == slice_sum * 6);
  CHECK(plan.writer.size() == 16);
}

TEST_CASE("PlanWriters balances bytes over the nodes that hold replicas", "[writer_plan]") {
  const auto ranks = TpDp(12, 2, 4, 8);
  const WriterAssignment plan = PlanWriters(Ptrs(ranks));
  REQUIRE(plan.node_bytes.size() == 3);
  uint64_t lo = UINT64_MAX, hi = 0, sum = 0;
  for (const auto& [node, bytes] : plan.node_bytes) {
    lo = std::min(lo, bytes);
    hi = std::max(hi, bytes);
    sum += bytes;
  }
  CHECK(sum == plan.unique_bytes);
  CHECK(static_cast<double>(hi) <= 1.25 * static_cast<double>(lo));
}

TEST_CASE("PlanWriters leaves unique shards to their owner and counts them first",
          "[writer_plan]") {
  // node0 owns a big unique shard; the replicated ones should go to node1.
  std::vector<RankRegistration> ranks = {
      {0, "node0", {{"big", "big", 1 << 20}, {"r1", "r1", 4096}, {"r2", "r2", 8192}}},
      {1, "node1", {{"r1", "r1", 4096}, {"r2", "r2", 8192}}},
  };
  const WriterAssignment plan = PlanWriters(Ptrs(ranks));
  const auto writes = Writes(ranks, plan);
  CHECK(writes.at(0) == std::set<std::string>{"big"});
  CHECK(writes.at(1) == std::set<std::string>{"r1", "r2"});
}

TEST_CASE("PlanWriters is deterministic", "[writer_plan]") {
  const auto ranks = TpDp(16, 4, 4, 20);
  const WriterAssignment a = PlanWriters(Ptrs(ranks));
  const WriterAssignment b = PlanWriters(Ptrs(ranks));
  CHECK(a.skips == b.skips);
  CHECK(a.node_bytes == b.node_bytes);
}

TEST_CASE("PlanWriters keeps a replica's writer while it still holds the replica",
          "[writer_plan]") {
  // Rank 0 re-registers with an extra tensor (optimizer state created after the first step):
  // balance alone would move replicas away from rank 0's node; stability keeps every writer of
  // a replica that survived, so ranks that save one step under the two plans never both skip it.
  auto ranks = TpDp(8, 1, 2, 6);
  const WriterAssignment before = PlanWriters(Ptrs(ranks));
  ranks[0].shards.push_back({"exp_avg", "exp_avg", 1 << 22});
  const WriterAssignment after = PlanWriters(Ptrs(ranks), &before);
  for (const auto& [key, rank] : before.writer) {
    INFO(key);
    REQUIRE(after.writer.count(key) == 1);
    CHECK(after.writer.at(key) == rank);
  }
  CHECK(after.writer.at("exp_avg") == 0);

  // A writer that no longer holds its replica hands it to a holder.
  const uint32_t old_writer = before.writer.at("t5/slice0");
  std::erase_if(ranks[old_writer].shards, [](const PlannedShard& s) { return s.name == "t5"; });
  const WriterAssignment moved = PlanWriters(Ptrs(ranks), &after);
  CHECK(moved.writer.at("t5/slice0") != old_writer);
  const auto writes = Writes(ranks, moved);
  int writers = 0;
  for (const auto& [rank, names] : writes) writers += names.count("t5") != 0 ? 1 : 0;
  CHECK(writers == 1);
}

}  // namespace
}  // namespace ckpt
