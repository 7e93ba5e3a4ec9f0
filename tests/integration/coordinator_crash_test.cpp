// Killing ckpt-coordinator at several points of a commit (and once between capture and commit):
// after it restarts, every step is either committed and loads bit-exact, or absent; LATEST names
// a committed step at every moment we can look; the job goes on committing.
//
// The crash points inside the commit are the coordinator's own (CKPT_COORDINATOR_CRASH_AT makes
// it SIGKILL itself there: before the MANIFEST rename, after it, after LATEST), so each timing
// is hit exactly rather than raced for.
// coordinator_harness.h includes daemon_harness.h first (it configures Catch).
#include "tests/integration/coordinator_harness.h"

namespace {

using ckpt::itest::CoordinatorProcess;
using ckpt::itest::ModelRank;
using ckpt::itest::StartNodes;
using ckpt::testing::TempDir;

constexpr uint32_t kWorld = 4;
constexpr uint32_t kTp = 2;
constexpr uint32_t kTensors = 4;

// LATEST, if present, names a step that has a MANIFEST.
void CheckLatestIsCommitted(const std::string& root, const std::string& job) {
  const std::string latest_path = root + "/" + job + "/LATEST";
  if (!std::filesystem::exists(latest_path)) return;
  const uint64_t latest = std::stoull(ckpt::itest::ReadWholeFile(latest_path));
  INFO("LATEST names step " << latest);
  CHECK(std::filesystem::exists(ckpt::StepDir(root, job, latest) + "/MANIFEST"));
}

// Every step directory is committed (has MANIFEST) — nothing half-written is left visible.
void CheckNoTornSteps(const std::string& root, const std::string& job) {
  for (const auto& e : std::filesystem::directory_iterator(root + "/" + job)) {
    if (!e.is_directory()) continue;
    INFO("step directory " << e.path());
    CHECK(std::filesystem::exists(e.path() / "MANIFEST"));
  }
}

void RunCrashCase(const std::string& crash_at) {
  INFO("coordinator killed at: " << crash_at);
  TempDir dir;
  const std::string root = dir / "root";
  CoordinatorProcess::Options co;
  co.socket = dir / "coord.sock";
  co.storage_root = root;
  co.log_path = dir / "coordinator.log";
  if (crash_at != "after-capture") co.env = {"CKPT_COORDINATOR_CRASH_AT=" + crash_at + ":2"};
  CoordinatorProcess coordinator(co);
  auto nodes = StartNodes(dir, root, coordinator.address(), 2);
  std::vector<std::unique_ptr<ModelRank>> ranks;
  for (uint32_t r = 0; r < kWorld; ++r) {
    ranks.push_back(
        std::make_unique<ModelRank>(nodes[r / 2]->socket(), "crash", r, kWorld, kTp, kTensors));
  }
  for (auto& r : ranks) REQUIRE_OK(r->SaveStep(1));
  for (auto& r : ranks) REQUIRE_OK(r->WaitCommitted(1));

  for (auto& r : ranks) REQUIRE_OK(r->SaveStep(2));  // captured on every rank
  if (crash_at == "after-capture") {
    coordinator.Kill();
  } else {
    const int status = coordinator.process().Wait();  // it kills itself at the crash point
    INFO(ckpt::itest::FileTail(co.log_path));
    REQUIRE(ckpt::itest::KilledBy(status, SIGKILL));
  }
  CheckLatestIsCommitted(root, "crash");

  coordinator.Restart();  // the recovery scan, then daemons reconnect and re-report
  std::optional<bool> committed;
  for (auto& r : ranks) {
    ckpt::Status st = r->WaitCommitted(2);
    INFO(st.ToString());
    REQUIRE((st.ok() || st.code() == ckpt::StatusCode::kAborted));
    if (!committed) committed = st.ok();
    CHECK(*committed == st.ok());  // every rank hears the same outcome
  }
  const std::string step2 = ckpt::StepDir(root, "crash", 2);
  if (*committed) {
    REQUIRE(std::filesystem::exists(step2 + "/MANIFEST"));
    for (auto& r : ranks) {
      auto bad = r->LoadAndCheck(2);
      REQUIRE_OK(bad);
      CHECK(*bad == 0);
    }
  } else {
    CHECK(ckpt::itest::PollUntil([&] { return !std::filesystem::exists(step2); }));
  }
  // The commit protocol's own points always complete: the step was fully persisted.
  if (crash_at != "after-capture") CHECK(*committed);
  if (crash_at == "before-manifest") {  // committed by the restarted coordinator's scan
    CHECK(coordinator.Log().find("recovery: job 'crash' step 2: committed") != std::string::npos);
  }
  CheckLatestIsCommitted(root, "crash");

  for (auto& r : ranks) REQUIRE_OK(r->SaveStep(3));
  for (auto& r : ranks) REQUIRE_OK(r->WaitCommitted(3));
  CHECK(ckpt::itest::ReadWholeFile(root + "/crash/LATEST") == "3\n");
  CheckNoTornSteps(root, "crash");
}

TEST_CASE("coordinator killed before the MANIFEST rename: the step commits after restart",
          "[coordinator][crash]") {
  RunCrashCase("before-manifest");
}

TEST_CASE(
    "coordinator killed after the MANIFEST rename, before LATEST: committed, LATEST "
    "still names a committed step",
    "[coordinator][crash]") {
  RunCrashCase("after-manifest");
}

TEST_CASE("coordinator killed after LATEST, before retention: committed", "[coordinator][crash]") {
  RunCrashCase("after-latest");
}

TEST_CASE(
    "coordinator killed between capture and commit: the step is committed or absent, "
    "never torn",
    "[coordinator][crash]") {
  RunCrashCase("after-capture");
}

}  // namespace
