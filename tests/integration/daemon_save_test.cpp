// The daemon's save path with real processes (the "node daemon" acceptance list): trainer
// processes and in-process ranks save through a real ckptd into a temporary storage root, and
// what lands on disk is read back with CheckpointReader and compared with trainer_data.h.
#include "tests/integration/daemon_harness.h"  // first: it configures Catch

#include <chrono>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

namespace {

namespace pb = ::ckptd::v1;
using ckpt::Shape;
using ckpt::UniqueFd;
using ckpt::itest::ChildProcess;
using ckpt::itest::CommittedSteps;
using ckpt::itest::DaemonProcess;
using ckpt::itest::DescribeWaitStatus;
using ckpt::itest::ExitedWith;
using ckpt::itest::FileTail;
using ckpt::itest::InProcessRank;
using ckpt::itest::PathExists;
using ckpt::itest::RawConnection;
using ckpt::itest::ReadLatest;
using ckpt::itest::RequireTrainerStep;
using ckpt::itest::TrainerRun;
using ckpt::testing::TempDir;

std::string ManifestOf(const std::string& root, const std::string& job, uint64_t step) {
  return ckpt::StepDir(root, job, step) + "/MANIFEST";
}

// `ckptctl verify <stepdir>` must exit 0 (skipped with a warning while ckptctl is not built).
void VerifyWithCkptctl(const TempDir& dir, const std::string& step_dir) {
  const std::string ckptctl = ckpt::itest::FindBinary("ckptctl");
  if (ckptctl.empty()) {
    WARN("ckptctl not found in " << ckpt::itest::BinDir() << ": skipping `ckptctl verify`");
    return;
  }
  const std::string log =
      dir / ("ckptctl-" + std::filesystem::path(step_dir).filename().string() + ".log");
  ChildProcess p(ckptctl, {"verify", step_dir}, log);
  const int status = p.Wait();
  INFO("ckptctl verify " << step_dir << " " << DescribeWaitStatus(status) << ":\n"
                         << FileTail(log));
  REQUIRE(ExitedWith(status, 0));
}

}  // namespace

TEST_CASE("daemon: four trainer processes commit three steps, every byte read back exact",
          "[daemon]") {
  TempDir dir;
  DaemonProcess daemon(DaemonProcess::InDir(dir));
  const uint64_t seed = ckpt::testing::TestSeed();
  INFO("seed " << seed);
  constexpr uint32_t kWorld = 4;
  constexpr uint64_t kBytes = 4ull << 20;
  constexpr uint32_t kTensors = 4;

  std::vector<ChildProcess> trainers;
  std::vector<std::string> logs;
  for (uint32_t r = 0; r < kWorld; ++r) {
    TrainerRun run;
    run.socket = daemon.socket();
    run.job = "llm";
    run.rank = r;
    run.world_size = kWorld;
    run.steps = 3;
    run.tensors = kTensors;
    run.bytes_per_rank = kBytes;
    run.seed = seed;
    logs.push_back(dir / ("trainer-" + std::to_string(r) + ".log"));
    trainers.push_back(ckpt::itest::StartTrainer(run.Args(), logs.back()));
  }
  for (uint32_t r = 0; r < kWorld; ++r) {
    const int status = trainers[r].Wait();
    INFO("trainer rank " << r << " " << DescribeWaitStatus(status) << ":\n" << FileTail(logs[r]));
    REQUIRE(ExitedWith(status, 0));
  }

  REQUIRE(CommittedSteps(daemon.root(), "llm") == std::vector<uint64_t>{1, 2, 3});
  REQUIRE(ReadLatest(daemon.root(), "llm") == 3u);
  for (uint64_t step = 1; step <= 3; ++step) {
    INFO("step " << step);
    REQUIRE(PathExists(ManifestOf(daemon.root(), "llm", step)));
    RequireTrainerStep(daemon.root(), "llm", step, kBytes, kTensors, kWorld, seed);
    VerifyWithCkptctl(dir, ckpt::StepDir(daemon.root(), "llm", step));
  }
}

