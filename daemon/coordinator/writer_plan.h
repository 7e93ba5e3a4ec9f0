// WriterPlan: which rank writes each shard of a job, so that data-parallel replicas are written
// once and the bytes written per node are balanced (docs/design.md §4.4, §6.3: worst-fit).
//
// Input: every rank's registration (the node it runs on and, per shard, a key that is equal for
// two shards iff they are replicas — same tensor, dtype, global shape and geometry — and the
// shard's bytes). Output: per rank the names it skips (a replica another rank writes).
//
// Algorithm: shards held by one rank are written by it and preload that node's byte count.
// Replicated shards are then placed largest first; each goes to the holder node with the fewest
// bytes so far (ties: node name), and on that node to the holder rank with the fewest bytes
// (ties: lowest rank). O(S log S) for S distinct shards; measured in bench/coordinator.
//
// Stability: given the previous plan, a replicated shard whose previous writer still holds it
// keeps that writer. Plans reach nodes at different times, so two ranks can save one step under
// two consecutive plans; a writer that stays put is what keeps that from leaving a replica
// unwritten (each rank skipping it because the other plan names the other rank).
// Pure function, no I/O, thread-compatible.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

namespace ckpt {

struct PlannedShard {
  std::string name;  // tensor name (unique within one rank's registration)
  std::string key;   // equal iff replicas
  uint64_t bytes = 0;
};

struct RankRegistration {
  uint32_t rank = 0;
  std::string node_id;
  std::vector<PlannedShard> shards;
  uint64_t registration_id = 0;  // the daemon's id of this registration (echoed in the plan)
};

struct WriterAssignment {
  std::map<uint32_t, std::vector<std::string>> skips;  // rank → names it does not write
  std::map<std::string, uint64_t> node_bytes;          // bytes each node writes
  uint64_t unique_bytes = 0;                           // bytes written in all
  uint64_t registered_bytes = 0;                       // bytes registered in all
  // Key of every distinct shard → the rank that writes it (what the next plan keeps).
  std::unordered_map<std::string, uint32_t> writer;
};

// `ranks` point into storage the caller keeps alive during the call; `previous` (may be null)
// is the plan this one replaces.
WriterAssignment PlanWriters(const std::vector<const RankRegistration*>& ranks,
                             const WriterAssignment* previous = nullptr);

}  // namespace ckpt
