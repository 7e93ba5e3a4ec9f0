// Chaos on the storage side, with a real daemon whose filesystem injects faults
// (common/fault_file_system.h) that the test turns on and off while it runs, through the
// "control=FILE" spec:
//   * random steps of a 2-rank job meet ENOSPC after a random number of bytes, EIO on a write,
//     EIO on fdatasync, or short writes. A failing step fails on every rank with the OS error
//     and its step number; training goes on (the same trainer processes); older steps stay
//     intact; the next step, with the fault lifted ("space returns"), commits. Short writes are
//     not an error: the writer completes them, and the step commits bit-exact.
//   * a storage write that stalls (a hung PFS server) does not hold up save() and
//     wait_snapshot() of later steps, which flush past it; waiting for the stalled step reports
//     a timeout naming it; once the write is released everything commits, in step order.
// Default: 30 cycles. CKPT_CHAOS_CYCLES / CKPT_CHAOS_SEED as in chaos_kill_test.cpp; the two
// stall tests read CKPT_CHAOS_SEED too (it fills their tensors) and print their seed.
#include "tests/integration/chaos_harness.h"  // first: it configures Catch

#include <sys/stat.h>

#include <filesystem>
#include <fstream>

namespace {

using namespace ckpt::itest;         // NOLINT: test helpers
using namespace ckpt::itest::chaos;  // NOLINT
using ckpt::testing::TempDir;
using std::chrono::seconds;

// Replaces the control file atomically (the daemon may read it at any moment).
void WriteFaults(const std::string& control, const std::string& spec) {
  const std::string tmp = control + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << spec;
  }
  std::filesystem::rename(tmp, control);
}

struct Fault {
  std::string spec;            // without the path
  std::string expected_error;  // "" = the step commits
};

}  // namespace

TEST_CASE("chaos: random ENOSPC or EIO or short writes fail only their step while training goes on",
          "[chaos]") {
  const uint64_t seed = ChaosSeed();
  const uint64_t cycles = EnvNumber("CKPT_CHAOS_CYCLES", 30);
  INFO("chaos seed " << seed << " (repeat with CKPT_CHAOS_SEED=" << seed << ")");
  std::mt19937_64 rng(seed);
  auto uniform = [&](uint64_t n) { return std::uniform_int_distribution<uint64_t>(0, n - 1)(rng); };

  TempDir dir;
  const std::string control = dir / "faults";
  WriteFaults(control, "");
  auto options = DaemonProcess::InDir(dir);
  options.slot_size = "128KiB";  // several writes per step: faults land at different points
  options.checksum_chunk = "64KiB";
  options.flags = {"--keep", "4"};
  options.env = {"CKPTD_FAULT_INJECTION=control=" + control};
  DaemonProcess daemon(options);

  ChaosJob job;
  job.job = "storage";
  job.world_size = 2;
  job.bytes_per_rank = 512 << 10;
  job.seed = seed;
  std::vector<std::unique_ptr<ChaosTrainer>> ranks;
  for (uint32_t r = 0; r < job.world_size; ++r) {
    ranks.push_back(std::make_unique<ChaosTrainer>(
        job.TrainerArgs(daemon.socket(), r), dir / ("trainer-" + std::to_string(r) + ".log")));
    REQUIRE(RequireRestored(ranks.back()->NextLine()) == std::nullopt);
  }
  const uint64_t step_bytes = job.world_size * job.bytes_per_rank;

  uint64_t injected = 0, failed = 0, committed = 0, short_committed = 0;
  bool previous_failed = false;
  for (uint64_t step = 1; step <= cycles; ++step) {
    INFO("step " << step);
    std::optional<Fault> fault;
    // Never two failing steps in a row: the step after a failure shows that space came back.
    if (!previous_failed && uniform(100) < 50) {
      switch (uniform(4)) {
        case 0:
          fault = Fault{"enospc-after=" + std::to_string(uniform(step_bytes)),
                        "No space left on device"};
          break;
        case 1:
          fault = Fault{"eio-write=" + std::to_string(1 + uniform(3)), "Input/output error"};
          break;
        case 2:
          fault = Fault{"eio-sync", "Input/output error"};
          break;
        default:
          fault = Fault{"short-writes", ""};
          break;
      }
      ++injected;
    }
    const std::string spec =
        fault ? fault->spec + ",path=" + ckpt::StepDirName(step) : std::string();
    INFO("faults: '" << spec << "'");
    WriteFaults(control, spec);
    for (auto& r : ranks) r->Send("save " + std::to_string(step));
    std::vector<std::string> replies;
    for (auto& r : ranks) replies.push_back(r->NextLine());
    WriteFaults(control, "");  // space returns

    const bool expect_failure = fault && !fault->expected_error.empty();
    for (const std::string& reply : replies) {
      INFO("reply: " << reply);
      REQUIRE(reply.rfind("done " + std::to_string(step) + " ", 0) == 0);
      if (!expect_failure) {
        REQUIRE(reply.ends_with(" ok"));
      }
    }
    // An eio-write beyond the step's last write, or an ENOSPC limit the step stayed under, may
    // leave the step whole: then it must have committed on every rank.
    const bool all_ok = std::all_of(replies.begin(), replies.end(),
                                    [](const std::string& r) { return r.ends_with(" ok"); });
    if (expect_failure && !all_ok) {
      for (const std::string& reply : replies) {
        INFO("reply: " << reply);
        CHECK_THAT(reply, Catch::Contains(fault->expected_error));
        CHECK_THAT(reply, Catch::Contains("step " + std::to_string(step)));
      }
      REQUIRE(!PathExists(ckpt::StepDir(daemon.root(), job.job, step) + "/MANIFEST"));
      ++failed;
      previous_failed = true;
    } else {
      REQUIRE(all_ok);
      ++committed;
      if (fault) ++short_committed;
      previous_failed = false;
      REQUIRE(ReadLatest(daemon.root(), job.job) == step);
    }
    REQUIRE(daemon.Alive());
    if (fault) RequireCommittedStepsIntact(daemon.root(), job, 4, /*newest=*/true);
  }
  // A last step with no fault commits.
  for (auto& r : ranks) r->Send("save " + std::to_string(cycles + 1));
  for (auto& r : ranks) REQUIRE(r->NextLine() == "done " + std::to_string(cycles + 1) + " ok");
  RequireNoUncommittedSteps(daemon.root(), job.job);
  RequireCommittedStepsIntact(daemon.root(), job, 4, /*newest=*/true);
  for (auto& r : ranks) REQUIRE(ExitedWith(r->Finish(), 0));
  REQUIRE(daemon.Alive());
  REQUIRE_THAT(daemon.Log(), Catch::Contains("fault injection: faults now"));
  std::cout << "chaos storage: " << cycles << " steps, " << injected << " faults injected, "
            << failed << " steps failed with the OS error, " << committed << " committed ("
            << short_committed << " through injected faults that did not fail them)\n";
  CHECK(failed > 0);
}

