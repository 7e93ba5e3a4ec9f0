// The daemon's failure semantics (docs/design.md §2.7) with real processes: trainers that die, a
// daemon that is killed or stopped, failing storage, and hostile clients.
#include "tests/integration/coordinator_harness.h"  // first: it configures Catch

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

namespace {

namespace pb = ::ckptd::v1;
using ckpt::StatusCode;
using ckpt::UniqueFd;
using ckpt::itest::ChildProcess;
using ckpt::itest::CommittedSteps;
using ckpt::itest::DaemonProcess;
using ckpt::itest::DescribeWaitStatus;
using ckpt::itest::FileTail;
using ckpt::itest::InProcessRank;
using ckpt::itest::KilledBy;
using ckpt::itest::PathExists;
using ckpt::itest::PollUntil;
using ckpt::itest::RawConnection;
using ckpt::itest::ReadLatest;
using ckpt::itest::RequireTrainerStep;
using ckpt::itest::TrainerRun;
using ckpt::testing::TempDir;
using std::chrono::seconds;

constexpr seconds kWait{60};

std::string ManifestOf(const std::string& root, const std::string& job, uint64_t step) {
  return ckpt::StepDir(root, job, step) + "/MANIFEST";
}

// The child of a fork: a trainer rank (rank 0 of `world_size`) that saves `step`, waits until the
// daemon captured it and dies by SIGKILL. Owns its memory (a memfd of its own), so only the
// daemon holds it afterwards. Never returns; exits non-zero with a message on `log_fd` when
// something fails before the kill.
[[noreturn]] void SaveCapturedThenDie(int log_fd, const std::string& socket, const std::string& job,
                                      uint32_t world_size, uint64_t bytes_per_rank,
                                      uint32_t tensors, uint64_t seed, uint64_t step) {
  auto fail = [log_fd](const char* what, const ckpt::Status& st) {
    dprintf(log_fd, "child: %s: %s\n", what, st.ToString().c_str());
    _exit(3);
  };
  const auto layout = ckpt::example::MakeTrainerLayout(bytes_per_rank, tensors, world_size);
  const int fd = ::memfd_create("daemon_itest_child", MFD_CLOEXEC);
  if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(layout.memfd_bytes)) != 0) _exit(4);
  void* p = ::mmap(nullptr, layout.memfd_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) _exit(5);
  std::vector<ckpt::HostTensor> specs;
  for (uint32_t t = 0; t < layout.tensors.size(); ++t) {
    const auto& tensor = layout.tensors[t];
    ckpt::example::FillShard(reinterpret_cast<uint32_t*>(static_cast<char*>(p) + tensor.fd_offset),
                             tensor.rows * tensor.cols, seed, 0, step, t);
    ckpt::HostTensor h;
    h.name = tensor.name;
    h.dtype = "int32";
    h.global_shape = layout.GlobalShape(tensor);
    h.offsets = {0, 0};
    h.lengths = {tensor.rows, tensor.cols};
    h.fd = fd;
    h.fd_offset = tensor.fd_offset;
    h.nbytes = tensor.nbytes;
    specs.push_back(std::move(h));
  }
  ckpt::ClientOptions o;
  o.socket = socket;
  o.job = job;
  o.rank = 0;
  o.world_size = world_size;
  o.connect_timeout = std::chrono::milliseconds(20000);
  auto client = ckpt::Client::Connect(o);
  if (!client.ok()) fail("connect", client.status());
  if (auto st = (*client)->Register(specs); !st.ok()) fail("register", st);
  if (auto st = (*client)->Save(step, InProcessRank::TrainerExtra(seed, step, 0)); !st.ok()) {
    fail("save", st);
  }
  if (auto st = (*client)->WaitSnapshot(kWait); !st.ok()) fail("wait_snapshot", st);
  dprintf(log_fd, "child: step %llu captured; raising SIGKILL\n",
          static_cast<unsigned long long>(step));
  std::raise(SIGKILL);
  _exit(6);
}

// The threads of this process, from /proc/self/task.
size_t ThreadsOfThisProcess() {
  size_t n = 0;
  for ([[maybe_unused]] const auto& entry :
       std::filesystem::directory_iterator("/proc/self/task")) {
    ++n;
  }
  return n;
}

