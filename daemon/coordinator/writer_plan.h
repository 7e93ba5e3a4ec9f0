// WriterPlan: which rank writes each shard of a job, so that data-parallel replicas are written
// once and the bytes written per node are balanced (docs/design.md §4.4, §6.3: worst-fit).
//
// Input: every rank's node and layout (rank_layout.h). Ranks that registered the same layout
// share one RankLayout object (the coordinator keeps one per fingerprint), and the plan works
// on the distinct layouts, not on ranks × tensors. Output: per rank, the shards it writes.
//
// Cost model (R ranks on N nodes, L distinct layouts of T shards each, S ≤ L·T distinct shards,
// h = holders of a shard): grouping ranks by layout O(R); interning the distinct layouts'
// replica keys O(L·T); placing the replicated shards O(S log S + S·g·log h') where g is the
// number of distinct layouts holding a shard (1 for a TP slice, up to TP for a norm weight every
// slice holds) and h' the ranks of one such layout — one lazy heap per distinct layout yields
// its least-loaded holder; output O(S + R). Memory O(R + S). For a TP 8 × DP 2,048 job with
// 2,000 tensors per rank that is 16,000 distinct shards, against 33 M registered ones
// (bench/README.md, "Coordinator").
//
// Algorithm: shards held by one rank are written by it and preload that node's byte count.
// Replicated shards are then placed largest first; each goes to the holder node with the fewest
// bytes so far (ties: node name), and on that node to the holder rank with the fewest bytes
// (ties: lowest rank).
//
// Stability: given the previous plan, a replicated shard whose previous writer still holds it
// keeps that writer. Plans reach nodes at different times, so two ranks can save one step under
// two consecutive plans; a writer that stays put is what keeps that from leaving a replica
// unwritten (each rank skipping it because the other plan names the other rank). A plan whose
// inputs equal the previous plan's (every rank back with the same node and layout: a restart)
// is the previous plan, reused without recomputation.
// Pure function, no I/O, thread-compatible.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "daemon/coordinator/rank_layout.h"

namespace ckpt {

struct PlanRank {
  uint32_t rank = 0;
  std::string node_id;
  std::shared_ptr<const RankLayout> layout;
};

struct WriterAssignment {
  std::vector<PlanRank> inputs;  // sorted by rank: what the plan was computed from
  // Parallel to `inputs`: indexes into the rank's layout->shards it writes, ascending.
  std::vector<std::vector<uint32_t>> writes;
  std::map<std::string, uint64_t> node_bytes;  // bytes each node writes
  uint64_t unique_bytes = 0;                   // bytes written in all
  uint64_t registered_bytes = 0;               // bytes registered in all
  size_t distinct_layouts = 0;
  size_t distinct_shards = 0;
  // Replica key of every distinct shard → the rank that writes it (what the next plan keeps).
  // Views into the layouts of `inputs`, which this plan keeps alive.
  std::unordered_map<std::string_view, uint32_t> writer;

  // Index of `rank` in `inputs`, or -1.
  ptrdiff_t IndexOf(uint32_t rank) const;
};

// `previous` (may be null) is the plan this one replaces. `ranks` need not be sorted.
std::shared_ptr<const WriterAssignment> PlanWriters(
    std::vector<PlanRank> ranks, std::shared_ptr<const WriterAssignment> previous = nullptr);

}  // namespace ckpt
