// Memory-only steps and frozen daemons in the peer-memory tier, on real processes
// (proto/README.md §4.2): a step saved with persist=False is never written, restores on a
// replacement node from its peers' memory, and stops being restorable once its copies are gone;
// a daemon that stops answering stops counting as a copy within seconds, and when it wakes it
// rejoins (within its lease) or stays fenced from what it held (after it); once a job's trainers
// have all ended, the coordinator releases its copies and every peer pool gives them back.
#include "tests/integration/peer_tier_harness.h"  // first: it configures Catch

#include <filesystem>
#include <thread>

namespace ckpt::itest {
namespace {

TEST_CASE(
    "peer tier: a memory-only step is never written, restores on a replacement node from peers' "
    "memory, and latest() falls back to the persisted step once its copies are gone",
    "[peer_tier]") {
  constexpr int kFour = 4;
  Tier t(kFour, "1", 1);
  auto& nodes = t.nodes;
  auto& ranks = t.ranks;
  SaveCommittedThenMemoryOnly(ranks);
  for (auto& r : ranks) {
    const Status committed = r->client().Wait(2, WaitState::kCommitted, std::chrono::seconds(5));
    CHECK(committed.code() == StatusCode::kFailedPrecondition);
    CHECK_THAT(committed.message(), Catch::Contains("memory-only"));
  }
  // Nothing of step 2 on storage: no directory, no MANIFEST, no data file.
  CHECK_FALSE(std::filesystem::exists(StepDir(t.root, kJob, 2)));
  {
    // The coordinator describes it, with where each rank's copies live: its node and holder.
    auto [rc, out] = RunCkptctl(t.dir, {"--admin", t.coordinator.address(), "describe", kJob, "2"});
    CHECK(rc == 0);
    INFO(out);
    CHECK_THAT(out, Catch::Contains("memory-only: not on storage"));
    for (int r = 0; r < kFour; ++r) {
      CHECK_THAT(out, Catch::Contains("rank " + std::to_string(r) + " in memory on n" +
                                      std::to_string(r) + ", n"));
    }
  }
  {
    auto latest = ranks[1]->client().Latest();
    REQUIRE_OK(latest);
    CHECK(*latest == std::optional<uint64_t>(2));
  }

  // Node n0 dies with its memory; a fresh daemon with another node id takes its rank, and the
  // whole job restarts from its restore point: step 2, from the survivors' memory and n0's
  // holder, with nothing read from storage.
  ranks[0].reset();
  nodes[0]->Kill(SIGKILL);
  auto replacement = JoinTier(t, "n4");
  ranks[0] = std::make_unique<ModelRank>(replacement->socket(), kJob, 0, kFour, 1, kTensors);
  {
    // The lost node's copies go when the coordinator sees its stream end; its rank stays
    // restorable from its holder.
    auto point = ranks[0]->client().RestorePoint();
    REQUIRE_OK(point);
    CHECK(*point == std::optional<uint64_t>(2));
  }
  const char* const kReceived = "ckptd_peer_bytes_total{direction=\"received\"}";
  std::vector<double> received_before;
  for (int i = 1; i < kFour; ++i) received_before.push_back(Metric(*nodes[i], kReceived));
  LoadEveryRankAndCheck(ranks, 2);
  double from_storage = Metric(*replacement, "ckptd_read_bytes_total{source=\"storage\"}");
  for (int i = 1; i < kFour; ++i) {
    from_storage += Metric(*nodes[i], "ckptd_read_bytes_total{source=\"storage\"}");
  }
  CHECK(from_storage == 0);
  const double replacement_received = Metric(*replacement, kReceived);
  CHECK(replacement_received > 0);
  // The replacement holds nothing and receives all four nodes' files. A survivor needs the three
  // it did not write, and holds one of them for its node (--replicas 1): it copies that one from
  // its own peer pool and receives only the other two over the network.
  for (int i = 1; i < kFour; ++i) {
    const double received = Metric(*nodes[i], kReceived) - received_before[i - 1];
    INFO("n" << i << " received " << received << " bytes, the replacement "
             << replacement_received);
    CHECK(received > 0);
    CHECK(received < 0.6 * replacement_received);
  }

  // Every original daemon dies: no live daemon holds step 2 any more (the replacement only
  // loaded it), so the job's newest restorable step is the persisted one, and it loads.
  for (int i = 1; i < kFour; ++i) {
    ranks[static_cast<size_t>(i)].reset();
    nodes[static_cast<size_t>(i)]->Kill(SIGKILL);
  }
  REQUIRE(PollUntil([&] {
    auto latest = ranks[0]->client().Latest();
    return latest.ok() && *latest == std::optional<uint64_t>(1);
  }));
  auto mismatches = ranks[0]->LoadAndCheck(1);
  REQUIRE_OK(mismatches);
  CHECK(*mismatches == 0);
}

TEST_CASE(
    "peer tier: a restarted coordinator learns a memory-only step again from its nodes, and a "
    "lost node's ranks of it still restore from memory",
    "[peer_tier]") {
  Tier t(3, "1", 1);
  auto& nodes = t.nodes;
  auto& ranks = t.ranks;
  SaveCommittedThenMemoryOnly(ranks);
  // The step's manifest lived in the coordinator's memory only; the daemons report the step
  // again when they reconnect, and once all three did it is restorable again.
  t.coordinator.Restart();
  REQUIRE(PollUntil([&] {
    auto latest = ranks[1]->client().Latest();
    return latest.ok() && *latest == std::optional<uint64_t>(2);
  }));
  CHECK(CopiesOf(t.coordinator, 2, 0).size() == 2);  // n0 and its holder

  // n0 dies; its rank of step 2 comes from its holder, the others from their own nodes.
  ranks[0].reset();
  nodes[0]->Kill(SIGKILL);
  auto replacement = JoinTier(t, "n3");
  ranks[0] = std::make_unique<ModelRank>(replacement->socket(), kJob, 0, 3, 1, kTensors);
  LoadEveryRankAndCheck(ranks, 2);
  double from_storage = Metric(*replacement, "ckptd_read_bytes_total{source=\"storage\"}");
  for (int i = 1; i < 3; ++i) {
    from_storage += Metric(*nodes[i], "ckptd_read_bytes_total{source=\"storage\"}");
  }
  CHECK(from_storage == 0);
}

TEST_CASE(
    "peer tier: a daemon frozen for 10 s stops counting as a copy within 5 s, and when it wakes "
    "it either rejoins (within the lease) or stays fenced from what it held (after it)",
    "[peer_tier]") {
  // Within the lease (30 s) the woken node is the same node again; after it (3 s) the coordinator
  // declared it lost, and what it held before no longer counts, though its process kept it.
  const bool fenced = GENERATE(false, true);
  Tier t(3, "1", 1, 1, {"--lease", fenced ? "3s" : "30s"});
  auto& nodes = t.nodes;
  auto& ranks = t.ranks;
  SaveCommittedThenMemoryOnly(ranks);
  const auto before = CopiesOf(t.coordinator, 2, 1);
  REQUIRE(Has(before, "n1"));
  REQUIRE(before.size() == 2);  // its node and its holder

  // SIGSTOP: the process lives and holds its memory, but answers nothing (not even the
  // coordinator's keepalive pings). The coordinator stops counting it within 5 s.
  const auto frozen_at = std::chrono::steady_clock::now();
  nodes[1]->Kill(SIGSTOP);
  REQUIRE(PollUntil([&] { return !Has(CopiesOf(t.coordinator, 2, 1), "n1"); },
                    std::chrono::seconds(20)));
  const auto noticed = std::chrono::steady_clock::now() - frozen_at;
  INFO("noticed after " << std::chrono::duration<double>(noticed).count() << " s");
  CHECK_TIMING(noticed < std::chrono::seconds(5), std::chrono::duration<double>(noticed).count()
                                                      << " s");
  {
    // Every rank still has a live copy (rank 1 on its holder): step 2 stays restorable.
    auto latest = ranks[0]->client().Latest();
    REQUIRE_OK(latest);
    CHECK(*latest == std::optional<uint64_t>(2));
  }

  // Woken up late: after 10 s frozen (the scenario's length, not a synchronisation).
  std::this_thread::sleep_until(frozen_at + std::chrono::seconds(10));
  nodes[1]->Kill(SIGCONT);

  // It reconnects by itself. Within its lease it is the same node again, holding what it held;
  // after it, the coordinator declared it lost (its steps in flight ended, its copies forgotten)
  // and what it held before does not count again, though its process kept it: fenced.
  REQUIRE(PollUntil([&] { return Connected(t.coordinator, "n1"); }, std::chrono::seconds(60)));
  const auto after = CopiesOf(t.coordinator, 2, 1);
  const bool lost = t.coordinator.Log().find("node 'n1' lost") != std::string::npos;
  CHECK(lost == fenced);
  CHECK(Has(after, "n1") == !fenced);
  CHECK(after.size() == (fenced ? 1u : 2u));

  // Its rank trains on: once every node has its holder again (a node that was lost is planned
  // afresh), a persisted step 3 on every rank commits and is replicated, and restores
  // bit-exactly on every rank.
  TrainsOn(nodes, ranks, 3);
}

TEST_CASE(
    "peer tier: a finished job's copies leave every peer pool after --peer-job-ttl, and its "
    "memory-only step stops being restorable",
    "[peer_tier]") {
  Tier t(3, "1", 1, 1, {"--peer-job-ttl", "2s"});
  auto& nodes = t.nodes;
  auto& ranks = t.ranks;
  SaveCommittedThenMemoryOnly(ranks);
  uint64_t held = 0;
  for (const auto& n : nodes) held += StatusOf(*n).peer().held_bytes();
  REQUIRE(held > 0);
  {
    // While its trainers run, an operator cannot release it either.
    auto [rc, out] = RunCkptctl(t.dir, {"--admin", t.coordinator.address(), "release-job", kJob});
    INFO(out);
    CHECK(rc == 1);
    CHECK_THAT(out, Catch::Contains("3 rank(s) registered"));
  }

  // Every trainer ends: the daemons withdraw their ranks, and 2 s later the coordinator
  // releases the job. Every holder drops what it held for the others.
  for (auto& r : ranks) r.reset();
  for (const auto& n : nodes) {
    REQUIRE(PollUntil([&] { return StatusOf(*n).peer().held_bytes() == 0; }));
  }
  // The coordinator logs the release after it told the nodes.
  CHECK(PollUntil([&] {
    return t.coordinator.Log().find("job '" + kJob + "' released") != std::string::npos;
  }));
  {
    // Step 2 is gone from the coordinator's memory: not described, not restorable.
    auto [rc, out] = RunCkptctl(t.dir, {"--admin", t.coordinator.address(), "describe", kJob, "2"});
    INFO(out);
    CHECK(rc == 1);
  }
  // The job comes back: its restore point is the persisted step, which loads.
  for (int i = 0; i < 3; ++i) {
    ranks[static_cast<size_t>(i)] = std::make_unique<ModelRank>(
        nodes[static_cast<size_t>(i)]->socket(), kJob, i, 3, 1, kTensors);
  }
  for (auto& r : ranks) {
    auto point = r->client().RestorePoint();
    REQUIRE_OK(point);
    CHECK(*point == std::optional<uint64_t>(1));
  }
  LoadEveryRankAndCheck(ranks, 1);
  {
    // A daemon is the wrong endpoint for it: it names the coordinator.
    auto [rc, out] =
        RunCkptctl(t.dir, {"--admin", "unix:" + nodes[0]->admin_socket(), "release-job", kJob});
    INFO(out);
    CHECK(rc == 1);
    CHECK_THAT(out, Catch::Contains("ckpt-coordinator"));
  }
}

}  // namespace
}  // namespace ckpt::itest