// Storage faults injected into a real daemon hit step 2 only: step 2 fails with the OS error,
// the daemon keeps serving (step 3 commits) and step 1 stays intact.
void RunStorageFault(const std::string& fault, const std::string& expected_error) {
  TempDir dir;
  auto options = DaemonProcess::InDir(dir);
  options.env = {"CKPTD_FAULT_INJECTION=" + fault + ",path=step-0000000002"};
  DaemonProcess daemon(options);
  REQUIRE_THAT(daemon.Log(), Catch::Contains("storage faults are being injected"));
  const uint64_t seed = ckpt::testing::TestSeed() + 20;
  constexpr uint64_t kBytes = 16ull << 20;
  InProcessRank rank(kBytes, 2, 0, 1, seed);
  auto client = daemon.Connect("faulty");
  REQUIRE_OK(client->Register(rank.Specs()));

  rank.Fill(1);
  REQUIRE_OK(client->Save(1, rank.Extra(1)));
  REQUIRE_OK(client->WaitSnapshot(kWait));
  REQUIRE_OK(client->Wait(1, ckpt::WaitState::kCommitted, kWait));

  rank.Fill(2);
  REQUIRE_OK(client->Save(2, rank.Extra(2)));
  // The capture may or may not complete before the write fails; either answer is fine here,
  // but the memory must not change before WaitSnapshot returned.
  const ckpt::Status snap2 = client->WaitSnapshot(kWait);
  INFO("wait_snapshot of step 2: " << snap2.ToString());
  REQUIRE(snap2.code() != StatusCode::kDeadlineExceeded);
  const ckpt::Status committed2 = client->Wait(2, ckpt::WaitState::kCommitted, kWait);
  INFO("wait for step 2 committed: " << committed2.ToString());
  REQUIRE(!committed2.ok());
  REQUIRE(committed2.code() != StatusCode::kDeadlineExceeded);
  REQUIRE(committed2.code() != StatusCode::kUnavailable);
  CHECK_THAT(committed2.message(), Catch::Contains(expected_error));
  CHECK_THAT(committed2.message(), Catch::Contains("step 2"));

  // The daemon keeps serving.
  REQUIRE(daemon.Alive());
  rank.Fill(3);
  REQUIRE_OK(client->Save(3, rank.Extra(3)));
  REQUIRE_OK(client->WaitSnapshot(kWait));
  REQUIRE_OK(client->Wait(3, ckpt::WaitState::kCommitted, kWait));

  CHECK(!PathExists(ManifestOf(daemon.root(), "faulty", 2)));
  CHECK(PollUntil([&] { return !PathExists(ckpt::StepDir(daemon.root(), "faulty", 2)); }));
  REQUIRE(CommittedSteps(daemon.root(), "faulty") == std::vector<uint64_t>{1, 3});
  REQUIRE(ReadLatest(daemon.root(), "faulty") == 3u);
  RequireTrainerStep(daemon.root(), "faulty", 1, kBytes, 2, 1, seed);
  RequireTrainerStep(daemon.root(), "faulty", 3, kBytes, 2, 1, seed);
}

// A broken stream must be answered by an Error and/or a closed connection.
void ExpectErrorThenClose(RawConnection& conn, const std::string& what) {
  INFO(what);
  auto first = conn.Next();
  if (first) {
    INFO("reply: " << first->ShortDebugString());
    REQUIRE(first->has_error());
    CHECK(!first->error().message().empty());
    auto second = conn.Next();
    INFO("after the error: " << (second ? second->ShortDebugString() : "closed"));
    REQUIRE(!second.has_value());
  }
}

// A semantic error: an Error reply to that request, and the session goes on (Latest works).
void ExpectErrorAndSessionContinues(RawConnection& conn, pb::ClientMessage request,
                                    std::span<const int> fds, const std::string& what,
                                    const std::string& expected_text = "") {
  INFO(what);
  const pb::DaemonMessage reply = conn.Call(std::move(request), fds);
  INFO("reply: " << reply.ShortDebugString());
  REQUIRE(reply.has_error());
  CHECK(!reply.error().message().empty());
  if (!expected_text.empty()) CHECK_THAT(reply.error().message(), Catch::Contains(expected_text));
  pb::ClientMessage latest;
  latest.mutable_latest();
  const pb::DaemonMessage after = conn.Call(latest);
  INFO("latest after the error: " << after.ShortDebugString());
  REQUIRE(after.has_latest());
}

}  // namespace

