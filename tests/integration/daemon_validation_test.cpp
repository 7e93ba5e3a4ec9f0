// A committed checkpoint always restores and is never overwritten: what the daemon refuses at
// save and at commit, with real daemon processes (the rules themselves: common/geometry.h
// CheckCoverage, common/manifest_io.h CheckManifestCoverage / ResolveReadableLatest).
#include "tests/integration/daemon_harness.h"  // first: it configures Catch

#include <chrono>
#include <string>

namespace {

using ckpt::StatusCode;
using ckpt::WaitState;
using ckpt::itest::DaemonProcess;
using ckpt::itest::InProcessRank;
using ckpt::itest::ReadLatest;
using ckpt::itest::RequireTrainerStep;
using ckpt::testing::TempDir;
using std::chrono::seconds;

constexpr seconds kWait{60};
constexpr uint64_t kBytes = 2ull << 20;

}  // namespace

TEST_CASE(
    "daemon: a step number already committed is refused after a restart, and the "
    "committed step stays intact",
    "[daemon][validation]") {
  TempDir dir;
  const uint64_t seed = ckpt::testing::TestSeed() + 51;
  const auto options = DaemonProcess::InDir(dir);
  {
    DaemonProcess first(options);
    InProcessRank rank(kBytes, 2, 0, 1, seed);
    auto client = first.Connect("again");
    REQUIRE_OK(client->Register(rank.Specs()));
    for (uint64_t step = 1; step <= 2; ++step) {
      rank.Fill(step);
      REQUIRE_OK(client->Save(step, rank.Extra(step)));
      REQUIRE_OK(client->Wait(step, WaitState::kCommitted, kWait));
    }
  }
  // A new daemon, and a trainer that restarts its numbering at step 2 with other values.
  DaemonProcess second(options);
  InProcessRank other(kBytes, 2, 0, 1, seed + 1);
  auto client = second.Connect("again");
  REQUIRE_OK(client->Register(other.Specs()));
  other.Fill(2);
  ckpt::Status st = client->Save(2, other.Extra(2));
  if (st.ok()) {
    // Accepted before the daemon had looked at storage: its writers refuse the step instead.
    st = client->Wait(2, WaitState::kCommitted, kWait);
  }
  INFO("saving committed step 2 again: " << st.ToString());
  REQUIRE_FALSE(st.ok());
  CHECK_THAT(st.message(), Catch::Contains("committed"));
  // The committed step is the first trainer's, byte for byte; LATEST still names it.
  RequireTrainerStep(second.root(), "again", 2, kBytes, 2, 1, seed);
  CHECK(ReadLatest(second.root(), "again") == 2u);
  // Later step numbers go on.
  other.Fill(3);
  REQUIRE_OK(client->Save(3, other.Extra(3)));
  REQUIRE_OK(client->Wait(3, WaitState::kCommitted, kWait));
  RequireTrainerStep(second.root(), "again", 3, kBytes, 2, 1, seed + 1);
}

TEST_CASE("daemon: latest and load skip a committed step whose MANIFEST was damaged later",
          "[daemon][validation]") {
  TempDir dir;
  const uint64_t seed = ckpt::testing::TestSeed() + 52;
  DaemonProcess daemon(DaemonProcess::InDir(dir));
  InProcessRank rank(kBytes, 2, 0, 1, seed);
  auto client = daemon.Connect("damaged");
  REQUIRE_OK(client->Register(rank.Specs()));
  for (uint64_t step = 1; step <= 2; ++step) {
    rank.Fill(step);
    REQUIRE_OK(client->Save(step, rank.Extra(step)));
    REQUIRE_OK(client->Wait(step, WaitState::kCommitted, kWait));
  }
  {
    std::ofstream truncate(ckpt::StepDir(daemon.root(), "damaged", 2) + "/MANIFEST",
                           std::ios::binary | std::ios::trunc);
    truncate << "0123456789";
  }
  auto latest = client->Latest();
  REQUIRE_OK(latest);
  CHECK(*latest == std::optional<uint64_t>(1));
  rank.Fill(99);
  auto loaded = client->Load();  // the newest step that restores
  REQUIRE_OK(loaded);
  CHECK(loaded->step == 1);
  CHECK(loaded->extra == rank.Extra(1));
  CHECK_THAT(daemon.Log(), Catch::Contains("cannot be read"));
}
