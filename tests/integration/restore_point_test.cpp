// Every rank of a restarted job restores the same step, with real processes: the restart race
// forced. A step of the previous trainers is captured and its write stalls (the fault file
// system holds it, like a hung PFS server); the trainers exit, and the daemon commits that step
// once the write completes — by design, since its bytes are safe. The new trainers' rank 0
// restores while the write is held; the write is released and the step commits; then rank 1
// restores. Both must restore the same step (the one before), through the daemon's embedded
// coordinator and through ckpt-coordinator alike; the next restart restores the newest.
// coordinator_harness.h includes daemon_harness.h first (it configures Catch).
#include "tests/integration/coordinator_harness.h"

#include <fcntl.h>
#include <sys/stat.h>

namespace {

using ckpt::itest::CoordinatorProcess;
using ckpt::itest::DaemonProcess;
using ckpt::itest::ModelRank;
using ckpt::itest::PollUntil;
using ckpt::testing::TempDir;

constexpr uint32_t kWorld = 2;
constexpr uint32_t kTensors = 3;
const char* kJob = "restart";

std::vector<std::unique_ptr<ModelRank>> StartRanks(const std::string& socket) {
  std::vector<std::unique_ptr<ModelRank>> ranks;
  for (uint32_t r = 0; r < kWorld; ++r) {
    ranks.push_back(std::make_unique<ModelRank>(socket, kJob, r, kWorld, 1, kTensors));
  }
  return ranks;
}

}  // namespace

TEST_CASE(
    "restore point: a step of the previous trainers that commits between two ranks' loads is "
    "restored by neither",
    "[restore_point]") {
  const bool with_coordinator = GENERATE(false, true);
  INFO((with_coordinator ? "ckpt-coordinator" : "embedded coordinator"));
  TempDir dir;
  const std::string fifo = dir / "release";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  std::unique_ptr<CoordinatorProcess> coordinator;
  auto options = DaemonProcess::InDir(dir);
  if (with_coordinator) {
    CoordinatorProcess::Options c;
    c.socket = dir / "coord.sock";
    c.storage_root = options.storage_root;
    c.log_path = dir / "coordinator.log";
    coordinator = std::make_unique<CoordinatorProcess>(c);
    options.flags = {"--node-id", "n0", "--coordinator", coordinator->address()};
  }
  // The first data write of step 3 stalls until the FIFO is opened.
  options.env = {"CKPTD_FAULT_INJECTION=stall-write=1,stall-release=" + fifo +
                 ",path=" + ckpt::StepDirName(3)};
  DaemonProcess daemon(options);

  {
    auto ranks = StartRanks(daemon.socket());
    for (uint64_t step = 1; step <= 3; ++step) {
      for (auto& r : ranks) REQUIRE_OK(r->SaveStep(step));
    }
    for (auto& r : ranks) REQUIRE_OK(r->WaitCommitted(2));
    REQUIRE(
        PollUntil([&] { return daemon.Log().find("stalls until released") != std::string::npos; }));
  }  // the trainers exit with step 3 captured: the daemon commits it once its write completes

  auto ranks = StartRanks(daemon.socket());
  auto first = ranks[0]->LoadRestorePointAndCheck();
  REQUIRE_OK(first);
  CHECK(first->step == 2);
  CHECK(first->mismatches == 0);

  {
    const int fd = ::open(fifo.c_str(), O_WRONLY | O_CLOEXEC);
    REQUIRE(fd >= 0);
    ::close(fd);
  }
  REQUIRE(PollUntil([&] {
    auto latest = ranks[1]->client().Latest();
    return latest.ok() && *latest == std::optional<uint64_t>(3);
  }));

  auto second = ranks[1]->LoadRestorePointAndCheck();
  REQUIRE_OK(second);
  CHECK(second->step == first->step);
  CHECK(second->mismatches == 0);

  // Step 3 is committed: training goes on after it (a committed step is never saved again).
  const ckpt::Status again = ranks[0]->SaveStep(3);
  CHECK(again.code() == ckpt::StatusCode::kFailedPrecondition);
  for (auto& r : ranks) REQUIRE_OK(r->SaveStep(4));
  for (auto& r : ranks) REQUIRE_OK(r->WaitCommitted(4));
  ranks.clear();

  // The next restart resolves anew: both ranks restore step 4.
  ranks = StartRanks(daemon.socket());
  for (auto& r : ranks) {
    auto restored = r->LoadRestorePointAndCheck();
    REQUIRE_OK(restored);
    CHECK(restored->step == 4);
    CHECK(restored->mismatches == 0);
  }
}