TEST_CASE("daemon: a trainer killed right after its step was captured still gets it committed",
          "[daemon]") {
  TempDir dir;
  const auto options = DaemonProcess::InDir(dir);
  const uint64_t seed = ckpt::testing::TestSeed() + 10;
  constexpr uint64_t kBytes = 8ull << 20;
  constexpr uint32_t kTensors = 4;

  // Rank 0 in a forked child, which starts its own client. The fork comes first, while this
  // process has one thread: once the daemon runs, the harness's ready probe has a reader thread,
  // and a fork taken while it holds a lock (the allocator's, under AddressSanitizer, which takes
  // no lock around fork) leaves that lock held for good in the child, whose client then hears
  // nothing. The child waits for a byte on `go`, written once the daemon serves; end of file
  // (this process failed first) makes it exit.
  const std::string child_log = dir / "child.log";
  const int log_fd = ::open(child_log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  REQUIRE(log_fd >= 0);
  int go[2];
  REQUIRE(::pipe2(go, O_CLOEXEC) == 0);
  REQUIRE(ThreadsOfThisProcess() == 1);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(go[1]);
    char byte;
    if (::read(go[0], &byte, 1) != 1) _exit(7);
    SaveCapturedThenDie(log_fd, options.socket, "crash", 2, kBytes, kTensors, seed, 1);
  }
  ::close(go[0]);
  ::close(log_fd);
  ChildProcess child = ChildProcess::Adopt(pid, child_log);
  UniqueFd go_write(go[1]);
  DaemonProcess daemon(options);
  REQUIRE(::write(go_write.get(), "g", 1) == 1);
  go_write = UniqueFd();  // the child has its byte; nothing more comes
  const int status = child.Wait();
  INFO("rank 0 " << DescribeWaitStatus(status) << ":\n" << FileTail(child_log));
  REQUIRE(KilledBy(status, SIGKILL));
  REQUIRE(!PathExists(ManifestOf(daemon.root(), "crash", 1)));  // rank 1 has not saved yet

  // Rank 1 saves the same step after rank 0 is gone: the step must still commit with both.
  InProcessRank rank1(kBytes, kTensors, 1, 2, seed);
  auto client = daemon.Connect("crash", 1, 2);
  REQUIRE_OK(client->Register(rank1.Specs()));
  rank1.Fill(1);
  REQUIRE_OK(client->Save(1, rank1.Extra(1)));
  REQUIRE_OK(client->WaitSnapshot(kWait));
  REQUIRE_OK(client->Wait(1, ckpt::WaitState::kCommitted, kWait));
  REQUIRE(ReadLatest(daemon.root(), "crash") == 1u);
  RequireTrainerStep(daemon.root(), "crash", 1, kBytes, kTensors, 2, seed);
}