TEST_CASE(
    "chaos: a stalled storage write holds up neither save() nor wait_snapshot() of later "
    "steps and is reported",
    "[chaos]") {
  // The seed fills the tensors only (the schedule is fixed); a fixed default, as before.
  const uint64_t seed = ChaosSeed(/*fallback=*/ckpt::testing::TestSeed() + 90);
  INFO("chaos seed " << seed << " (repeat with CKPT_CHAOS_SEED=" << seed << ")");
  TempDir dir;
  const std::string fifo = dir / "release";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  auto options = DaemonProcess::InDir(dir);
  options.env = {"CKPTD_FAULT_INJECTION=stall-write=1,stall-release=" + fifo +
                 ",path=" + ckpt::StepDirName(2)};
  DaemonProcess daemon(options);
  constexpr uint64_t kBytes = 2ull << 20;
  InProcessRank rank(kBytes, 2, 0, 1, seed);
  auto client = daemon.Connect("stall");
  REQUIRE_OK(client->Register(rank.Specs()));

  rank.Fill(1);
  REQUIRE_OK(client->Save(1, rank.Extra(1)));
  REQUIRE_OK(client->WaitSnapshot(seconds(60)));
  REQUIRE_OK(client->Wait(1, ckpt::WaitState::kCommitted, seconds(60)));

  // Step 2's first write stalls. Its capture completes all the same (the pool holds it).
  rank.Fill(2);
  REQUIRE_OK(client->Save(2, rank.Extra(2)));
  REQUIRE_OK(client->WaitSnapshot(seconds(60)));
  REQUIRE(
      PollUntil([&] { return daemon.Log().find("stalls until released") != std::string::npos; }));

  // Later steps: save() and wait_snapshot() return, their data reaches storage past the stall
  // (8 writer threads, a 64 MiB pool: far from its backpressure).
  for (uint64_t step = 3; step <= 6; ++step) {
    INFO("step " << step << " behind the stalled step 2");
    rank.Fill(step);
    REQUIRE_OK(client->Save(step, rank.Extra(step)));
    REQUIRE_OK(client->WaitSnapshot(seconds(60)));
  }
  REQUIRE_OK(client->Wait(6, ckpt::WaitState::kPersisted, seconds(60)));

  // The stalled step is reported: waiting for it times out naming it; it is not committed, and
  // neither is anything after it (commits go in step order), so LATEST still names step 1.
  const ckpt::Status stalled = client->Wait(2, ckpt::WaitState::kCommitted, seconds(1));
  INFO("wait for the stalled step: " << stalled.ToString());
  REQUIRE(stalled.code() == ckpt::StatusCode::kDeadlineExceeded);
  CHECK_THAT(stalled.message(), Catch::Contains("step 2"));
  REQUIRE(ReadLatest(daemon.root(), "stall") == 1u);
  REQUIRE(daemon.Alive());

  // Release the write (opening the FIFO for writing wakes the stalled reader): all commit.
  {
    const int fd = ::open(fifo.c_str(), O_WRONLY | O_CLOEXEC);
    REQUIRE(fd >= 0);
    ::close(fd);
  }
  REQUIRE_OK(client->Wait(6, ckpt::WaitState::kCommitted, seconds(60)));
  REQUIRE(ReadLatest(daemon.root(), "stall") == 6u);
  REQUIRE(CommittedSteps(daemon.root(), "stall") == std::vector<uint64_t>{1, 2, 3, 4, 5, 6});
  for (uint64_t step = 1; step <= 6; ++step) {
    RequireTrainerStep(daemon.root(), "stall", step, kBytes, 2, 1, seed);
  }
  CHECK_THAT(daemon.Log(), Catch::Contains("released"));
}

