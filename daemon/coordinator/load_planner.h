// LoadPlanner: who reads which stored bytes when a whole job restores from storage, so that each
// stored byte that several nodes need is read from storage once per job, not once per node
// (docs/design.md §4.7 "cold load across nodes").
//
// The round. Every rank of a loading job asks (PlanLoad) with the byte ranges of the step's data
// files its load needs and that its node does not already hold in memory, and with its node's
// data-plane address. The answers are "not yet, ask again in retry_ms" until every rank of the
// job's world has asked, or until `wait` has passed since the first ask (a rank that never
// loads, a node that died: the others do not wait for it longer than that). Then the plan is
// made once and frozen: each byte range is cut at every node's range boundaries and on a `grain`
// grid of file offsets; a piece that one node needs stays that node's own storage read; a piece
// several nodes need is assigned to one of them — the needer with the fewest bytes to read in
// the step's rounds so far (ties rotate with the round), among those that serve a data plane —
// which reads it from storage first and serves it;
// the others fetch it from that node. Each node's answer lists what it serves (read these
// first) and what it fetches (from whom); everything else it needs it reads itself. A rank that
// asks after the plan was made (late) gets the plan's pieces that cover its needs. A rank that
// needs nothing (its node holds the bytes: a hot restore) is counted and answered at once, never
// kept waiting. A rank's next load of the same step (the Checkpointer loads the model, then the
// optimizer's state) is in the step's next round, planned the same way. A rank asking from a
// session the step's rounds did not see it in starts the step's rounds afresh: the job
// restarted. A plan is forgotten `keep` after it was made, so that a later restart of the job
// plans anew with its own nodes.
//
// Bytes already in memory elsewhere. The coordinator passes, with each ask, the data files of the
// step that live daemons hold in memory (MemoryHolders: the node that wrote the file, while it is
// alive, and its holders in the peer-memory tier, proto/README.md §4.1). Every piece of such a
// file is fetched from one of them — in turn, piece by piece — and nobody reads it from storage:
// a replacement node restores a lost node's ranks from the lost node's holders. Each fetch of
// such a piece also names the file's other holders (Fetch.alternates), which the loader tries in
// turn when the named one fails: a piece fails only when no holder serves it. The holders are
// asked for once, when the round is planned (O(ranks) in the coordinator), not at every ask. A node
// that is itself one of a file's holders may be named as the source of its own pieces, or
// another holder may: either way the loader copies them from its own peer pool, with no
// network (daemon/load_service.h).
//
// Failure is always another holder or a storage read: a fetch that fails, stalls or brings bytes
// that do not match the manifest is tried at the piece's other holders, and what none of them
// served, or what arrived with bad bytes from a node that read it from storage (the loader
// verifies each checksum piece against the manifest, wherever its bytes came from), is read
// from storage by the loader itself. So a plan can be wrong about who is alive and still
// never make a load of a persisted step fail or return wrong bytes; a memory-only step fails
// only when no live holder of a piece serves it.
//
// Cost: the plan is O(R log R + B / grain) in the ranges all nodes sent (R ≈ nodes × stored
// shards they read) and the bytes they cover (B), plus O(nodes) per change of the set of nodes
// needing a span (the sweep's active set: O(nodes²) per file when every node needs all of it),
// made once per round on the asking thread. An answer is O(what the node serves + the rank's
// needs × log pieces). A request may name at most 2^20 ranges and 64 TiB (CheckRequest), so one
// ask cannot make a plan of more than a few million pieces. Memory: the rounds in progress and
// the plans younger than `keep`, each O(R + B / grain).
//
// Thread safety: all methods may be called from any thread (one mutex; the plan is made under
// it, which serializes the rounds of different jobs: a restart is rare).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "ckptd/v1/coordinator.pb.h"
#include "common/mutex.h"
#include "common/status.h"