TEST_CASE("daemon: --keep 2 leaves exactly the two newest committed steps", "[daemon]") {
  TempDir dir;
  auto options = DaemonProcess::InDir(dir);
  options.flags = {"--keep", "2"};
  DaemonProcess daemon(options);
  const uint64_t seed = ckpt::testing::TestSeed() + 1;

  TrainerRun run;
  run.socket = daemon.socket();
  run.job = "kept";
  run.steps = 4;
  run.tensors = 2;
  run.bytes_per_rank = 2ull << 20;
  run.seed = seed;
  ckpt::itest::RequireTrainerSucceeds(run, dir / "trainer.log");

  REQUIRE(CommittedSteps(daemon.root(), "kept") == std::vector<uint64_t>{3, 4});
  REQUIRE(ckpt::itest::AllStepDirs(daemon.root(), "kept") == std::vector<uint64_t>{3, 4});
  REQUIRE(ReadLatest(daemon.root(), "kept") == 4u);
  RequireTrainerStep(daemon.root(), "kept", 3, run.bytes_per_rank, run.tensors, 1, seed);
  RequireTrainerStep(daemon.root(), "kept", 4, run.bytes_per_rank, run.tensors, 1, seed);
}

TEST_CASE("daemon: a state larger than the host pool streams through it and commits exact",
          "[daemon]") {
  TempDir dir;
  auto options = DaemonProcess::InDir(dir);
  options.host_pool = "16MiB";
  options.slot_size = "4MiB";
  DaemonProcess daemon(options);
  const uint64_t seed = ckpt::testing::TestSeed() + 2;
  constexpr uint32_t kWorld = 2;
  constexpr uint64_t kBytes = 48ull << 20;  // per rank: 96 MiB through a 16 MiB pool
  constexpr uint32_t kTensors = 3;          // 16 MiB each: one shard fills the whole pool

  std::vector<ChildProcess> trainers;
  std::vector<std::string> logs;
  for (uint32_t r = 0; r < kWorld; ++r) {
    TrainerRun run;
    run.socket = daemon.socket();
    run.job = "big";
    run.rank = r;
    run.world_size = kWorld;
    run.steps = 1;
    run.tensors = kTensors;
    run.bytes_per_rank = kBytes;
    run.seed = seed;
    logs.push_back(dir / ("trainer-" + std::to_string(r) + ".log"));
    trainers.push_back(ckpt::itest::StartTrainer(run.Args(), logs.back()));
  }
  for (uint32_t r = 0; r < kWorld; ++r) {
    const int status = trainers[r].Wait();
    INFO("trainer rank " << r << " " << DescribeWaitStatus(status) << ":\n" << FileTail(logs[r]));
    REQUIRE(ExitedWith(status, 0));
  }
  REQUIRE(ReadLatest(daemon.root(), "big") == 1u);
  RequireTrainerStep(daemon.root(), "big", 1, kBytes, kTensors, kWorld, seed);
}

TEST_CASE("daemon: save() of a 64 MiB tensor returns before the bytes are copied", "[daemon]") {
  TempDir dir;
  DaemonProcess daemon(DaemonProcess::InDir(dir));
  const uint64_t seed = ckpt::testing::TestSeed() + 3;
  InProcessRank rank(64ull << 20, 1, 0, 1, seed);
  auto client = daemon.Connect("fast");
  const auto specs = rank.Specs();
  REQUIRE_OK(client->Register(specs));
  rank.Fill(1);

  const auto start = std::chrono::steady_clock::now();
  const ckpt::Status saved = client->Save(1, rank.Extra(1));
  const auto took = std::chrono::steady_clock::now() - start;
  REQUIRE_OK(saved);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(took).count();
  // Only a loose sanity bound: Save must not copy or write the 64 MiB before it returns (not
  // asserted under a sanitizer: test_util.h).
  CHECK_TIMING(ms < 100, "Save of 64 MiB took " << ms << " ms");

  REQUIRE_OK(client->WaitSnapshot(std::chrono::seconds(60)));
  REQUIRE_OK(client->Wait(1, ckpt::WaitState::kCommitted, std::chrono::seconds(60)));
  RequireTrainerStep(daemon.root(), "fast", 1, 64ull << 20, 1, 1, seed);
}

