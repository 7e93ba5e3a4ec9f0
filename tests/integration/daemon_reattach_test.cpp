// The first promise against real daemon processes: a frozen, killed or restarted daemon never
// holds a trainer longer than its call timeout, the same Client object goes on once the daemon is
// back, an abandoned step is never committed, and a client of the previous protocol version is
// still served (a daemon upgraded under running jobs). The frame-level rules of the client's
// state machine: client_reattach_test.cpp.
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>

#include "tests/integration/daemon_harness.h"  // first: it configures Catch

namespace {

using ckpt::ClientOptions;
using ckpt::StatusCode;
using ckpt::UniqueFd;
using ckpt::WaitState;
using ckpt::itest::DaemonProcess;
using ckpt::itest::InProcessRank;
using ckpt::itest::PathExists;
using ckpt::itest::RawConnection;
using ckpt::itest::ReadLatest;
using ckpt::itest::RequireTrainerStep;
using ckpt::testing::TempDir;
using std::chrono::milliseconds;
using std::chrono::seconds;
using Clock = std::chrono::steady_clock;

constexpr seconds kWait{60};
constexpr uint64_t kBytes = 4ull << 20;
constexpr uint32_t kTensors = 2;

std::string ManifestOf(const std::string& root, const std::string& job, uint64_t step) {
  return ckpt::StepDir(root, job, step) + "/MANIFEST";
}

std::unique_ptr<ckpt::Client> ConnectWithTimeout(const DaemonProcess& d, const std::string& job,
                                                 milliseconds call_timeout) {
  ClientOptions o = d.ClientOptionsFor(job);
  o.call_timeout = call_timeout;
  auto client = ckpt::Client::Connect(o);
  REQUIRE_OK(client);
  return std::move(client).value();
}

// Saves `step` from `rank` and waits until it is committed.
void SaveCommitted(ckpt::Client& client, InProcessRank& rank, uint64_t step) {
  rank.Fill(step);
  REQUIRE_OK(client.Save(step, rank.Extra(step)));
  REQUIRE_OK(client.WaitSnapshot(kWait));
  REQUIRE_OK(client.Wait(step, WaitState::kCommitted, kWait));
}

}  // namespace

TEST_CASE(
    "daemon: a frozen daemon fails save within call_timeout, thawed, the same client "
    "commits",
    "[daemon][reattach]") {
  TempDir dir;
  const uint64_t seed = ckpt::testing::TestSeed() + 41;
  DaemonProcess daemon(DaemonProcess::InDir(dir));
  InProcessRank rank(kBytes, kTensors, 0, 1, seed);
  constexpr milliseconds kCallTimeout{1000};
  auto client = ConnectWithTimeout(daemon, "frozen", kCallTimeout);
  REQUIRE_OK(client->Register(rank.Specs()));
  SaveCommitted(*client, rank, 1);

  daemon.Kill(SIGSTOP);
  rank.Fill(2);
  const auto start = Clock::now();
  ckpt::Status st = client->Save(2, rank.Extra(2));
  const auto took = Clock::now() - start;
  INFO("save on a frozen daemon: " << st.ToString());
  CHECK(st.code() == StatusCode::kDeadlineExceeded);
  // A latency bound (the timeout's own slack), not asserted under a sanitizer (test_util.h).
  CHECK_TIMING(took < kCallTimeout + seconds(1),
               std::chrono::duration_cast<milliseconds>(took).count() << " ms");
  // The trainer goes on: it modifies the memory at once (step 2 was abandoned by the client).
  rank.Fill(3);
  CHECK(client->Latest().status().code() == StatusCode::kDeadlineExceeded);

  daemon.Kill(SIGCONT);
  SaveCommitted(*client, rank, 3);
  RequireTrainerStep(daemon.root(), "frozen", 3, kBytes, kTensors, 1, seed);
  // The save that timed out reached the daemon late: abandoned, never committed.
  CHECK(!PathExists(ManifestOf(daemon.root(), "frozen", 2)));
  CHECK(ReadLatest(daemon.root(), "frozen") == 3u);
  CHECK(client->reattaches() == 0);
}