namespace ckpt {

class LoadPlanner {
 public:
  using Clock = std::chrono::steady_clock;
  struct Options {
    std::chrono::milliseconds wait{std::chrono::seconds(5)};  // for the rest of the ranks
    std::chrono::milliseconds retry{50};                      // LoadPlanResponse.retry_ms
    std::chrono::milliseconds keep{std::chrono::minutes(2)};  // a made plan's lifetime
    uint64_t grain = 16ull << 20;  // pieces are cut at multiples of this file offset
    size_t max_rounds = 256;       // rounds and plans held at once (oldest dropped)
  };
  LoadPlanner() : LoadPlanner(Options()) {}
  explicit LoadPlanner(Options options) : options_(options) {
    options_.grain = std::max<uint64_t>(options_.grain, 4096);
  }

  // A data file of the step → the live daemons holding it in memory: (node id, data plane).
  using MemoryHolders = std::map<std::string, std::vector<std::pair<std::string, std::string>>>;

  // One rank's ask. Errors: a request without job, node or world size, a rank outside the world,
  // a range that is empty or overflows (kInvalidArgument).
  // `held`: called (with this planner's lock held) when the round is planned; may be empty.
  Result<ckptd::v1::LoadPlanResponse> Ask(const ckptd::v1::LoadPlanRequest& request,
                                          Clock::time_point now,
                                          const std::function<MemoryHolders()>& held = nullptr);
  Result<ckptd::v1::LoadPlanResponse> Ask(const ckptd::v1::LoadPlanRequest& request) {
    return Ask(request, Clock::now());
  }

  size_t rounds() const;

 private:
  // [begin, end) of one file, with the node that reads it from storage for everyone.
  struct Piece {
    uint64_t begin;
    uint64_t end;
    uint32_t reader;      // index into Round::nodes
    bool shared;          // more than one node needs it
    int32_t holder = -1;  // ≥ 0: fetched by every needer from Round::holders[holder]
  };
  struct NodeNeeds {
    std::string peer_address;
    std::map<uint32_t, std::vector<ckptd::v1::FileRange>> by_rank;
  };
  struct Round {
    uint32_t world_size = 0;
    Clock::time_point first_ask;
    Clock::time_point planned_at;
    bool planned = false;
    std::map<uint32_t, std::string> asked;     // rank → node
    std::set<uint32_t> answered;               // ranks told their part (a new ask: next round)
    std::map<uint32_t, std::string> sessions;  // rank → the session it asked from
    uint64_t id = 0;                           // LoadPlanResponse.round
    std::map<std::string, NodeNeeds> needs;    // node → what its ranks asked for
    std::vector<std::string> nodes;            // after planning: index → node id
    std::vector<std::string> addresses;        // after planning: index → its data plane
    std::map<std::string, std::vector<Piece>> pieces;          // file → pieces, sorted
    std::vector<std::vector<ckptd::v1::FileRange>> serve;      // index → what that node serves
    std::vector<std::pair<std::string, std::string>> holders;  // memory holders: node, address
    std::map<std::string, std::vector<int32_t>> held_by;  // file → its holders (into `holders`)
  };

  // `read`: bytes each node reads from storage in the step's earlier rounds, carried on so that
  // the rounds of one restart balance together.
  void MakePlan(Round& round, std::map<std::string, uint64_t>& read,
                const MemoryHolders& held) const;
  ckptd::v1::LoadPlanResponse Answer(const Round& round, const std::string& node,
                                     const std::vector<ckptd::v1::FileRange>& needs) const;
  void DropExpiredLocked(Clock::time_point now) REQUIRES(mu_);

  Options options_;
  mutable Mutex mu_;
  // (job, step) → its rounds, oldest first: a rank's k-th load of the step is in round k.
  std::map<std::pair<std::string, uint64_t>, std::deque<Round>> rounds_ GUARDED_BY(mu_);
  // Round ids start from the clock, so that a restarted coordinator's never repeat the ones
  // daemons remember from before.
  uint64_t next_round_id_ GUARDED_BY(mu_) = static_cast<uint64_t>(
      std::chrono::system_clock::now().time_since_epoch() / std::chrono::microseconds(1));
  // (job, step) → node → bytes it reads in the step's rounds (MakePlan's `read`).
  std::map<std::pair<std::string, uint64_t>, std::map<std::string, uint64_t>> read_ GUARDED_BY(mu_);
};

}  // namespace ckpt