TEST_CASE("daemon: an unchanged re-registration is accepted as such, a changed one is applied",
          "[daemon]") {
  TempDir dir;
  DaemonProcess daemon(DaemonProcess::InDir(dir));
  constexpr uint64_t kBytes = 1ull << 20;
  UniqueFd memfd(::memfd_create("rereg", MFD_CLOEXEC));
  REQUIRE(memfd);
  REQUIRE(::ftruncate(memfd.get(), kBytes) == 0);
  auto write_pattern = [&](uint32_t salt) {
    std::vector<uint32_t> words(kBytes / 4);
    for (uint32_t i = 0; i < words.size(); ++i) words[i] = i * 2654435761u ^ salt;
    REQUIRE(::pwrite(memfd.get(), words.data(), kBytes, 0) == static_cast<ssize_t>(kBytes));
    return words;
  };
  const int fds[] = {memfd.get()};

  RawConnection conn(daemon.socket());
  const pb::DaemonMessage hello = conn.Hello("rereg");
  REQUIRE(hello.has_hello());

  pb::ClientMessage reg;
  *reg.mutable_register_()->add_tensors() =
      ckpt::itest::HostSpec("w", "int32", {256, 1024}, 0, kBytes);
  const pb::DaemonMessage first = conn.Call(reg, fds);
  INFO(first.ShortDebugString());
  REQUIRE(first.has_register_());
  CHECK(!first.register_().unchanged());
  CHECK(first.register_().tensors() == 1);
  CHECK(first.register_().bytes() == kBytes);

  // The same set again, the same memfd passed again: the daemon reuses its plan.
  const pb::DaemonMessage again = conn.Call(reg, fds);
  INFO(again.ShortDebugString());
  REQUIRE(again.has_register_());
  CHECK(again.register_().unchanged());
  CHECK(again.register_().bytes() == kBytes);

  auto save_and_commit = [&](uint64_t step) {
    pb::ClientMessage save;
    save.mutable_save()->set_step(step);
    const pb::DaemonMessage saved = conn.Call(save);
    INFO(saved.ShortDebugString());
    REQUIRE(saved.has_save());
    pb::ClientMessage wait;
    wait.mutable_wait()->set_step(step);
    wait.mutable_wait()->set_state(pb::STEP_STATE_COMMITTED);
    const pb::DaemonMessage waited = conn.Call(wait);
    INFO(waited.ShortDebugString() << "\ndaemon log:\n" << daemon.LogTail());
    REQUIRE(waited.has_wait());
  };
  const std::vector<uint32_t> step1 = write_pattern(1);
  save_and_commit(1);

  // A different shape over the same memory: a new plan.
  pb::ClientMessage changed;
  *changed.mutable_register_()->add_tensors() =
      ckpt::itest::HostSpec("w", "int32", {128, 1024}, 0, kBytes / 2);
  const pb::DaemonMessage applied = conn.Call(changed, fds);
  INFO(applied.ShortDebugString());
  REQUIRE(applied.has_register_());
  CHECK(!applied.register_().unchanged());
  CHECK(applied.register_().bytes() == kBytes / 2);
  const std::vector<uint32_t> step2 = write_pattern(2);
  save_and_commit(2);

  Shape shape;
  auto bytes1 = ckpt::itest::ReadWholeTensor(ckpt::StepDir(daemon.root(), "rereg", 1), "w", &shape);
  CHECK(shape == Shape{256, 1024});
  REQUIRE(bytes1.size() == kBytes);
  CHECK(std::memcmp(bytes1.data(), step1.data(), kBytes) == 0);
  auto bytes2 = ckpt::itest::ReadWholeTensor(ckpt::StepDir(daemon.root(), "rereg", 2), "w", &shape);
  CHECK(shape == Shape{128, 1024});
  REQUIRE(bytes2.size() == kBytes / 2);
  CHECK(std::memcmp(bytes2.data(), step2.data(), kBytes / 2) == 0);

  // The C++ client too: re-registering the same tensors is OK, a changed shape takes effect.
  const uint64_t seed = ckpt::testing::TestSeed() + 4;
  auto client = daemon.Connect("rereg-client");
  InProcessRank big(2ull << 20, 2, 0, 1, seed);
  InProcessRank small(1ull << 20, 2, 0, 1, seed);
  REQUIRE_OK(client->Register(big.Specs()));
  REQUIRE_OK(client->Register(big.Specs()));
  big.Fill(1);
  REQUIRE_OK(client->Save(1, big.Extra(1)));
  REQUIRE_OK(client->Wait(1, ckpt::WaitState::kCommitted, std::chrono::seconds(60)));
  REQUIRE_OK(client->Register(small.Specs()));
  small.Fill(2);
  REQUIRE_OK(client->Save(2, small.Extra(2)));
  REQUIRE_OK(client->Wait(2, ckpt::WaitState::kCommitted, std::chrono::seconds(60)));
  RequireTrainerStep(daemon.root(), "rereg-client", 1, 2ull << 20, 2, 1, seed);
  RequireTrainerStep(daemon.root(), "rereg-client", 2, 1ull << 20, 2, 1, seed);
}

namespace {

bool HasManifest(const std::string& root, const std::string& job, uint64_t step) {
  return PathExists(ckpt::StepDir(root, job, step) + "/" + std::string(ckpt::kManifestFileName));
}

}  // namespace

