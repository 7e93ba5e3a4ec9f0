// Chaos over the peer-memory tier: daemons SIGKILLed at random while steps are being replicated
// and while the job restores from memory. Four nodes, --replicas 1, a data-parallel job of four
// ranks (every rank restores every tensor, so each restore reads all four data files, wherever
// they are). Each round saves one step — memory-only, or persisted every third — kills a random
// node right after the save (its replication still on the wire) or not, replaces it with a fresh
// daemon under a new node id, then restarts the job from its restore point while, in some rounds,
// another node is killed mid-restore. What must hold, whatever the timing:
//   * every rank that restores gets exactly the bytes of the step it was told it restored (the
//     model's fill pattern of that step: never a torn mix of steps or nodes) — or an error;
//   * every rank of a restart restores the same step;
//   * a round without kills restores every rank, from the newest step.
// The seed is printed (CKPT_CHAOS_SEED replays a run).
#include "tests/integration/peer_tier_harness.h"  // first: it configures Catch

#include <cstdlib>
#include <future>
#include <random>
#include <set>

namespace ckpt::itest {
namespace {

constexpr uint32_t kWorld = 4;

uint64_t Seed() {
  if (const char* s = std::getenv("CKPT_CHAOS_SEED")) return std::strtoull(s, nullptr, 10);
  return std::random_device()();
}

TEST_CASE(
    "peer tier chaos: daemons killed during replication and restore never cause a torn or "
    "wrong restore",
    "[peer_tier][chaos]") {
  const uint64_t seed = Seed();
  INFO("CKPT_CHAOS_SEED=" << seed);
  std::mt19937_64 rng(seed);
  auto pick = [&](uint32_t n) { return static_cast<uint32_t>(rng() % n); };

  Tier t(static_cast<int>(kWorld), "1", 1);
  auto& nodes = t.nodes;
  auto& ranks = t.ranks;
  int generation = 0;
  auto replace = [&](uint32_t i) {
    ranks[i].reset();
    if (nodes[i]->Alive()) nodes[i]->Kill(SIGKILL);
    nodes[i] = JoinTier(t, "n" + std::to_string(i) + "-" + std::to_string(++generation));
    ranks[i] = std::make_unique<ModelRank>(nodes[i]->socket(), kJob, i, kWorld, 1, kTensors);
  };

  uint64_t next_step = 1;
  constexpr int kRounds = 5;
  int restored_rounds = 0;
  int killed_saving = 0, killed_restoring = 0, load_errors = 0;
  for (int round = 0; round < kRounds; ++round) {
    const bool last = round == kRounds - 1;  // no kills: everything must restore
    const uint64_t step = next_step++;
    const bool persist = step % 3 == 1;
    INFO("round " << round << ", step " << step << (persist ? " (persisted)" : " (memory-only)"));
    // Every node has its holder before the step (a replacement is planned in when it joins).
    WaitForHolders(nodes, 1);
    for (auto& r : ranks) {
      // A save may be refused when the step already failed (a copy could not be placed).
      const Status saved = r->SaveStep(step, persist);
      if (last) REQUIRE_OK(saved);
    }
    if (!last && pick(2) == 0) {
      replace(pick(kWorld));  // its bytes may be half sent
      ++killed_saving;
    }
    for (auto& r : ranks) {
      // Whatever became of the step (committed, replicated, failed with a node), it ended.
      const Status ended = r->client().Wait(
          step, persist ? WaitState::kCommitted : WaitState::kReplicated, std::chrono::seconds(60));
      if (last) REQUIRE_OK(ended);
    }

    // The job restarts: every rank asks its restore point and loads it; maybe a node dies
    // mid-restore.
    std::vector<std::future<Result<ModelRank::Restored>>> loads;
    for (auto& r : ranks) {
      loads.push_back(
          std::async(std::launch::async, [&r] { return r->LoadRestorePointAndCheck(); }));
    }
    std::optional<uint32_t> killed;
    if (!last && pick(3) == 0) {
      killed = pick(kWorld);
      nodes[*killed]->Kill(SIGKILL);
      ++killed_restoring;
    }
    std::set<uint64_t> steps_restored;
    int ok = 0;
    for (uint32_t i = 0; i < kWorld; ++i) {
      auto restored = loads[i].get();
      if (!restored.ok()) {
        // An error is allowed (a copy died under the load); a wrong byte never is.
        UNSCOPED_INFO("rank " << i << ": " << restored.status().ToString());
        ++load_errors;
        continue;
      }
      CHECK(restored->mismatches == 0);
      steps_restored.insert(restored->step);
      ++ok;
    }
    CHECK(steps_restored.size() <= 1);  // one restore point for the whole restart
    if (killed) replace(*killed);
    if (last) {
      CHECK(ok == static_cast<int>(kWorld));
      CHECK(steps_restored == std::set<uint64_t>{step});
    }
    restored_rounds += ok == static_cast<int>(kWorld) ? 1 : 0;
  }
  CHECK(restored_rounds >= 1);
  WARN("seed " << seed << ": " << killed_saving << " node(s) killed while replicating, "
               << killed_restoring << " while restoring; " << restored_rounds << " of " << kRounds
               << " restarts restored every rank; " << load_errors << " rank load(s) failed");
}

}  // namespace
}  // namespace ckpt::itest