TEST_CASE(
    "daemon: after kill -9 and a restart on the same socket, the same client saves, "
    "commits and loads",
    "[daemon][reattach]") {
  TempDir dir;
  const uint64_t seed = ckpt::testing::TestSeed() + 42;
  const auto options = DaemonProcess::InDir(dir);
  auto daemon = std::make_unique<DaemonProcess>(options);
  InProcessRank rank(kBytes, kTensors, 0, 1, seed);
  auto client = ConnectWithTimeout(*daemon, "restart", milliseconds(5000));
  REQUIRE_OK(client->Register(rank.Specs()));
  SaveCommitted(*client, rank, 1);

  REQUIRE(daemon->Kill(SIGKILL).has_value());
  daemon.reset();
  // While it is down, calls fail promptly with UNAVAILABLE (no hang, no crash).
  rank.Fill(2);
  const auto start = Clock::now();
  ckpt::Status down = client->Save(2, rank.Extra(2));
  const auto took = Clock::now() - start;
  INFO("save while the daemon is down: " << down.ToString());
  CHECK(down.code() == StatusCode::kUnavailable);
  // Promptly: a latency bound, not asserted under a sanitizer (test_util.h).
  CHECK_TIMING(took < seconds(6), std::chrono::duration_cast<milliseconds>(took).count() << " ms");

  daemon = std::make_unique<DaemonProcess>(options);
  // The backoff of the failed attempt may still be running: the next save after it goes through.
  ckpt::Status st;
  REQUIRE(ckpt::itest::PollUntil(
      [&] {
        rank.Fill(3);
        st = client->Save(3, rank.Extra(3));
        return st.code() != StatusCode::kUnavailable;
      },
      seconds(20)));
  REQUIRE_OK(st);
  REQUIRE_OK(client->WaitSnapshot(kWait));
  REQUIRE_OK(client->Wait(3, WaitState::kCommitted, kWait));
  CHECK(client->reattaches() == 1);
  RequireTrainerStep(daemon->root(), "restart", 3, kBytes, kTensors, 1, seed);
  RequireTrainerStep(daemon->root(), "restart", 1, kBytes, kTensors, 1, seed);

  // load() after the re-attach: bit-exact into memory that was overwritten.
  rank.Fill(99);
  auto loaded = client->Load(uint64_t{1});
  REQUIRE_OK(loaded);
  CHECK(loaded->extra == rank.Extra(1));
  InProcessRank expected(kBytes, kTensors, 0, 1, seed);
  expected.Fill(1);
  for (const auto& t : rank.layout().tensors) {
    CHECK(std::memcmp(rank.Data() + t.fd_offset, expected.Data() + t.fd_offset, t.nbytes) == 0);
  }
}

TEST_CASE("daemon: an abandoned step is aborted and never committed, the next one is",
          "[daemon][reattach]") {
  TempDir dir;
  const uint64_t seed = ckpt::testing::TestSeed() + 43;
  auto options = DaemonProcess::InDir(dir);
  options.flags = {"--capture-throttle", "8MiB"};  // 32 MiB take ~4 s to capture
  DaemonProcess daemon(options);
  InProcessRank rank(32ull << 20, 4, 0, 1, seed);
  auto client = daemon.Connect("abandon");
  REQUIRE_OK(client->Register(rank.Specs()));
  rank.Fill(1);
  REQUIRE_OK(client->Save(1, rank.Extra(1)));
  // The fence gives up long before the capture is done; the trainer abandons and goes on.
  CHECK(client->WaitSnapshot(milliseconds(50)).code() == StatusCode::kDeadlineExceeded);
  REQUIRE_OK(client->Abandon(std::nullopt, "test fence gave up"));
  rank.Fill(2);  // the optimizer step: the capture of step 1 is torn from here on
  ckpt::Status st = client->Wait(1, WaitState::kCommitted, kWait);
  INFO(st.ToString());
  CHECK(st.code() == StatusCode::kAborted);
  CHECK_THAT(st.message(), Catch::Contains("abandoned"));
  CHECK(!PathExists(ManifestOf(daemon.root(), "abandon", 1)));

  REQUIRE_OK(client->Save(2, rank.Extra(2)));
  REQUIRE_OK(client->WaitSnapshot(kWait));
  REQUIRE_OK(client->Wait(2, WaitState::kCommitted, kWait));
  RequireTrainerStep(daemon.root(), "abandon", 2, 32ull << 20, 4, 1, seed);
}

