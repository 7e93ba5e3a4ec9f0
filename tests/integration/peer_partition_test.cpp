// A partition, not a death (proto/README.md §4.2): a daemon whose network is cut while its
// process lives — and still writes to storage — is treated like a dead node within seconds, is
// declared lost after its lease, and when the link comes back it is fenced: nothing it did in
// the epoch that ended counts (its steps in flight end aborted, its copies no longer count, its
// queued reports are refused by epoch), and it rejoins cleanly in a new epoch. The cut is made
// with nftables rules of the test's own (net_partition.h) on loopback; without root or nft the
// test is skipped, and says so. And a holder whose data plane alone stalls, while the coordinator
// still counts it: a load fetches what it did not deliver from the file's other holders.
#include "tests/integration/peer_tier_harness.h"  // first: it configures Catch

#include <filesystem>

#include "tests/integration/net_partition.h"

namespace ckpt::itest {
namespace {

TEST_CASE(
    "peer tier: a node cut off the network while it lives counts as dead within 5 s, is fenced "
    "from what it did in the epoch that ended, and rejoins when the link comes back",
    "[peer_tier][partition]") {
  testing::TempDir dir;
  if (const std::string why = NetPartition::Unavailable(dir); !why.empty()) {
    std::cout << "CKPT-TEST-SKIPPED: [partition] " << why << std::endl;
    return;
  }
  const std::string root = dir / "root";
  // The coordinator on loopback TCP (a Unix socket cannot be cut), with a short lease.
  CoordinatorProcess coordinator(
      {dir / "coordinator.sock", root, dir / "coordinator.log", {"--lease", "3s"}, {}, true});
  const gid_t isolated = NetPartition::IsolatedGroup();
  std::vector<std::unique_ptr<DaemonProcess>> nodes;
  for (int i = 0; i < 3; ++i) {
    const std::string id = "n" + std::to_string(i);
    DaemonProcess::Options o;
    o.socket = dir / (id + ".sock");
    o.storage_root = root;
    o.log_path = dir / (id + ".log");
    o.flags = {"--node-id", id, "--coordinator", coordinator.address()};
    for (const auto& f : TierFlags("1")) o.flags.push_back(f);
    if (i == 1) o.launcher = NetPartition::LauncherFor(isolated);  // the node to cut off
    nodes.push_back(std::make_unique<DaemonProcess>(o));
  }
  WaitForHolders(nodes, 1);
  std::vector<std::unique_ptr<ModelRank>> ranks;
  for (uint32_t r = 0; r < 3; ++r) {
    ranks.push_back(std::make_unique<ModelRank>(nodes[r]->socket(), kJob, r, 3, 1, kTensors));
  }
  // Step 1 persisted, step 2 memory-only: rank 1's copies are on n1 and its holder.
  for (auto& r : ranks) REQUIRE_OK(r->SaveStep(1));
  for (auto& r : ranks) REQUIRE_OK(r->WaitCommitted(1));
  for (auto& r : ranks) REQUIRE_OK(r->SaveStep(2, /*persist=*/false));
  for (auto& r : ranks) {
    REQUIRE_OK(r->client().Wait(2, WaitState::kReplicated, std::chrono::seconds(60)));
  }
  REQUIRE(Has(CopiesOf(coordinator, 2, 1), "n1"));
  const uint64_t epoch_before = NodeOn(coordinator, "n1").epoch();
  CHECK(epoch_before > 0);

  // The cut: n1 lives, its trainer still talks to it (a Unix socket), it still reaches storage,
  // but nothing on the network hears from it. Within 5 s it is no longer a copy of anything.
  NetPartition partition(dir, isolated);
  const auto cut_at = std::chrono::steady_clock::now();
  partition.Cut();
  REQUIRE(
      PollUntil([&] { return !Has(CopiesOf(coordinator, 2, 1), "n1"); }, std::chrono::seconds(20)));
  const auto noticed = std::chrono::steady_clock::now() - cut_at;
  INFO("noticed after " << std::chrono::duration<double>(noticed).count() << " s");
  CHECK_TIMING(noticed < std::chrono::seconds(5), std::chrono::duration<double>(noticed).count()
                                                      << " s");
  CHECK_FALSE(Connected(coordinator, "n1"));
  {
    // Rank 1 still has a live copy, on its holder: step 2 stays restorable.
    auto latest = ranks[0]->client().Latest();
    REQUIRE_OK(latest);
    CHECK(*latest == std::optional<uint64_t>(2));
  }
  // After its lease it is declared lost.
  REQUIRE(PollUntil([&] { return NodeOn(coordinator, "n1").lost(); }, std::chrono::seconds(30)));
  CHECK_THAT(coordinator.Log(), Catch::Contains("node 'n1' lost"));

  // Every rank saves step 3 while n1 is cut off. n1 writes its rank to storage, which it still
  // reaches, but its reports go nowhere: the step cannot commit.
  for (auto& r : ranks) REQUIRE_OK(r->SaveStep(3));
  const std::string step3 = StepDir(root, kJob, 3);
  REQUIRE(
      PollUntil([&] { return std::filesystem::exists(step3 + "/" + NodeManifestFileName("n1")); }));
  CHECK_FALSE(std::filesystem::exists(step3 + "/MANIFEST"));

  // The link comes back. n1 registers again and hears it was fenced: its step 3, saved in the
  // epoch that ended, is aborted on every rank (not left to the step timeout), never committed,
  // and its files are removed.
  partition.Heal();
  REQUIRE(PollUntil([&] { return Connected(coordinator, "n1"); }, std::chrono::seconds(60)));
  CHECK_THAT(coordinator.Log(), Catch::Contains("node 'n1' registered again after it was "
                                                "declared lost"));
  {
    const auto n1 = NodeOn(coordinator, "n1");
    CHECK_FALSE(n1.lost());
    CHECK(n1.epoch() > epoch_before);  // a new epoch: the old one's reports are refused
  }
  for (auto& r : ranks) {
    const Status st = r->WaitCommitted(3);
    CHECK(st.code() == StatusCode::kAborted);
    CHECK_THAT(st.message(), Catch::Contains("declared lost"));
  }
  CHECK_FALSE(std::filesystem::exists(step3 + "/MANIFEST"));
  CHECK(PollUntil([&] { return !std::filesystem::exists(step3); }));
  // What n1 held of step 2 before does not count again, though its process kept it.
  CHECK_FALSE(Has(CopiesOf(coordinator, 2, 1), "n1"));

  // It rejoins cleanly, in a new epoch: once every node has its holder again, a persisted step 4
  // commits, is replicated, and restores bit-exactly on every rank.
  TrainsOn(nodes, ranks, 4);
}

TEST_CASE(
    "peer tier: a holder whose data plane stalls leaves its pieces to the file's other holders, "
    "and a replacement node restores a memory-only step all the same",
    "[peer_tier][partition]") {
  {
    testing::TempDir probe;
    if (const std::string why = NetPartition::Unavailable(probe); !why.empty()) {
      std::cout << "CKPT-TEST-SKIPPED: [partition] " << why << std::endl;
      return;
    }
  }
  // Three nodes, each node's step held by both others (--replicas 2).
  Tier t(3, "2", 2);
  SaveCommittedThenMemoryOnly(t.ranks);
  // n0 dies with its memory.
  t.ranks[0].reset();
  t.nodes[0]->Kill(SIGKILL);
  // n1's data plane goes dark while its coordinator stream (a Unix socket) goes on: the
  // coordinator still counts n1 as a holder, and as rank 1's writer, which a load's plan names
  // first for rank 1's file. The replacement gives up on a silent peer after 2 s.
  const std::string bound = ConfigValue(StatusOf(*t.nodes[1]), "peer-bound");
  const auto colon = bound.rfind(':');
  REQUIRE(colon != std::string::npos);
  NetPartition cut(t.dir, 0);
  cut.CutPort(static_cast<uint16_t>(std::stoul(bound.substr(colon + 1))));
  auto replacement = JoinTier(t, "n3", "2", {"--peer-timeout", "2s"});
  t.ranks[0] = std::make_unique<ModelRank>(replacement->socket(), kJob, 0, 3, 1, kTensors);
  REQUIRE(Has(CopiesOf(t.coordinator, 2, 1), "n1"));
  REQUIRE(Has(CopiesOf(t.coordinator, 2, 1), "n2"));

  // Every rank restores step 2 bit-exactly. The replacement holds nothing: its fetches from n1
  // (rank 1's file, and whatever pieces of the others the plan gave n1) fail, and n2, their other
  // holder, serves them. Nothing of step 2 is on storage, so a piece that no holder served would
  // have failed the load. n1 and n2 read only what their own peer pools hold for the others.
  LoadEveryRankAndCheck(t.ranks, 2);
  const double failed =
      Metric(*replacement, "ckptd_peer_requests_failed_total{reason=\"timeout\"}") +
      Metric(*replacement, "ckptd_peer_requests_failed_total{reason=\"unavailable\"}");
  CHECK(failed > 0);
  CHECK(Metric(*replacement, "ckptd_peer_bytes_total{direction=\"received\"}") > 0);
  CHECK_THAT(replacement->Log(), Catch::Contains("leaving its ranges to their other holders"));
  double from_storage = 0;
  for (const DaemonProcess* n : {t.nodes[1].get(), t.nodes[2].get(), replacement.get()}) {
    from_storage += Metric(*n, "ckptd_read_bytes_total{source=\"storage\"}");
  }
  CHECK(from_storage == 0);
  cut.Heal();
}

}  // namespace
}  // namespace ckpt::itest