TEST_CASE("daemon: a trainer killed while its step is captured aborts the step, naming it",
          "[daemon]") {
  TempDir dir;
  auto options = DaemonProcess::InDir(dir);
  // 32 MiB at 4 MiB/s: the capture takes ~8 s, the trainer dies right after Save.
  options.flags = {"--capture-throttle", "4MiB"};
  DaemonProcess daemon(options);
  const uint64_t seed = ckpt::testing::TestSeed() + 11;
  constexpr uint64_t kBytes = 32ull << 20;
  constexpr uint32_t kTensors = 4;

  // Rank 1 (this process) saves step 1 first, so the step exists with a live rank.
  InProcessRank rank1(kBytes, kTensors, 1, 2, seed);
  auto client = daemon.Connect("torn", 1, 2);
  REQUIRE_OK(client->Register(rank1.Specs()));
  rank1.Fill(1);
  REQUIRE_OK(client->Save(1, rank1.Extra(1)));

  TrainerRun run;
  run.socket = daemon.socket();
  run.job = "torn";
  run.rank = 0;
  run.world_size = 2;
  run.steps = 1;
  run.tensors = kTensors;
  run.bytes_per_rank = kBytes;
  run.seed = seed;
  run.kill_self_after_save = 1;
  const std::string trainer_log = dir / "trainer.log";
  ChildProcess trainer = ckpt::itest::StartTrainer(run.Args(), trainer_log);
  const pid_t trainer_pid = trainer.pid();

  const std::string dead_rank = "rank 0 (pid " + std::to_string(trainer_pid) + ")";
  const ckpt::Status snap = client->WaitSnapshot(kWait);
  INFO("wait_snapshot: " << snap.ToString() << "\ntrainer output:\n" << FileTail(trainer_log));
  REQUIRE(snap.code() != StatusCode::kDeadlineExceeded);
  if (!snap.ok()) CHECK_THAT(snap.message(), Catch::Contains(dead_rank));
  const ckpt::Status committed = client->Wait(1, ckpt::WaitState::kCommitted, kWait);
  INFO("wait committed: " << committed.ToString());
  REQUIRE(!committed.ok());
  CHECK(committed.code() == StatusCode::kAborted);
  CHECK_THAT(committed.message(), Catch::Contains(dead_rank));

  const int status = trainer.Wait();
  INFO("trainer " << DescribeWaitStatus(status) << ":\n" << FileTail(trainer_log));
  REQUIRE(KilledBy(status, SIGKILL));
  REQUIRE_THAT(ckpt::itest::ReadWholeFile(trainer_log), Catch::Contains("killing myself"));

  CHECK(!PathExists(ManifestOf(daemon.root(), "torn", 1)));
  CHECK(PollUntil([&] { return !PathExists(ckpt::StepDir(daemon.root(), "torn", 1)); }));
  CHECK(!ReadLatest(daemon.root(), "torn").has_value());
  CHECK(CommittedSteps(daemon.root(), "torn").empty());
  REQUIRE(daemon.Alive());
}

// A daemon killed in the middle of a step: rank 0 saved it there (lost with that daemon), rank 1
// saves it on the restarted one. The step can never complete, and it would hold back every later
// commit (commits go in step order) until the step timeout. Rank 0's re-attach says its save of
// the step was lost (Hello.lost_step): the step is aborted at once, naming it, and the next step
// commits. Both with the embedded coordinator and with ckpt-coordinator.
TEST_CASE("daemon: a step whose save was lost with a killed daemon is aborted on re-attach",
          "[daemon]") {
  const bool with_coordinator = GENERATE(false, true);
  INFO((with_coordinator ? "with ckpt-coordinator" : "embedded coordinator"));
  TempDir dir;
  auto options = DaemonProcess::InDir(dir);
  std::optional<ckpt::itest::CoordinatorProcess> coordinator;
  if (with_coordinator) {
    ckpt::itest::CoordinatorProcess::Options c;
    c.socket = dir / "coord.sock";
    c.storage_root = options.storage_root;
    c.log_path = dir / "coordinator.log";
    coordinator.emplace(c);
    options.flags = {"--node-id", "n0", "--coordinator", coordinator->address()};
  }
  std::optional<DaemonProcess> daemon(std::in_place, options);
  const uint64_t seed = ckpt::testing::TestSeed() + 31;
  constexpr uint64_t kBytes = 1ull << 20;
  InProcessRank rank0(kBytes, 2, 0, 2, seed);
  InProcessRank rank1(kBytes, 2, 1, 2, seed);
  auto client0 = daemon->Connect("lost", 0, 2);
  auto client1 = daemon->Connect("lost", 1, 2);
  REQUIRE_OK(client0->Register(rank0.Specs()));
  REQUIRE_OK(client1->Register(rank1.Specs()));

  rank0.Fill(4);
  REQUIRE_OK(client0->Save(4, rank0.Extra(4)));
  REQUIRE_OK(client0->WaitSnapshot(kWait));
  const auto killed = daemon->Kill(SIGKILL);
  REQUIRE(killed.has_value());
  daemon.reset();
  daemon.emplace(options);

  rank1.Fill(4);
  REQUIRE_OK(client1->Save(4, rank1.Extra(4)));  // re-attaches: the new daemon's step 4
  // With ckpt-coordinator the step may already be aborted here: the coordinator heard of rank
  // 0's save from the old daemon and aborted the step when the node came back as a new process.
  const ckpt::Status snap = client1->WaitSnapshot(kWait);
  INFO("wait_snapshot of step 4: " << snap.ToString());
  REQUIRE((snap.ok() || (with_coordinator && snap.code() == StatusCode::kAborted)));
  REQUIRE_OK(client0->Latest().status());  // rank 0 re-attaches: "my save of step 4 was lost"
  const ckpt::Status lost = client1->Wait(4, ckpt::WaitState::kCommitted, kWait);
  INFO("wait for step 4: " << lost.ToString());
  REQUIRE(lost.code() == StatusCode::kAborted);
  if (!with_coordinator) {
    CHECK_THAT(lost.message(), Catch::Contains("rank 0 saved step 4 on a connection that broke"));
  }

  for (auto* c : {client0.get(), client1.get()}) {
    (c == client0.get() ? rank0 : rank1).Fill(5);
    REQUIRE_OK(c->Save(5, (c == client0.get() ? rank0 : rank1).Extra(5)));
  }
  REQUIRE_OK(client0->WaitSnapshot(kWait));
  REQUIRE_OK(client1->WaitSnapshot(kWait));
  REQUIRE_OK(client0->Wait(5, ckpt::WaitState::kCommitted, kWait));
  REQUIRE_OK(client1->Wait(5, ckpt::WaitState::kCommitted, kWait));
  REQUIRE(CommittedSteps(daemon->root(), "lost") == std::vector<uint64_t>{5});
  RequireTrainerStep(daemon->root(), "lost", 5, kBytes, 2, 2, seed);
  CHECK(PollUntil([&] { return !PathExists(ckpt::StepDir(daemon->root(), "lost", 4)); }));
}