TEST_CASE(
    "daemon: a client of the previous protocol version (1) is served, older ones are "
    "told which versions the daemon speaks",
    "[daemon][reattach]") {
  TempDir dir;
  const uint64_t seed = ckpt::testing::TestSeed() + 44;
  DaemonProcess daemon(DaemonProcess::InDir(dir));
  InProcessRank rank(kBytes, kTensors, 0, 1, seed);
  rank.Fill(1);

  // The previous release's frames, byte for byte: Hello v1, Register, Save, Wait.
  RawConnection conn(daemon.socket());
  ckptd::v1::ClientMessage hello;
  hello.mutable_hello()->set_protocol_version(1);
  hello.mutable_hello()->set_job("v1-job");
  hello.mutable_hello()->set_world_size(1);
  hello.mutable_hello()->set_client_version("ckpt-client 0.1.0");
  conn.Send(hello);
  auto reply = conn.Next();
  REQUIRE(reply);
  REQUIRE(reply->has_hello());
  CHECK(reply->hello().protocol_version() == 1);

  ckptd::v1::ClientMessage reg;
  for (const auto& spec : rank.Specs()) {
    auto* t = reg.mutable_register_()->add_tensors();
    t->set_name(spec.name);
    t->set_dtype(spec.dtype);
    for (uint64_t d : spec.global_shape) t->add_global_shape(d);
    auto* box = t->mutable_geometry()->mutable_box();
    for (uint64_t o : spec.offsets) box->add_offsets(o);
    for (uint64_t l : spec.lengths) box->add_lengths(l);
    t->mutable_host()->set_fd_index(0);
    t->mutable_host()->set_offset(spec.fd_offset);
    t->mutable_host()->set_length(spec.nbytes);
  }
  const int fd = rank.fd();
  conn.Send(reg, {&fd, 1});
  reply = conn.Next();
  REQUIRE(reply);
  REQUIRE(reply->has_register_());

  ckptd::v1::ClientMessage save;
  save.mutable_save()->set_step(1);
  save.mutable_save()->set_extra(rank.Extra(1));
  conn.Send(save);
  reply = conn.Next();
  REQUIRE(reply);
  REQUIRE(reply->has_save());
  ckptd::v1::ClientMessage wait;
  wait.mutable_wait()->set_step(1);
  wait.mutable_wait()->set_state(ckptd::v1::STEP_STATE_COMMITTED);
  conn.Send(wait);
  reply = conn.Next(kWait);
  REQUIRE(reply);
  REQUIRE(reply->has_wait());
  CHECK(reply->wait().state() == ckptd::v1::STEP_STATE_COMMITTED);
  RequireTrainerStep(daemon.root(), "v1-job", 1, kBytes, kTensors, 1, seed);

  // Version 0 is older than the oldest this daemon speaks: a clear refusal.
  RawConnection old(daemon.socket());
  hello.mutable_hello()->set_protocol_version(0);
  old.Send(hello);
  reply = old.Next();
  REQUIRE(reply);
  REQUIRE(reply->has_error());
  CHECK_THAT(reply->error().message(),
             Catch::Contains("protocol version 0") && Catch::Contains("1 to 3"));
}
