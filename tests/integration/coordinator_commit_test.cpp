// The global coordinator with real processes on loopback: three daemons (nodes n0, n1, n2),
// one ckpt-coordinator, trainer ranks of a TP=2 × DP=6 model whose data-parallel replicas span
// the nodes (coordinator_model.h). Multi-node commit, write-once and balance of replicas,
// resharded load, and a node lost in the middle of a step.
// coordinator_harness.h includes daemon_harness.h first (it configures Catch).
#include "tests/integration/coordinator_harness.h"

namespace {

using ckpt::itest::ChildProcess;
using ckpt::itest::CommittedSteps;
using ckpt::itest::CoordinatorProcess;
using ckpt::itest::DaemonProcess;
using ckpt::itest::DataFileBytes;
using ckpt::itest::ModelRank;
using ckpt::itest::NodeBytes;
using ckpt::itest::PollUntil;
using ckpt::itest::RequireBinary;
using ckpt::itest::StartNodes;
using ckpt::itest::WaitForWriterPlans;
using ckpt::testing::CoordinatorModel;
using ckpt::testing::TempDir;

constexpr uint32_t kWorld = 12;
constexpr uint32_t kTp = 2;
constexpr uint32_t kTensors = 8;
constexpr int kNodes = 3;
// Ranks 4n..4n+3 run on node n: each node holds both TP slices of two DP replicas, so every
// shard has replicas on all three nodes.
int NodeOf(uint32_t rank) { return static_cast<int>(rank / 4); }

CoordinatorProcess::Options CoordinatorIn(const TempDir& dir, std::vector<std::string> flags) {
  CoordinatorProcess::Options o;
  o.socket = dir / "coord.sock";
  o.storage_root = dir / "root";
  o.log_path = dir / "coordinator.log";
  o.flags = std::move(flags);
  return o;
}

TEST_CASE(
    "three daemons commit a TP=2 x DP=6 job, replicas written once and balanced, and "
    "it loads into 4 ranks",
    "[coordinator]") {
  TempDir dir;
  CoordinatorProcess coordinator(CoordinatorIn(dir, {}));
  auto nodes = StartNodes(dir, dir / "root", coordinator.address(), kNodes);
  const std::string rank_bin = RequireBinary("ckpt_coordinator_rank");

  // The ranks stop after step 1 until the writer plan is in force on every node: steps 2 and 3
  // are checked for writing each replica once (the plan reaches a node on its own thread, and
  // may come after step 1's commit).
  const std::string resume = dir / "resume";
  REQUIRE(::mkfifo(resume.c_str(), 0600) == 0);
  std::vector<ChildProcess> ranks;
  for (uint32_t r = 0; r < kWorld; ++r) {
    ranks.emplace_back(
        rank_bin,
        std::vector<std::string>{
            "save", "--socket", nodes[NodeOf(r)]->socket(), "--job", "tpdp", "--rank",
            std::to_string(r), "--world-size", std::to_string(kWorld), "--tp", std::to_string(kTp),
            "--tensors", std::to_string(kTensors), "--steps", "1,2,3", "--resume-fifo", resume},
        dir / ("rank" + std::to_string(r) + ".log"));
  }
  for (uint32_t r = 0; r < kWorld; ++r) {
    INFO("rank " << r << " log:\n" << ranks[r].Log());
    REQUIRE(PollUntil([&] { return ranks[r].Log().find("step 1 ") != std::string::npos; }));
  }
  std::vector<const DaemonProcess*> node_list;
  for (const auto& n : nodes) node_list.push_back(n.get());
  WaitForWriterPlans(node_list, "tpdp", std::vector<size_t>(node_list.size(), 0));
  // Open for writing until the ranks exit: each one's open for reading returns, however late.
  ckpt::UniqueFd go(::open(resume.c_str(), O_WRONLY | O_CLOEXEC));
  REQUIRE(go);
  for (uint32_t r = 0; r < kWorld; ++r) {
    const int status = ranks[r].Wait();
    INFO("rank " << r << " log:\n" << ranks[r].Log());
    REQUIRE(ckpt::itest::ExitedWith(status, 0));
    for (int step = 1; step <= 3; ++step) {
      CHECK(ranks[r].Log().find("step " + std::to_string(step) + " committed") !=
            std::string::npos);
    }
  }
  const std::string root = dir / "root";
  REQUIRE(CommittedSteps(root, "tpdp") == std::vector<uint64_t>{1, 2, 3});
  REQUIRE(ckpt::itest::ReadWholeFile(root + "/tpdp/LATEST") == "3\n");

  const uint64_t unique = CoordinatorModel::UniqueBytes(kTensors);
  for (uint64_t step = 1; step <= 3; ++step) {
    INFO("step " << step);
    auto manifest = ckpt::ReadManifest(ckpt::PosixFileSystem(), ckpt::StepDir(root, "tpdp", step));
    REQUIRE_OK(manifest);
    CHECK(manifest->ranks_size() == static_cast<int>(kWorld));
    uint64_t listed = 0;
    for (const auto& t : manifest->tensors()) {
      for (const auto& s : t.shards()) listed += s.length();
    }
    CHECK(listed == unique);  // one copy of each replica in the manifest, every step
  }
  // Step 1 was saved before the writer plan existed (every rank wrote everything); from step 2
  // on, each replicated shard is written by exactly one rank, balanced over the nodes.
  for (uint64_t step = 2; step <= 3; ++step) {
    INFO("step " << step);
    CHECK(DataFileBytes(root, "tpdp", step) == unique);
    const auto per_node = NodeBytes(root, "tpdp", step);
    REQUIRE(per_node.size() == static_cast<size_t>(kNodes));
    uint64_t lo = UINT64_MAX, hi = 0, sum = 0;
    for (const auto& [node, bytes] : per_node) {
      INFO("node " << node << " wrote " << bytes);
      lo = std::min(lo, bytes);
      hi = std::max(hi, bytes);
      sum += bytes;
    }
    CHECK(sum == unique);
    CHECK(lo > 0);
    CHECK(static_cast<double>(hi) <= 1.25 * static_cast<double>(lo));
  }
  CHECK(DataFileBytes(root, "tpdp", 1) ==
        kWorld * CoordinatorModel(kTensors, kTp, 0).total_bytes());

  // 12 ranks (TP=2) → 4 ranks (TP=4), loaded through two of the daemons.
  std::vector<ChildProcess> loaders;
  for (uint32_t r = 0; r < 4; ++r) {
    loaders.emplace_back(
        rank_bin,
        std::vector<std::string>{"load", "--socket", nodes[r % 2]->socket(), "--job", "tpdp",
                                 "--rank", std::to_string(r), "--world-size", "4", "--tp", "4",
                                 "--tensors", std::to_string(kTensors)},
        dir / ("loader" + std::to_string(r) + ".log"));
  }
  for (uint32_t r = 0; r < 4; ++r) {
    const int status = loaders[r].Wait();
    INFO("loader " << r << " log:\n" << loaders[r].Log());
    CHECK(ckpt::itest::ExitedWith(status, 0));
    CHECK(loaders[r].Log().find("loaded step 3 ") != std::string::npos);
    CHECK(loaders[r].Log().find("mismatches 0 ") != std::string::npos);
  }
}

TEST_CASE(
    "a daemon killed mid-step aborts the step on every node naming the missing ranks, and "
    "later steps commit once it returns",
    "[coordinator]") {
  TempDir dir;
  CoordinatorProcess coordinator(CoordinatorIn(dir, {"--lease", "500ms"}));
  auto nodes = StartNodes(dir, dir / "root", coordinator.address(), kNodes);
  const std::string root = dir / "root";
  auto connect_all = [&](std::vector<std::unique_ptr<ModelRank>>& ranks) {
    ranks.clear();
    for (uint32_t r = 0; r < kWorld; ++r) {
      ranks.push_back(std::make_unique<ModelRank>(nodes[NodeOf(r)]->socket(), "lost", r, kWorld,
                                                  kTp, kTensors));
    }
  };
  std::vector<std::unique_ptr<ModelRank>> ranks;
  connect_all(ranks);
  for (auto& r : ranks) REQUIRE_OK(r->SaveStep(1));
  for (auto& r : ranks) REQUIRE_OK(r->WaitCommitted(1));

  // Step 2: the ranks of n0 and n1 save it; then n2's daemon dies before its ranks do.
  for (uint32_t r = 0; r < 8; ++r) REQUIRE_OK(ranks[r]->SaveStep(2));
  for (uint32_t r = 8; r < kWorld; ++r) ranks[r].reset();  // their daemon is about to die
  nodes[2]->Kill();
  for (uint32_t r = 0; r < 8; ++r) {
    ckpt::Status st = ranks[r]->WaitCommitted(2);
    INFO("rank " << r << ": " << st.ToString());
    REQUIRE(st.code() == ckpt::StatusCode::kAborted);
    CHECK(st.message().find("node 'n2'") != std::string::npos);
    CHECK(st.message().find("missing ranks") != std::string::npos);
    CHECK(st.message().find("[8, 9, 10, 11]") != std::string::npos);
  }
  // Its data is removed; step 1 is untouched and still the newest committed step.
  CHECK(ckpt::itest::PollUntil(
      [&] { return !std::filesystem::exists(ckpt::StepDir(root, "lost", 2)); }));
  CHECK(CommittedSteps(root, "lost") == std::vector<uint64_t>{1});

  // n2 returns (same node id, a new process); the next steps commit on all three nodes.
  {
    ckpt::itest::DaemonProcess::Options o = nodes[2]->options();
    nodes[2].reset();
    nodes[2] = std::make_unique<ckpt::itest::DaemonProcess>(o);
  }
  for (uint32_t r = 8; r < kWorld; ++r) {
    ranks[r] = std::make_unique<ModelRank>(nodes[2]->socket(), "lost", r, kWorld, kTp, kTensors);
  }
  for (uint64_t step = 3; step <= 4; ++step) {
    for (auto& r : ranks) REQUIRE_OK(r->SaveStep(step));
    for (auto& r : ranks) REQUIRE_OK(r->WaitCommitted(step));
  }
  CHECK(CommittedSteps(root, "lost") == std::vector<uint64_t>{1, 3, 4});
  auto latest = ranks[5]->client().Latest();  // answered by the coordinator
  REQUIRE_OK(latest);
  CHECK(*latest == std::optional<uint64_t>(4));
  auto bad = ranks[9]->LoadAndCheck(4);
  REQUIRE_OK(bad);
  CHECK(*bad == 0);
  CHECK(coordinator.Log().find("node 'n2' lost") != std::string::npos);
}

}  // namespace