TEST_CASE("daemon: killed mid-flush, a restarted daemon removes the torn step and goes on",
          "[daemon]") {
  TempDir dir;
  const uint64_t seed = ckpt::testing::TestSeed() + 12;
  constexpr uint64_t kBytes = 8ull << 20;
  constexpr uint32_t kTensors = 2;
  auto options = DaemonProcess::InDir(dir);

  // Step 1 committed by a first daemon.
  {
    DaemonProcess first(options);
    TrainerRun run;
    run.socket = first.socket();
    run.job = "restart";
    run.tensors = kTensors;
    run.bytes_per_rank = kBytes;
    run.seed = seed;
    ckpt::itest::RequireTrainerSucceeds(run, dir / "trainer-1.log");
    const int status = first.Terminate();
    INFO("first daemon " << DescribeWaitStatus(status));
    REQUIRE(ckpt::itest::ExitedWith(status, 0));
  }
  REQUIRE(ReadLatest(options.storage_root, "restart") == 1u);

  // Step 2 on a slow daemon, SIGKILLed once the step's data file is being written.
  {
    auto slow_options = options;
    slow_options.flags = {"--capture-throttle", "4MiB"};  // 32 MiB take ~8 s to capture
    DaemonProcess slow(slow_options);
    InProcessRank rank(32ull << 20, 4, 0, 1, seed);
    auto client = slow.Connect("restart");
    REQUIRE_OK(client->Register(rank.Specs()));
    rank.Fill(2);
    REQUIRE_OK(client->Save(2, rank.Extra(2)));
    const std::string data_file =
        ckpt::StepDir(slow.root(), "restart", 2) + "/" + ckpt::DataFileName(0);
    REQUIRE(PollUntil([&] {
      struct stat st;
      return ::stat(data_file.c_str(), &st) == 0 && st.st_size > 0;
    }));
    const auto killed = slow.Kill(SIGKILL);
    REQUIRE(killed.has_value());
    REQUIRE(KilledBy(*killed, SIGKILL));
    // The trainer's client gets a clear error, never a hang.
    const ckpt::Status st = client->Wait(2, ckpt::WaitState::kCommitted, kWait);
    INFO("wait after the daemon died: " << st.ToString());
    CHECK(st.code() == StatusCode::kUnavailable);
    REQUIRE(PathExists(ckpt::StepDir(slow.root(), "restart", 2)));  // the torn leftovers
    REQUIRE(!PathExists(ManifestOf(slow.root(), "restart", 2)));
  }

  // A restarted daemon on the same root: the torn step is gone, step 1 is untouched.
  DaemonProcess restarted(options);
  CHECK(!PathExists(ckpt::StepDir(restarted.root(), "restart", 2)));
  REQUIRE(ckpt::itest::AllStepDirs(restarted.root(), "restart") == std::vector<uint64_t>{1});
  REQUIRE(ReadLatest(restarted.root(), "restart") == 1u);
  RequireTrainerStep(restarted.root(), "restart", 1, kBytes, kTensors, 1, seed);
  {
    auto client = restarted.Connect("restart");
    auto latest = client->Latest();
    REQUIRE_OK(latest);
    CHECK(*latest == std::optional<uint64_t>(1));
  }

  // And it saves again.
  TrainerRun again;
  again.socket = restarted.socket();
  again.job = "restart";
  again.start_step = 2;
  again.tensors = kTensors;
  again.bytes_per_rank = kBytes;
  again.seed = seed;
  ckpt::itest::RequireTrainerSucceeds(again, dir / "trainer-2.log");
  REQUIRE(ReadLatest(restarted.root(), "restart") == 2u);
  RequireTrainerStep(restarted.root(), "restart", 2, kBytes, kTensors, 1, seed);
  RequireTrainerStep(restarted.root(), "restart", 1, kBytes, kTensors, 1, seed);
}