TEST_CASE("daemon: steps in flight commit in step order", "[daemon]") {
  TempDir dir;
  DaemonProcess daemon(DaemonProcess::InDir(dir));
  const uint64_t seed = ckpt::testing::TestSeed() + 5;
  InProcessRank rank0(4ull << 20, 2, 0, 2, seed), rank1(4ull << 20, 2, 1, 2, seed);
  auto c0 = daemon.Connect("order", 0, 2);
  auto c1 = daemon.Connect("order", 1, 2);
  REQUIRE_OK(c0->Register(rank0.Specs()));
  REQUIRE_OK(c1->Register(rank1.Specs()));

  // Rank 0 saves steps 1 and 2; rank 1 saves only step 2 for now. Step 2 is then persisted on
  // every rank while step 1 still waits for rank 1: step 2 must not overtake it.
  rank0.Fill(1);
  REQUIRE_OK(c0->Save(1, rank0.Extra(1)));
  REQUIRE_OK(c0->WaitSnapshot(std::chrono::seconds(60)));
  rank0.Fill(2);
  REQUIRE_OK(c0->Save(2, rank0.Extra(2)));
  rank1.Fill(2);
  REQUIRE_OK(c1->Save(2, rank1.Extra(2)));
  REQUIRE_OK(c1->Wait(2, ckpt::WaitState::kPersisted, std::chrono::seconds(60)));
  CHECK_FALSE(HasManifest(daemon.root(), "order", 2));
  CHECK_FALSE(ReadLatest(daemon.root(), "order").has_value());

  // Rank 1 fills in step 1 (its memory holds step 1's values again): both commit, in order.
  rank1.Fill(1);
  REQUIRE_OK(c1->Save(1, rank1.Extra(1)));
  REQUIRE_OK(c1->Wait(2, ckpt::WaitState::kCommitted, std::chrono::seconds(60)));
  CHECK(HasManifest(daemon.root(), "order", 1));
  CHECK(ReadLatest(daemon.root(), "order") == 2u);
  REQUIRE_OK(c0->WaitSnapshot(std::chrono::seconds(60)));
  RequireTrainerStep(daemon.root(), "order", 1, 4ull << 20, 2, 2, seed);
  RequireTrainerStep(daemon.root(), "order", 2, 4ull << 20, 2, 2, seed);
}

TEST_CASE("daemon: on_full=skip skips a step the pool cannot take, and only then", "[daemon]") {
  TempDir dir;
  auto options = DaemonProcess::InDir(dir);
  options.host_pool = "16MiB";
  options.slot_size = "4MiB";
  DaemonProcess daemon(options);
  const uint64_t seed = ckpt::testing::TestSeed() + 6;

  // 8 MiB fits: it is saved even though the hot cache holds the previous step's slots (they
  // are given back for the new capture).
  InProcessRank small(8ull << 20, 2, 0, 1, seed);
  auto c = daemon.Connect("skip");
  REQUIRE_OK(c->Register(small.Specs()));
  for (uint64_t step = 1; step <= 3; ++step) {
    small.Fill(step);
    REQUIRE_OK(c->Save(step, small.Extra(step), ckpt::OnFull::kSkip));
    REQUIRE_OK(c->Wait(step, ckpt::WaitState::kCommitted, std::chrono::seconds(60)));
  }
  RequireTrainerStep(daemon.root(), "skip", 3, 8ull << 20, 2, 1, seed);

  // 32 MiB can never be held by a 16 MiB pool at once: skipped, nothing written, and the same
  // state still saves with the wait policy (it streams through the pool).
  InProcessRank big(32ull << 20, 2, 0, 1, seed);
  REQUIRE_OK(c->Register(big.Specs()));
  big.Fill(4);
  const ckpt::Status skipped = c->Save(4, big.Extra(4), ckpt::OnFull::kSkip);
  REQUIRE(skipped.code() == ckpt::StatusCode::kResourceExhausted);
  CHECK_THAT(skipped.message(), Catch::Contains("skipped"));
  CHECK_FALSE(HasManifest(daemon.root(), "skip", 4));
  big.Fill(5);
  REQUIRE_OK(c->Save(5, big.Extra(5)));
  REQUIRE_OK(c->Wait(5, ckpt::WaitState::kCommitted, std::chrono::seconds(60)));
  RequireTrainerStep(daemon.root(), "skip", 5, 32ull << 20, 2, 1, seed);
}