TEST_CASE(
    "chaos: with storage stalled and the pool full, saves are skipped at once, and resume "
    "when it answers",
    "[chaos]") {
  const uint64_t seed = ChaosSeed(/*fallback=*/ckpt::testing::TestSeed() + 91);
  INFO("chaos seed " << seed << " (repeat with CKPT_CHAOS_SEED=" << seed << ")");
  TempDir dir;
  const std::string fifo = dir / "release";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  auto options = DaemonProcess::InDir(dir);
  // One writer thread and a pool of four 4 MiB slots: the stalled write of step 2 holds the
  // writer, and what is captured after it queues up in the pool until the pool is full.
  options.host_pool = "16MiB";
  options.flags = {"--flush-threads", "1", "--storage-stall-timeout", "1s"};
  options.env = {"CKPTD_FAULT_INJECTION=stall-write=1,stall-release=" + fifo +
                 ",path=" + ckpt::StepDirName(2)};
  DaemonProcess daemon(options);
  constexpr uint64_t kBytes = 4ull << 20;
  InProcessRank rank(kBytes, 1, 0, 1, seed);
  auto client = daemon.Connect("stalled-pool");
  REQUIRE_OK(client->Register(rank.Specs()));
  rank.Fill(1);
  REQUIRE_OK(client->Save(1, rank.Extra(1)));
  REQUIRE_OK(client->WaitSnapshot(seconds(60)));
  REQUIRE_OK(client->Wait(1, ckpt::WaitState::kCommitted, seconds(60)));

  // Saves go on into the pool until it is full; then the step that cannot get space fails
  // (its capture gives up once storage is stalled), and later saves are skipped at once.
  std::vector<uint64_t> captured;
  uint64_t step = 2;
  ckpt::Status skipped;
  for (; step < 12; ++step) {
    rank.Fill(step);
    ckpt::Status saved = client->Save(step, rank.Extra(step));
    if (!saved.ok()) {
      skipped = saved;
      break;
    }
    ckpt::Status fenced = client->WaitSnapshot(seconds(60));
    if (fenced.ok()) {
      captured.push_back(step);
    } else {
      // The step failed (its capture gave up on the pool): the fence returns at once.
      INFO("fence of step " << step << ": " << fenced.ToString());
      CHECK_THAT(fenced.message(), Catch::Contains("storage stalled"));
    }
  }
  INFO("captured before the pool filled: " << captured.size() << "; stopped at step " << step);
  REQUIRE(!skipped.ok());
  CHECK(skipped.code() == ckpt::StatusCode::kResourceExhausted);
  CHECK_THAT(skipped.message(), Catch::Contains("storage stalled") && Catch::Contains("skipped"));
  REQUIRE(!captured.empty());
  CHECK(captured.front() == 2);

  // Storage answers again: what was captured commits, and so do new steps.
  {
    const int fd = ::open(fifo.c_str(), O_WRONLY | O_CLOEXEC);
    REQUIRE(fd >= 0);
    ::close(fd);
  }
  REQUIRE_OK(client->Wait(captured.back(), ckpt::WaitState::kCommitted, seconds(60)));
  const uint64_t next = step + 1;
  rank.Fill(next);
  REQUIRE_OK(client->Save(next, rank.Extra(next)));  // nothing is in flight: not stalled
  REQUIRE_OK(client->WaitSnapshot(seconds(60)));
  REQUIRE_OK(client->Wait(next, ckpt::WaitState::kCommitted, seconds(60)));
  for (uint64_t s : captured)
    RequireTrainerStep(daemon.root(), "stalled-pool", s, kBytes, 1, 1, seed);
  RequireTrainerStep(daemon.root(), "stalled-pool", next, kBytes, 1, 1, seed);
  CHECK(!PathExists(ckpt::StepDir(daemon.root(), "stalled-pool", step) + "/MANIFEST"));
}