TEST_CASE("daemon: a full disk fails the step with ENOSPC, the daemon goes on", "[daemon]") {
  RunStorageFault("enospc-after=8MiB", "No space left on device");
}

TEST_CASE("daemon: a failing fdatasync fails the step with EIO, the daemon goes on", "[daemon]") {
  RunStorageFault("eio-sync", "Input/output error");
}

// Regression: Session::Close once cleared the reply queue under a write whose completion was
// still queued; the completion then popped an empty deque and the daemon aborted.
TEST_CASE("daemon: a broken stream gets an error and a closed connection, nobody else notices",
          "[daemon]") {
  TempDir dir;
  DaemonProcess daemon(DaemonProcess::InDir(dir));
  const uint64_t seed = ckpt::testing::TestSeed() + 13;

  // A well-behaved rank connected all along.
  InProcessRank good(4ull << 20, 2, 0, 1, seed);
  auto client = daemon.Connect("good");
  REQUIRE_OK(client->Register(good.Specs()));

  SECTION("garbage bytes") {
    RawConnection conn(daemon.socket());
    conn.SendBytes("this is not a frame, just some garbage bytes\n");
    ExpectErrorThenClose(conn, "garbage bytes");
  }
  SECTION("a length prefix of 0xFFFFFFFF") {
    RawConnection conn(daemon.socket());
    conn.SendBytes(std::string("\xFF\xFF\xFF\xFF", 4) + "payload");
    ExpectErrorThenClose(conn, "a length prefix of 0xFFFFFFFF");
  }
  SECTION("a truncated frame, then the client closes") {
    RawConnection conn(daemon.socket());
    conn.SendBytes(std::string("\x64\x00\x00\x00", 4) + "0123456789");  // 10 of 100 bytes
    conn.ShutdownWrite();
    REQUIRE(!conn.Next().has_value());
  }
  SECTION("a payload that is not a ClientMessage") {
    RawConnection conn(daemon.socket());
    conn.SendBytes(ckpt::EncodeFrame(std::string(8, '\xFF')));
    ExpectErrorThenClose(conn, "a payload that is not a ClientMessage");
  }
  SECTION("a first message that is not Hello") {
    RawConnection conn(daemon.socket());
    pb::ClientMessage latest;
    latest.mutable_latest();
    conn.Send(latest);
    ExpectErrorThenClose(conn, "a first message that is not Hello");
  }
  SECTION("a hostile job name") {
    RawConnection conn(daemon.socket());
    const pb::DaemonMessage reply = conn.Hello("../etc");
    INFO("hello as job ../etc: " << reply.ShortDebugString());
    REQUIRE(reply.has_error());
    CHECK_THAT(reply.error().message(), Catch::Contains("../etc"));
    REQUIRE(!conn.Next().has_value());  // and the connection is closed
  }

  // Meanwhile the well-behaved rank saves and commits, and the daemon is alive.
  REQUIRE(daemon.Alive());
  good.Fill(1);
  REQUIRE_OK(client->Save(1, good.Extra(1)));
  REQUIRE_OK(client->WaitSnapshot(kWait));
  REQUIRE_OK(client->Wait(1, ckpt::WaitState::kCommitted, kWait));
  RequireTrainerStep(daemon.root(), "good", 1, 4ull << 20, 2, 1, seed);
  REQUIRE(daemon.Alive());
  REQUIRE(!PathExists(daemon.root() + "/etc"));
  REQUIRE(!PathExists(dir / "etc"));
}

