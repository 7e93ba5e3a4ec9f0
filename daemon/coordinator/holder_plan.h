// HolderPlan: which other nodes hold each node's captured steps in memory (the peer-memory
// tier: `--replicas K` copies in other nodes' `--peer-pool`, outside the node's
// `--failure-domain` where possible), so that losing a node — or a whole domain — loses no
// step that was replicated.
//
// Input: the nodes, each with its failure domain label (empty: a domain of its own), whether it
// can hold (a data-plane address, `--peer-listen`, and a `--peer-pool`) and whether it wants
// holders (`--replicas` > 0). Output: per node that wants them, its K holders, and the nodes
// that got fewer than K (not enough other nodes).
//
// Rule, per node in a fixed order (by domain, then node id): K holders, each the candidate with
// the fewest nodes held for so far among those outside the node's domain, then (only when those
// run out) inside it; never the node itself, never twice. Ties go to the candidate after the
// node in that order (a ring), so equal loads spread instead of piling on the first node. With
// D domains of equal size and N ≥ K + N/D nodes, every node holds for exactly K others.
//
// Stability: given the previous plan, a node keeps each previous holder that is still a
// candidate (alive, with an address, outside its domain when the previous one was) while that
// holder is not over the balanced load, so a node joining or leaving re-replicates only the
// copies that must move: the steps already held stay where they are. Kept holders can leave
// the loads uneven (nodes registering one by one: the first two hold for each other, the third
// piles onto one of them); a last pass then moves single copies from the most loaded holders to
// the least loaded ones, where the node and its domain allow, until loads are within 1 — so a
// late joiner takes its share of holding, at the cost of the few copies moved to it.
//
// Cost: O(N·K·log N) with one ordered set of candidates by load, plus the candidates a pick
// skips (its own domain, holders it already has): with many small domains a few, with two
// large ones up to a domain's worth per pick. Memory O(N·K). Pure function, no I/O,
// thread-compatible. The coordinator keeps it current in holder_registry.h.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace ckpt {

struct HolderNode {
  std::string node_id;
  std::string failure_domain;  // empty: a domain of its own
  bool can_hold = true;        // a candidate holder (a data plane and room for others' copies)
  bool wants_holders = true;   // gets K holders; false: none (it replicates nothing)
};

struct HolderPlan {
  std::map<std::string, std::vector<std::string>> holders;  // node → its holders, in pick order
  std::map<std::string, uint32_t> held_for;                 // node → how many nodes it holds for
  std::vector<std::string> short_of;                        // nodes with fewer than K holders
  // Holders in the node's own domain (no other domain had room): such a copy does not survive
  // the loss of the domain.
  std::vector<std::pair<std::string, std::string>> same_domain;
};

// `previous` may be null. Node ids must be unique; duplicates are ignored after the first.
HolderPlan PlanHolders(std::vector<HolderNode> nodes, uint32_t replicas,
                       const HolderPlan* previous = nullptr);

}  // namespace ckpt