// The same regression reached by well-behaved clients: one that reads the reply to a request
// answered at once (here Hello) and disconnects before the daemon's loop ran that write's
// completion handler (a readiness probe, a trainer exiting right after Save).
TEST_CASE("daemon: clients that disconnect right after a reply do not take the daemon down",
          "[daemon]") {
  TempDir dir;
  DaemonProcess daemon(DaemonProcess::InDir(dir));
  const uint64_t seed = ckpt::testing::TestSeed() + 16;
  InProcessRank good(1ull << 20, 1, 0, 1, seed);
  auto client = daemon.Connect("good");
  REQUIRE_OK(client->Register(good.Specs()));

  for (int i = 0; i < 50; ++i) {
    INFO("hello and disconnect #" << i);
    RawConnection conn(daemon.socket());
    const pb::DaemonMessage hello = conn.Hello("probe");
    REQUIRE(hello.has_hello());
  }

  REQUIRE(daemon.Alive());
  good.Fill(1);
  REQUIRE_OK(client->Save(1, good.Extra(1)));
  REQUIRE_OK(client->WaitSnapshot(kWait));
  REQUIRE_OK(client->Wait(1, ckpt::WaitState::kCommitted, kWait));
  RequireTrainerStep(daemon.root(), "good", 1, 1ull << 20, 1, 1, seed);
}

TEST_CASE("daemon: bad requests get an Error, the session and other clients go on", "[daemon]") {
  TempDir dir;
  DaemonProcess daemon(DaemonProcess::InDir(dir));
  const uint64_t seed = ckpt::testing::TestSeed() + 15;

  // A well-behaved rank connected all along.
  InProcessRank good(4ull << 20, 2, 0, 1, seed);
  auto client = daemon.Connect("good");
  REQUIRE_OK(client->Register(good.Specs()));

  // Semantic errors: an Error, and the session continues.
  {
    constexpr uint64_t kMemfdBytes = 64 << 10;
    UniqueFd memfd(::memfd_create("hostile", MFD_CLOEXEC));
    REQUIRE(memfd);
    REQUIRE(::ftruncate(memfd.get(), kMemfdBytes) == 0);
    const int fds[] = {memfd.get()};
    RawConnection conn(daemon.socket());
    const pb::DaemonMessage hello = conn.Hello("hostile");
    REQUIRE(hello.has_hello());

    pb::ClientMessage save;
    save.mutable_save()->set_step(1);
    ExpectErrorAndSessionContinues(conn, save, {}, "a save before any registration");

    pb::ClientMessage beyond;
    *beyond.mutable_register_()->add_tensors() =
        ckpt::itest::HostSpec("w", "uint8", {kMemfdBytes}, kMemfdBytes / 2, kMemfdBytes);
    ExpectErrorAndSessionContinues(conn, beyond, fds,
                                   "a HostMemory range beyond the end of the memfd");

    pb::ClientMessage control;
    *control.mutable_register_()->add_tensors() =
        ckpt::itest::HostSpec("bad\x01name", "uint8", {kMemfdBytes}, 0, kMemfdBytes);
    ExpectErrorAndSessionContinues(conn, control, fds, "a tensor name with a control character");

    pb::ClientMessage dtype;
    *dtype.mutable_register_()->add_tensors() =
        ckpt::itest::HostSpec("w", "float128", {kMemfdBytes / 16}, 0, kMemfdBytes);
    ExpectErrorAndSessionContinues(conn, dtype, fds, "dtype float128", "float128");

    pb::ClientMessage no_fd;
    *no_fd.mutable_register_()->add_tensors() =
        ckpt::itest::HostSpec("w", "uint8", {kMemfdBytes}, 0, kMemfdBytes);
    ExpectErrorAndSessionContinues(conn, no_fd, {}, "a HostMemory naming a descriptor not sent");

    pb::ClientMessage hostile_path;
    *hostile_path.mutable_register_()->add_tensors() =
        ckpt::itest::HostSpec("../../etc/passwd", "uint8", {kMemfdBytes}, 0, kMemfdBytes);
    // Tensor names are not paths on disk, but a hostile one must not do harm either way.
    const pb::DaemonMessage path_reply = conn.Call(hostile_path, fds);
    INFO("register of ../../etc/passwd: " << path_reply.ShortDebugString());
    REQUIRE((path_reply.has_error() || path_reply.has_register_()));

    pb::ClientMessage wait_bad_state;
    wait_bad_state.mutable_wait()->set_step(1);
    wait_bad_state.mutable_wait()->set_state(pb::STEP_STATE_ABORTED);
    ExpectErrorAndSessionContinues(conn, wait_bad_state, {}, "a wait for state aborted");
  }

  // Meanwhile the well-behaved rank saves and commits, and the daemon is alive.
  REQUIRE(daemon.Alive());
  good.Fill(1);
  REQUIRE_OK(client->Save(1, good.Extra(1)));
  REQUIRE_OK(client->WaitSnapshot(kWait));
  REQUIRE_OK(client->Wait(1, ckpt::WaitState::kCommitted, kWait));
  RequireTrainerStep(daemon.root(), "good", 1, 4ull << 20, 2, 1, seed);
  REQUIRE(daemon.Alive());
}

TEST_CASE("daemon: SIGTERM with a step in flight commits it, then exits 0", "[daemon]") {
  TempDir dir;
  // Step 1's first data write stalls until the test opens the FIFO: the step is in flight,
  // however slow the machine, when SIGTERM arrives.
  const std::string fifo = dir / "release";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  auto options = DaemonProcess::InDir(dir);
  options.flags = {"--shutdown-timeout", "60s"};
  options.env = {"CKPTD_FAULT_INJECTION=stall-write=1,stall-release=" + fifo +
                 ",path=" + ckpt::StepDirName(1)};
  DaemonProcess daemon(options);
  const uint64_t seed = ckpt::testing::TestSeed() + 14;
  constexpr uint64_t kBytes = 16ull << 20;
  InProcessRank rank(kBytes, 2, 0, 1, seed);
  auto client = daemon.Connect("term");
  REQUIRE_OK(client->Register(rank.Specs()));
  rank.Fill(1);
  REQUIRE_OK(client->Save(1, rank.Extra(1)));
  REQUIRE(
      PollUntil([&] { return daemon.Log().find("stalls until released") != std::string::npos; }));
  REQUIRE(!PathExists(ManifestOf(daemon.root(), "term", 1)));

  daemon.Kill(SIGTERM);
  REQUIRE(PollUntil([&] { return daemon.Log().find("draining") != std::string::npos; }));
  {
    const int fd = ::open(fifo.c_str(), O_WRONLY | O_CLOEXEC);
    REQUIRE(fd >= 0);
    ::close(fd);
  }
  const int status = daemon.Wait();
  INFO("daemon " << DescribeWaitStatus(status));
  REQUIRE(ckpt::itest::ExitedWith(status, 0));
  REQUIRE(PathExists(ManifestOf(daemon.root(), "term", 1)));
  REQUIRE(ReadLatest(daemon.root(), "term") == 1u);
  RequireTrainerStep(daemon.root(), "term", 1, kBytes, 2, 1, seed);
  CHECK_THAT(daemon.Log(), Catch::Contains("drained"));
}
