// ckpt::Client against a scripted fake daemon: the local protocol's rules as the client must
// follow them (proto/ckptd/v1/local.proto). The fake listens on a real Unix socket and hands
// every frame it receives (with its descriptors) to the test thread, which checks it and
// decides what to answer, so each test reads as the conversation it checks. Nothing waits on
// a sleep: the test thread waits for frames, and for the client's calls through futures with
// a generous bound that only matters when something hangs.
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "ckpt/client.h"
#include "ckptd/v1/local.pb.h"
#include "client/examples/trainer_data.h"
#include "common/frame_io.h"
#include "tests/integration/fake_daemon.h"
#include "tests/test_util.h"

namespace {

namespace pb = ::ckptd::v1;
using ckpt::Client;
using ckpt::ClientOptions;
using ckpt::HostTensor;
using ckpt::StatusCode;
using ckpt::UniqueFd;
using std::chrono::milliseconds;
using std::chrono::seconds;

using namespace ckpt::itest::fake;  // NOLINT: the fake daemon and its helpers

// A child process (the example trainer), killed if the test ends before it exits.
class ChildProcess {
 public:
  explicit ChildProcess(std::vector<std::string> args) {
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    REQUIRE(::posix_spawn(&pid_, argv[0], nullptr, nullptr, argv.data(), environ) == 0);
  }
  ~ChildProcess() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  // The wait status; fails the test when the child has not exited within kHang.
  int Wait() {
    const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0));
    if (pidfd >= 0) {
      struct pollfd p = {pidfd, POLLIN, 0};
      const int ready = ::poll(&p, 1, static_cast<int>(kHang.count() * 1000));
      ::close(pidfd);
      REQUIRE(ready == 1);
    }
    int status = 0;
    REQUIRE(::waitpid(pid_, &status, 0) == pid_);
    pid_ = -1;
    return status;
  }

 private:
  pid_t pid_ = -1;
};

std::string TrainerBinary() {
  const char* dir = std::getenv("CKPT_BIN_DIR");
  const std::filesystem::path bin =
      dir && *dir ? std::filesystem::path(dir)
                  : std::filesystem::read_symlink("/proc/self/exe").parent_path();
  const std::string path = bin / "ckpt_example_trainer";
  INFO("build the ckpt_example_trainer target first");
  REQUIRE(std::filesystem::exists(path));
  return path;
}

}  // namespace

TEST_CASE("client: hello introduces the rank and Connect returns the daemon's node id",
          "[client]") {
  ckpt::testing::TempDir dir;
  FakeDaemon daemon(dir / "ckptd.sock");
  auto call =
      std::async(std::launch::async, [&] { return Client::Connect(Options(daemon.path())); });
  auto hello = daemon.Next();
  REQUIRE(hello);
  REQUIRE(hello->message.has_hello());
  CHECK(hello->message.request_id() != 0);
  CHECK(hello->fds.empty());
  const pb::Hello& h = hello->message.hello();
  CHECK(h.protocol_version() == 3);
  CHECK(h.reattach() == 0);
  CHECK(h.job() == "job-a");
  CHECK(h.rank() == 1);
  CHECK(h.world_size() == 4);
  CHECK(h.local_rank() == 1);
  CHECK(!h.client_version().empty());
  pb::DaemonMessage reply;
  reply.mutable_hello()->set_protocol_version(1);
  reply.mutable_hello()->set_node_id("node-7");
  daemon.Reply(hello->message.request_id(), reply);
  auto client = Finish(daemon, call);
  REQUIRE_OK(client);
  CHECK((*client)->node_id() == "node-7");
}

TEST_CASE("client: a hello refused by the daemon fails Connect with the daemon's message",
          "[client]") {
  ckpt::testing::TempDir dir;
  FakeDaemon daemon(dir / "ckptd.sock");
  auto call =
      std::async(std::launch::async, [&] { return Client::Connect(Options(daemon.path())); });
  auto hello = daemon.Next();
  REQUIRE(hello);
  daemon.ReplyError(hello->message.request_id(), StatusCode::kFailedPrecondition,
                    "job job-a: world_size 4 disagrees with 8 of rank 0");
  auto client = Finish(daemon, call);
  REQUIRE(!client.ok());
  CHECK(client.status().code() == StatusCode::kFailedPrecondition);
  CHECK_THAT(client.status().message(),
             Catch::Contains("job job-a: world_size 4 disagrees with 8 of rank 0"));
}

TEST_CASE("client: Connect gives up with kUnavailable when nothing listens", "[client]") {
  ckpt::testing::TempDir dir;
  ClientOptions o = Options(dir / "absent.sock");
  o.connect_timeout = milliseconds(100);
  auto client = Client::Connect(o);
  REQUIRE(!client.ok());
  CHECK(client.status().code() == StatusCode::kUnavailable);
  CHECK_THAT(client.status().message(), Catch::Contains(dir / "absent.sock"));

  o.job = "../escape";
  CHECK(Client::Connect(o).status().code() == StatusCode::kInvalidArgument);
  o.job = "job-a";
  o.rank = 4;
  CHECK(Client::Connect(o).status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("client: Connect retries until the daemon listens", "[client]") {
  ckpt::testing::TempDir dir;
  const std::string path = dir / "ckptd.sock";
  // The client may try before the socket exists; either way it must end up connected.
  auto call = std::async(std::launch::async, [&] { return Client::Connect(Options(path)); });
  FakeDaemon daemon(path);
  auto hello = daemon.Next();
  REQUIRE(hello);
  pb::DaemonMessage reply;
  reply.mutable_hello()->set_protocol_version(1);
  daemon.Reply(hello->message.request_id(), reply);
  REQUIRE_OK(Finish(daemon, call));
}

TEST_CASE("client: replies are matched to their requests by id", "[client]") {
  ckpt::testing::TempDir dir;
  FakeDaemon daemon(dir / "ckptd.sock");
  auto client = ConnectTo(daemon, Options(daemon.path()));

  constexpr int kCalls = 8;
  std::vector<std::future<ckpt::Result<ckpt::LoadResult>>> calls;
  for (int i = 0; i < kCalls; ++i) {
    calls.push_back(std::async(std::launch::async, [&, i] {
      return client->Load(uint64_t(100 + i), /*strict=*/i % 2 == 0);
    }));
  }
  std::vector<Received> requests;
  std::set<uint64_t> ids;
  for (int i = 0; i < kCalls; ++i) {
    auto r = daemon.Next();
    REQUIRE(r);
    REQUIRE(r->message.has_load());
    CHECK(r->message.load().has_step());
    CHECK(r->message.load().strict() == ((r->message.load().step() - 100) % 2 == 0));
    CHECK(r->message.request_id() != 0);
    ids.insert(r->message.request_id());
    requests.push_back(std::move(*r));
  }
  CHECK(ids.size() == kCalls);  // fresh ids

  // Noise the client must not mistake for replies: an event and a reply nobody asked for.
  daemon.SendEvent(100, pb::STEP_STATE_PERSISTED);
  pb::DaemonMessage stray;
  stray.mutable_load()->set_step(999);
  daemon.Reply(uint64_t{1} << 40, stray);
  for (auto it = requests.rbegin(); it != requests.rend(); ++it) {
    const uint64_t step = it->message.load().step();
    pb::DaemonMessage reply;
    reply.mutable_load()->set_step(step);
    reply.mutable_load()->set_extra("extra-" + std::to_string(step));
    reply.mutable_load()->set_bytes_from_memory(step * 10);
    reply.mutable_load()->set_bytes_from_storage(step * 20);
    if (step % 2 == 1) reply.mutable_load()->add_missing("missing-" + std::to_string(step));
    daemon.Reply(it->message.request_id(), reply);
  }
  for (int i = 0; i < kCalls; ++i) {
    auto result = Finish(daemon, calls[i]);
    REQUIRE_OK(result);
    const uint64_t step = 100 + i;
    CHECK(result->step == step);
    CHECK(result->extra == "extra-" + std::to_string(step));
    CHECK(result->bytes_from_memory == step * 10);
    CHECK(result->bytes_from_storage == step * 20);
    if (step % 2 == 1) {
      CHECK(result->missing == std::vector<std::string>{"missing-" + std::to_string(step)});
    } else {
      CHECK(result->missing.empty());
    }
  }

  // Latest with and without a step; Load of the newest step.
  auto latest = std::async(std::launch::async, [&] { return client->Latest(); });
  auto r = daemon.Next();
  REQUIRE(r);
  REQUIRE(r->message.has_latest());
  pb::DaemonMessage reply;
  reply.mutable_latest()->set_has_step(true);
  reply.mutable_latest()->set_step(0);
  daemon.Reply(r->message.request_id(), reply);
  auto got = Finish(daemon, latest);
  REQUIRE_OK(got);
  REQUIRE(got->has_value());
  CHECK(**got == 0);

  auto load = std::async(std::launch::async, [&] { return client->Load(); });
  r = daemon.Next();
  REQUIRE(r);
  REQUIRE(r->message.has_load());
  CHECK(!r->message.load().has_step());
  CHECK(r->message.load().strict());
  reply.Clear();
  reply.mutable_load()->set_step(42);
  daemon.Reply(r->message.request_id(), reply);
  auto loaded = Finish(daemon, load);
  REQUIRE_OK(loaded);
  CHECK(loaded->step == 42);
}

TEST_CASE("client: a held save is held only when the daemon says so, and confirmed by step",
          "[client]") {
  ckpt::testing::TempDir dir;
  FakeDaemon daemon(dir / "ckptd.sock");
  auto client = ConnectTo(daemon, Options(daemon.path()));
  bool held = true;
  ckpt::SaveOptions options;
  options.hold = true;
  options.held = &held;

  // A daemon that ignores Save.hold (protocol 2) answers without `held`: it reads at once.
  auto save = std::async(std::launch::async, [&] { return client->Save(5, options); });
  auto r = daemon.Next();
  REQUIRE(r);
  REQUIRE(r->message.has_save());
  CHECK(r->message.save().hold());
  CHECK_FALSE(r->message.save().replace_held());
  pb::DaemonMessage reply;
  reply.mutable_save()->set_step(5);
  daemon.Reply(r->message.request_id(), reply);
  REQUIRE_OK(Finish(daemon, save));
  CHECK_FALSE(held);
  CHECK(client->ConfirmSave(5).code() == ckpt::StatusCode::kFailedPrecondition);

  // Held: the next save waits for its confirm, which goes out as ConfirmSave of that step.
  save = std::async(std::launch::async, [&] { return client->Save(6, options); });
  r = daemon.Next();
  REQUIRE(r);
  REQUIRE(r->message.has_save());
  reply.mutable_save()->set_step(6);
  reply.mutable_save()->set_held(true);
  daemon.Reply(r->message.request_id(), reply);
  REQUIRE_OK(Finish(daemon, save));
  CHECK(held);
  const ckpt::Status refused = client->Save(7);
  CHECK(refused.code() == ckpt::StatusCode::kFailedPrecondition);
  CHECK_THAT(refused.message(), Catch::Contains("step 6 is held"));
  REQUIRE_OK(client->ConfirmSave(6));
  r = daemon.Next();
  REQUIRE(r);
  REQUIRE(r->message.has_confirm_save());
  CHECK(r->message.confirm_save().step() == 6);
}

TEST_CASE("client: a posted save returns once written, and the next call takes its answer",
          "[client]") {
  ckpt::testing::TempDir dir;
  FakeDaemon daemon(dir / "ckptd.sock");
  ClientOptions client_options = Options(daemon.path());
  client_options.call_timeout = milliseconds(2000);
  auto client = ConnectTo(daemon, client_options, /*protocol=*/3);
  bool held = false;
  ckpt::SaveOptions options;
  options.hold = true;
  options.post = true;
  options.held = &held;
  pb::DaemonMessage reply;
  auto answer_save = [&](const Received& r, uint64_t step) {
    reply.Clear();
    reply.mutable_save()->set_step(step);
    reply.mutable_save()->set_held(true);
    daemon.Reply(r.message.request_id(), reply);
  };

  // Returns with nothing answered (no std::async: a wait for the answer would hang here); the
  // confirm goes out behind it, and the fence takes the answer before it asks its own question.
  REQUIRE_OK(client->Save(5, options));
  CHECK(held);
  auto r = daemon.Next();
  REQUIRE(r);
  REQUIRE(r->message.has_save());
  CHECK(r->message.save().step() == 5);
  CHECK(r->message.save().hold());
  REQUIRE_OK(client->ConfirmSave(5));
  auto confirm = daemon.Next();
  REQUIRE(confirm);
  REQUIRE(confirm->message.has_confirm_save());
  auto snapshot = std::async(std::launch::async, [&] { return client->WaitSnapshot(); });
  answer_save(*r, 5);
  auto w = daemon.Next();
  REQUIRE(w);
  REQUIRE(w->message.has_wait_snapshot());
  reply.Clear();
  reply.mutable_wait()->set_step(5);
  reply.mutable_wait()->set_state(pb::STEP_STATE_CAPTURED);
  daemon.Reply(w->message.request_id(), reply);
  REQUIRE_OK(Finish(daemon, snapshot));
  daemon.SendEvent(5, pb::STEP_STATE_CAPTURED);  // as the daemon says, and known to the client
  ExpectNextIsLatest(daemon, *client);           // after this round trip

  // A refusal is the fence's answer; with step 5 known captured, the fence asks nothing more
  // (the next frame is a Latest).
  REQUIRE_OK(client->Save(6, options));
  r = daemon.Next();
  REQUIRE(r);
  daemon.ReplyError(r->message.request_id(), StatusCode::kFailedPrecondition,
                    "job job-a step 6: this rank already saved it");
  ckpt::Status s = client->WaitSnapshot();
  CHECK(s.code() == StatusCode::kFailedPrecondition);
  CHECK(s.message() == "job job-a step 6: this rank already saved it");
  ExpectNextIsLatest(daemon, *client);

  // Or the next save's, which is then not sent; the refused held save is held no more.
  REQUIRE_OK(client->Save(7, options));
  r = daemon.Next();
  REQUIRE(r);
  daemon.ReplyError(r->message.request_id(), StatusCode::kInvalidArgument, "step 7: no");
  s = client->Save(8);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Contains("save of step 8 not sent") && Catch::Contains("step 7"));
  ExpectNextIsLatest(daemon, *client);
  CHECK(client->ConfirmSave(7).code() == StatusCode::kFailedPrecondition);

  // A daemon that never answers: the fence gives up after call_timeout, naming the step, and
  // abandons it (the trainer is about to change the memory).
  REQUIRE_OK(client->Save(9, options));
  r = daemon.Next();
  REQUIRE(r);
  s = client->WaitSnapshot();
  CHECK(s.code() == StatusCode::kDeadlineExceeded);
  CHECK_THAT(s.message(), Catch::Contains("step 9"));
  auto abandon = daemon.Next();
  REQUIRE(abandon);
  REQUIRE(abandon->message.has_abandon());
  CHECK(abandon->message.abandon().step() == 9);
  answer_save(*r, 9);  // late: dropped
  ExpectNextIsLatest(daemon, *client);

  // A fence with a shorter timeout leaves the save outstanding; Abandon() names it.
  REQUIRE_OK(client->Save(10, options));
  r = daemon.Next();
  REQUIRE(r);
  s = client->WaitSnapshot(milliseconds(20));
  CHECK(s.code() == StatusCode::kDeadlineExceeded);
  CHECK_THAT(s.message(), Catch::Contains("step 10"));
  REQUIRE_OK(client->Abandon());
  abandon = daemon.Next();
  REQUIRE(abandon);
  REQUIRE(abandon->message.has_abandon());
  CHECK(abandon->message.abandon().step() == 10);

  // Two saves without a fence between them, the second refused: the fence returns the refusal
  // only once the first is captured — the trainer may change the memory after it.
  ckpt::SaveOptions plain;
  plain.post = true;
  REQUIRE_OK(client->Save(11, plain));
  r = daemon.Next();
  REQUIRE(r);
  reply.Clear();
  reply.mutable_save()->set_step(11);
  daemon.Reply(r->message.request_id(), reply);
  REQUIRE_OK(client->Save(12, plain));  // takes 11's answer: accepted
  r = daemon.Next();
  REQUIRE(r);
  REQUIRE(r->message.has_save());
  CHECK(r->message.save().step() == 12);
  snapshot = std::async(std::launch::async, [&] { return client->WaitSnapshot(); });
  daemon.ReplyError(r->message.request_id(), StatusCode::kFailedPrecondition,
                    "job job-a step 12: wait_snapshot before saving again");
  w = daemon.Next();  // the fence asks about step 11
  REQUIRE(w);
  REQUIRE(w->message.has_wait_snapshot());
  reply.Clear();
  reply.mutable_wait()->set_step(11);
  reply.mutable_wait()->set_state(pb::STEP_STATE_CAPTURED);
  daemon.Reply(w->message.request_id(), reply);
  s = Finish(daemon, snapshot);
  CHECK(s.code() == StatusCode::kFailedPrecondition);
  CHECK_THAT(s.message(), Catch::Contains("step 12"));

  // A replacement of a held save waits for its answer: it cannot be posted.
  ckpt::SaveOptions replace = options;
  replace.replace_held = true;
  CHECK(client->Save(13, replace).code() == StatusCode::kInvalidArgument);
}

TEST_CASE("client: save, wait and wait_snapshot send what the caller asked for", "[client]") {
  ckpt::testing::TempDir dir;
  FakeDaemon daemon(dir / "ckptd.sock");
  auto client = ConnectTo(daemon, Options(daemon.path()));

  auto save = std::async(std::launch::async,
                         [&] { return client->Save(5, "rng-state", ckpt::OnFull::kSkip); });
  auto r = daemon.Next();
  REQUIRE(r);
  REQUIRE(r->message.has_save());
  CHECK(r->message.save().step() == 5);
  CHECK(r->message.save().extra() == "rng-state");
  CHECK(r->message.save().on_full() == pb::FULL_POLICY_SKIP);
  pb::DaemonMessage reply;
  reply.mutable_save()->set_step(5);
  daemon.Reply(r->message.request_id(), reply);
  REQUIRE_OK(Finish(daemon, save));

  auto snapshot = std::async(std::launch::async, [&] { return client->WaitSnapshot(); });
  r = daemon.Next();
  REQUIRE(r);
  REQUIRE(r->message.has_wait_snapshot());
  reply.Clear();
  reply.mutable_wait()->set_step(5);
  reply.mutable_wait()->set_state(pb::STEP_STATE_CAPTURED);
  daemon.Reply(r->message.request_id(), reply);
  REQUIRE_OK(Finish(daemon, snapshot));

  const std::pair<ckpt::WaitState, pb::StepState> states[] = {
      {ckpt::WaitState::kCaptured, pb::STEP_STATE_CAPTURED},
      {ckpt::WaitState::kPersisted, pb::STEP_STATE_PERSISTED},
      {ckpt::WaitState::kCommitted, pb::STEP_STATE_COMMITTED}};
  for (const auto& [state, wire] : states) {
    auto wait = std::async(std::launch::async, [&, s = state] { return client->Wait(5, s); });
    r = daemon.Next();
    REQUIRE(r);
    REQUIRE(r->message.has_wait());
    CHECK(r->message.wait().step() == 5);
    CHECK(r->message.wait().state() == wire);
    reply.Clear();
    reply.mutable_wait()->set_step(5);
    reply.mutable_wait()->set_state(wire);
    daemon.Reply(r->message.request_id(), reply);
    REQUIRE_OK(Finish(daemon, wait));
  }
}

TEST_CASE("client: a daemon Error becomes a Status with the daemon's code and message",
          "[client]") {
  ckpt::testing::TempDir dir;
  FakeDaemon daemon(dir / "ckptd.sock");
  auto client = ConnectTo(daemon, Options(daemon.path()));

  auto save = std::async(std::launch::async, [&] { return client->Save(7); });
  auto r = daemon.Next();
  REQUIRE(r);
  daemon.ReplyError(r->message.request_id(), StatusCode::kResourceExhausted,
                    "job job-a step 7: skipped, host pool full (8 GiB)");
  ckpt::Status s = Finish(daemon, save);
  CHECK(s.code() == StatusCode::kResourceExhausted);
  CHECK(s.message() == "job job-a step 7: skipped, host pool full (8 GiB)");

  auto snapshot = std::async(std::launch::async, [&] { return client->WaitSnapshot(); });
  r = daemon.Next();
  REQUIRE(r);
  daemon.ReplyError(r->message.request_id(), StatusCode::kAborted,
                    "job job-a step 6 aborted: rank 3 died while capturing");
  s = Finish(daemon, snapshot);
  CHECK(s.code() == StatusCode::kAborted);
  CHECK(s.message() == "job job-a step 6 aborted: rank 3 died while capturing");

  // A code the client does not know still fails, as kUnknown, keeping the message.
  auto latest = std::async(std::launch::async, [&] { return client->Latest(); });
  r = daemon.Next();
  REQUIRE(r);
  daemon.ReplyError(r->message.request_id(), static_cast<StatusCode>(77), "from the future");
  auto l = Finish(daemon, latest);
  REQUIRE(!l.ok());
  CHECK(l.status().code() == StatusCode::kUnknown);
  CHECK_THAT(l.status().message(), Catch::Contains("from the future"));

  // The connection is still fine after errors.
  ExpectNextIsLatest(daemon, *client);
}

TEST_CASE("client: timeouts return kDeadlineExceeded naming the step, late replies are dropped",
          "[client]") {
  ckpt::testing::TempDir dir;
  FakeDaemon daemon(dir / "ckptd.sock");
  auto client = ConnectTo(daemon, Options(daemon.path()));

  auto save = std::async(std::launch::async, [&] { return client->Save(7); });
  auto r = daemon.Next();
  REQUIRE(r);
  pb::DaemonMessage reply;
  reply.mutable_save()->set_step(7);
  daemon.Reply(r->message.request_id(), reply);
  REQUIRE_OK(Finish(daemon, save));

  // The daemon never answers in time.
  ckpt::Status s = client->WaitSnapshot(milliseconds(50));
  CHECK(s.code() == StatusCode::kDeadlineExceeded);
  CHECK_THAT(s.message(), Catch::Contains("step 7"));
  auto late = daemon.Next();
  REQUIRE(late);
  REQUIRE(late->message.has_wait_snapshot());

  // An event for step 9, made visible to the client by the round trip behind it.
  daemon.SendEvent(9, pb::STEP_STATE_PERSISTING);
  ExpectNextIsLatest(daemon, *client);
  s = client->Wait(9, ckpt::WaitState::kCommitted, milliseconds(30));
  CHECK(s.code() == StatusCode::kDeadlineExceeded);
  CHECK_THAT(s.message(), Catch::Contains("step 9") && Catch::Contains("committed") &&
                              Catch::Contains("PERSISTING"));
  auto wait = daemon.Next();
  REQUIRE(wait);
  REQUIRE(wait->message.has_wait());

  // The late replies arrive now, ahead of the next call's reply: both are dropped.
  reply.Clear();
  reply.mutable_wait()->set_step(7);
  reply.mutable_wait()->set_state(pb::STEP_STATE_CAPTURED);
  daemon.Reply(late->message.request_id(), reply);
  daemon.ReplyError(wait->message.request_id(), StatusCode::kAborted, "late error");
  auto latest = std::async(std::launch::async, [&] { return client->Latest(); });
  r = daemon.Next();
  REQUIRE(r);
  reply.Clear();
  reply.mutable_latest()->set_has_step(true);
  reply.mutable_latest()->set_step(6);
  daemon.Reply(r->message.request_id(), reply);
  auto got = Finish(daemon, latest);
  REQUIRE_OK(got);
  REQUIRE(got->has_value());
  CHECK(**got == 6);
}

TEST_CASE("client: a daemon that closes the connection fails pending calls, the next re-attaches",
          "[client]") {
  ckpt::testing::TempDir dir;
  FakeDaemon daemon(dir / "ckptd.sock");
  auto client = ConnectTo(daemon, Options(daemon.path()));

  auto wait =
      std::async(std::launch::async, [&] { return client->Wait(3, ckpt::WaitState::kCommitted); });
  auto snapshot = std::async(std::launch::async, [&] { return client->WaitSnapshot(); });
  REQUIRE(daemon.Next());
  REQUIRE(daemon.Next());
  daemon.CloseConnection();
  const std::string lost = "connection to ckptd at " + daemon.path() + " lost";
  for (auto* call : {&wait, &snapshot}) {
    ckpt::Status s = Finish(daemon, *call);
    CHECK(s.code() == StatusCode::kUnavailable);
    CHECK_THAT(s.message(), Catch::StartsWith(lost));
  }
  // The next call connects again, introduces itself as a re-attach, and goes on.
  auto latest = std::async(std::launch::async, [&] { return client->Latest(); });
  AnswerHello(daemon, 2, /*expect_reattach=*/1);
  auto r = daemon.Next();
  REQUIRE(r);
  REQUIRE(r->message.has_latest());
  pb::DaemonMessage reply;
  reply.mutable_latest()->set_has_step(true);
  reply.mutable_latest()->set_step(3);
  daemon.Reply(r->message.request_id(), reply);
  auto got = Finish(daemon, latest);
  REQUIRE_OK(got);
  CHECK(*got == std::optional<uint64_t>(3));
  CHECK(client->reattaches() == 1);
  CHECK(daemon.connections() == 2);
}

TEST_CASE("client: an undecodable frame from the daemon breaks the connection", "[client]") {
  ckpt::testing::TempDir dir;
  FakeDaemon daemon(dir / "ckptd.sock");
  auto client = ConnectTo(daemon, Options(daemon.path()));
  auto latest = std::async(std::launch::async, [&] { return client->Latest(); });
  REQUIRE(daemon.Next());
  daemon.SendRaw(std::string("\xff\xff\xff\xff\x0f", 5));
  auto got = Finish(daemon, latest);
  CHECK(got.status().code() == StatusCode::kUnavailable);
  CHECK_THAT(got.status().message(), Catch::Contains("undecodable"));
}

TEST_CASE("client: an Error with request id 0 ends the connection with the daemon's message",
          "[client]") {
  ckpt::testing::TempDir dir;
  FakeDaemon daemon(dir / "ckptd.sock");
  auto client = ConnectTo(daemon, Options(daemon.path()));
  auto snapshot = std::async(std::launch::async, [&] { return client->WaitSnapshot(); });
  REQUIRE(daemon.Next());
  daemon.ReplyError(0, StatusCode::kInvalidArgument,
                    "protocol error: a frame of 3 bytes is not a ClientMessage");
  ckpt::Status s = Finish(daemon, snapshot);
  CHECK(s.code() == StatusCode::kUnavailable);
  CHECK_THAT(s.message(), Catch::StartsWith("connection to ckptd at " + daemon.path() + " lost") &&
                              Catch::Contains("a frame of 3 bytes is not a ClientMessage"));
  CHECK(!daemon.Next());  // the client hung up too
}

TEST_CASE("client: Close wakes pending calls and fails later ones", "[client]") {
  ckpt::testing::TempDir dir;
  FakeDaemon daemon(dir / "ckptd.sock");
  auto client = ConnectTo(daemon, Options(daemon.path()));
  auto snapshot = std::async(std::launch::async, [&] { return client->WaitSnapshot(); });
  REQUIRE(daemon.Next());
  client->Close();
  CHECK(Finish(daemon, snapshot).code() == StatusCode::kCancelled);
  CHECK(client->Save(1).code() == StatusCode::kCancelled);
  client->Close();        // idempotent
  CHECK(!daemon.Next());  // the daemon saw the connection end, and no further frame
}

TEST_CASE("client: 600 tensors in 600 memfds register in frames of at most 250 fds", "[client]") {
  ckpt::testing::TempDir dir;
  FakeDaemon daemon(dir / "ckptd.sock");
  auto client = ConnectTo(daemon, Options(daemon.path()));

  constexpr int kTensors = 600;
  constexpr uint64_t kBytes = 4096;
  std::vector<UniqueFd> memfds;
  std::vector<HostTensor> tensors;
  for (int i = 0; i < kTensors; ++i) {
    memfds.push_back(MakeMemfd(kBytes, static_cast<uint8_t>(i)));
    HostTensor t;
    t.name = "layers." + std::to_string(i) + ".weight";
    t.dtype = "uint8";
    if (i % 2 == 0) {
      t.global_shape = {kBytes};  // the whole tensor: an empty box
    } else {
      t.global_shape = {2, kBytes};
      t.flat = true;
      t.flat_offset = kBytes;
      t.numel = kBytes;
    }
    t.fd = memfds.back().get();
    t.nbytes = kBytes;
    tensors.push_back(std::move(t));
  }

  // Receives one registration, checks every frame against `tensors`, and answers the last.
  auto receive_registration = [&](bool succeed) -> size_t {
    size_t frames = 0;
    int seen = 0;
    std::set<uint64_t> ids;
    while (true) {
      auto r = daemon.Next();
      REQUIRE(r);
      REQUIRE(r->message.has_register_());
      ++frames;
      CHECK(r->message.request_id() != 0);
      ids.insert(r->message.request_id());
      const pb::Register& reg = r->message.register_();
      REQUIRE(r->fds.size() <= ckpt::kMaxFdsPerFrame);
      REQUIRE(r->fds.size() == static_cast<size_t>(reg.tensors_size()));  // all fds differ
      for (const pb::TensorSpec& spec : reg.tensors()) {
        const int i = seen++;
        INFO("tensor " << i);
        REQUIRE(spec.name() == tensors[i].name);
        CHECK(spec.dtype() == "uint8");
        REQUIRE(spec.has_host());
        CHECK(spec.host().offset() == 0);
        CHECK(spec.host().length() == kBytes);
        REQUIRE(spec.host().fd_index() < r->fds.size());
        const int fd = r->fds[spec.host().fd_index()].get();
        CHECK(Inode(fd) == Inode(memfds[i].get()));
        CHECK(MappedBytes(fd, 0, kBytes) == MappedBytes(memfds[i].get(), 0, kBytes));
        if (i % 2 == 0) {
          REQUIRE(spec.geometry().has_box());
          CHECK(spec.geometry().box().offsets().size() == 1);
          CHECK(spec.geometry().box().offsets(0) == 0);
          CHECK(spec.geometry().box().lengths(0) == kBytes);
        } else {
          REQUIRE(spec.geometry().has_flat());
          CHECK(spec.geometry().flat().flat_offset() == kBytes);
          CHECK(spec.geometry().flat().numel() == kBytes);
          CHECK(spec.global_shape().size() == 2);
        }
      }
      if (!reg.more()) {
        if (succeed) {
          pb::DaemonMessage reply;
          reply.mutable_register_()->set_tensors(kTensors);
          reply.mutable_register_()->set_bytes(kTensors * kBytes);
          daemon.Reply(r->message.request_id(), reply);
        } else {
          daemon.ReplyError(r->message.request_id(), StatusCode::kInvalidArgument,
                            "tensor 'layers.0.weight': cannot map fd");
        }
        break;
      }
    }
    CHECK(seen == kTensors);
    CHECK(ids.size() == frames);
    return frames;
  };

  auto call = std::async(std::launch::async, [&] { return client->Register(tensors); });
  CHECK(receive_registration(true) >= 3);
  REQUIRE_OK(Finish(daemon, call));

  // The same set again: nothing is sent (the next frame the daemon sees is the Latest).
  call = std::async(std::launch::async, [&] { return client->Register(tensors); });
  REQUIRE_OK(Finish(daemon, call));
  ExpectNextIsLatest(daemon, *client);

  // A changed set is sent; a refused one is not cached, so repeating it sends it again.
  tensors[0].name = "layers.0.bias";
  call = std::async(std::launch::async, [&] { return client->Register(tensors); });
  receive_registration(false);
  ckpt::Status refused = Finish(daemon, call);
  CHECK(refused.code() == StatusCode::kInvalidArgument);
  CHECK(refused.message() == "tensor 'layers.0.weight': cannot map fd");
  call = std::async(std::launch::async, [&] { return client->Register(tensors); });
  receive_registration(true);
  REQUIRE_OK(Finish(daemon, call));

  // Another file behind the fd (usually under the same fd number): not the same registration.
  memfds[5] = UniqueFd();
  memfds[5] = MakeMemfd(kBytes, 200);
  tensors[5].fd = memfds[5].get();
  call = std::async(std::launch::async, [&] { return client->Register(tensors); });
  receive_registration(true);
  REQUIRE_OK(Finish(daemon, call));
}

TEST_CASE("client: tensors sharing one memfd send it once per frame", "[client]") {
  ckpt::testing::TempDir dir;
  FakeDaemon daemon(dir / "ckptd.sock");
  auto client = ConnectTo(daemon, Options(daemon.path()));

  constexpr int kTensors = 10;
  UniqueFd memfd = MakeMemfd(kTensors * 4096, 3);
  std::vector<HostTensor> tensors;
  for (int i = 0; i < kTensors; ++i) {
    HostTensor t;
    t.name = "shared." + std::to_string(i);
    t.dtype = "float32";
    t.global_shape = {uint64_t{kTensors} * 8, 128};
    t.offsets = {uint64_t(i) * 8, 0};
    t.lengths = {8, 128};
    t.fd = memfd.get();
    t.fd_offset = uint64_t(i) * 4096;
    t.nbytes = 8 * 128 * 4;
    tensors.push_back(std::move(t));
  }
  auto call = std::async(std::launch::async, [&] { return client->Register(tensors); });
  auto r = daemon.Next();
  REQUIRE(r);
  REQUIRE(r->message.has_register_());
  const pb::Register& reg = r->message.register_();
  CHECK(!reg.more());
  REQUIRE(reg.tensors_size() == kTensors);
  REQUIRE(r->fds.size() == 1);
  const auto all = MappedBytes(memfd.get(), 0, kTensors * 4096);
  for (int i = 0; i < kTensors; ++i) {
    const pb::TensorSpec& spec = reg.tensors(i);
    CHECK(spec.host().fd_index() == 0);
    CHECK(spec.host().offset() == uint64_t(i) * 4096);
    CHECK(spec.geometry().box().offsets(0) == uint64_t(i) * 8);
    CHECK(spec.geometry().box().lengths(1) == 128);
    CHECK(MappedBytes(r->fds[0].get(), spec.host().offset(), spec.host().length()) ==
          std::vector<uint8_t>(all.begin() + i * 4096, all.begin() + i * 4096 + 4096));
  }
  pb::DaemonMessage reply;
  reply.mutable_register_()->set_tensors(kTensors);
  daemon.Reply(r->message.request_id(), reply);
  REQUIRE_OK(Finish(daemon, call));
}

TEST_CASE("client: a large registration is split into frames of about 8 MiB", "[client]") {
  ckpt::testing::TempDir dir;
  FakeDaemon daemon(dir / "ckptd.sock");
  auto client = ConnectTo(daemon, Options(daemon.path()));

  constexpr int kTensors = 12000;
  UniqueFd memfd = MakeMemfd(4096, 9);
  std::vector<HostTensor> tensors;
  for (int i = 0; i < kTensors; ++i) {
    HostTensor t;
    t.name = std::string(900, 'n') + std::to_string(i);
    t.dtype = "uint8";
    t.global_shape = {uint64_t{kTensors}};
    t.offsets = {uint64_t(i)};
    t.lengths = {1};
    t.fd = memfd.get();
    t.fd_offset = uint64_t(i) % 4096;
    t.nbytes = 1;
    tensors.push_back(std::move(t));
  }
  auto call = std::async(std::launch::async, [&] { return client->Register(tensors); });
  int seen = 0;
  int frames = 0;
  while (true) {
    auto r = daemon.Next();
    REQUIRE(r);
    REQUIRE(r->message.has_register_());
    ++frames;
    CHECK(r->payload_bytes <= (9u << 20));
    CHECK(r->fds.size() == 1);  // the shared fd travels with every frame
    CHECK(Inode(r->fds[0].get()) == Inode(memfd.get()));
    for (const auto& spec : r->message.register_().tensors()) {
      CHECK(spec.host().fd_index() == 0);
      CHECK(spec.geometry().box().offsets(0) == uint64_t(seen));
      ++seen;
    }
    if (!r->message.register_().more()) {
      pb::DaemonMessage reply;
      reply.mutable_register_()->set_tensors(kTensors);
      daemon.Reply(r->message.request_id(), reply);
      break;
    }
  }
  CHECK(frames >= 2);
  CHECK(seen == kTensors);
  REQUIRE_OK(Finish(daemon, call));
}

TEST_CASE("client: Register checks tensors before sending anything", "[client]") {
  ckpt::testing::TempDir dir;
  FakeDaemon daemon(dir / "ckptd.sock");
  auto client = ConnectTo(daemon, Options(daemon.path()));
  UniqueFd memfd = MakeMemfd(4096, 1);
  const HostTensor good{
      .name = "w", .dtype = "float32", .global_shape = {4, 256}, .fd = memfd.get(), .nbytes = 4096};

  auto refused = [&](HostTensor t) {
    ckpt::Status s = client->Register({&t, 1});
    INFO(s.ToString());
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK_THAT(s.message(), Catch::Contains("'" + t.name + "'") || Catch::Contains("dtype"));
  };
  HostTensor t = good;
  t.dtype = "float31";
  refused(t);
  t = good;
  t.nbytes = 4000;
  refused(t);
  t = good;
  t.fd = -1;
  refused(t);
  t = good;
  t.fd_offset = 4;  // past the end of the 4 KiB memfd
  refused(t);
  t = good;
  t.offsets = {0};
  t.lengths = {4};  // rank 1 box for a rank 2 tensor
  refused(t);
  ExpectNextIsLatest(daemon, *client);  // nothing was sent
}

TEST_CASE("client: the example trainer saves sharded, deterministic tensors and fences itself",
          "[client]") {
  namespace ex = ckpt::example;
  ckpt::testing::TempDir dir;
  FakeDaemon daemon(dir / "ckptd.sock");
  constexpr uint64_t kSeed = 11;
  constexpr uint32_t kRank = 1;
  ChildProcess trainer({TrainerBinary(),
                        "--socket",
                        daemon.path(),
                        "--job",
                        "trainer-job",
                        "--rank",
                        "1",
                        "--world-size",
                        "2",
                        "--steps",
                        "3",
                        "--start-step",
                        "5",
                        "--tensors",
                        "3",
                        "--bytes-per-rank",
                        "48KiB",
                        "--seed",
                        "11",
                        "--wait",
                        "persisted",
                        "--quiet"});
  auto hello = daemon.Next();
  REQUIRE(hello);
  REQUIRE(hello->message.has_hello());
  CHECK(hello->message.hello().job() == "trainer-job");
  CHECK(hello->message.hello().rank() == kRank);
  CHECK(hello->message.hello().world_size() == 2);
  pb::DaemonMessage reply;
  reply.mutable_hello()->set_protocol_version(1);
  daemon.Reply(hello->message.request_id(), reply);

  const ex::TrainerLayout layout = ex::MakeTrainerLayout(48 << 10, 3, 2);
  REQUIRE(layout.tensors.size() == 3);
  CHECK(layout.tensors[0].rows * layout.tensors[0].cols * 4 == 16 << 10);
  auto reg = daemon.Next();
  REQUIRE(reg);
  REQUIRE(reg->message.has_register_());
  CHECK(!reg->message.register_().more());
  REQUIRE(reg->fds.size() == 1);
  REQUIRE(reg->message.register_().tensors_size() == 3);
  for (int t = 0; t < 3; ++t) {
    const pb::TensorSpec& spec = reg->message.register_().tensors(t);
    const ex::TrainerTensor& want = layout.tensors[t];
    CHECK(spec.name() == want.name);
    CHECK(spec.dtype() == "int32");
    CHECK(std::vector<uint64_t>(spec.global_shape().begin(), spec.global_shape().end()) ==
          layout.GlobalShape(want));
    REQUIRE(spec.geometry().has_box());
    CHECK(spec.geometry().box().offsets(0) == kRank * want.rows);
    CHECK(spec.geometry().box().offsets(1) == 0);
    CHECK(spec.geometry().box().lengths(0) == want.rows);
    CHECK(spec.geometry().box().lengths(1) == want.cols);
    CHECK(spec.host().offset() == want.fd_offset);
    CHECK(spec.host().length() == want.nbytes);
  }
  reply.Clear();
  reply.mutable_register_()->set_tensors(3);
  daemon.Reply(reg->message.request_id(), reply);

  for (uint64_t step = 5; step <= 7; ++step) {
    INFO("step " << step);
    auto save = daemon.Next();
    REQUIRE(save);
    REQUIRE(save->message.has_save());
    CHECK(save->message.save().step() == step);
    CHECK_THAT(save->message.save().extra(), Catch::Contains("step=" + std::to_string(step)));
    reply.Clear();
    reply.mutable_save()->set_step(step);
    daemon.Reply(save->message.request_id(), reply);
    auto fence = daemon.Next();
    REQUIRE(fence);
    REQUIRE(fence->message.has_wait_snapshot());
    // Until this WaitSnapshot is answered the trainer must leave its memory alone: it holds
    // exactly the values of `step`.
    for (uint32_t t = 0; t < 3; ++t) {
      const ex::TrainerTensor& want = layout.tensors[t];
      const std::vector<uint8_t> bytes =
          MappedBytes(reg->fds[0].get(), want.fd_offset, want.nbytes);
      std::vector<uint32_t> expected(want.rows * want.cols);
      ex::FillShard(expected.data(), expected.size(), kSeed, kRank, step, t);
      CHECK(std::memcmp(bytes.data(), expected.data(), want.nbytes) == 0);
      CHECK(expected[5] ==
            ex::GlobalElementValue(layout, kSeed, step, t, kRank * want.rows * want.cols + 5));
    }
    reply.Clear();
    reply.mutable_wait()->set_step(step);
    reply.mutable_wait()->set_state(pb::STEP_STATE_CAPTURED);
    daemon.Reply(fence->message.request_id(), reply);
  }
  auto wait = daemon.Next();
  REQUIRE(wait);
  REQUIRE(wait->message.has_wait());
  CHECK(wait->message.wait().step() == 7);
  CHECK(wait->message.wait().state() == pb::STEP_STATE_PERSISTED);
  reply.Clear();
  reply.mutable_wait()->set_step(7);
  reply.mutable_wait()->set_state(pb::STEP_STATE_PERSISTED);
  daemon.Reply(wait->message.request_id(), reply);
  const int status = trainer.Wait();
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

TEST_CASE("client: the example trainer can kill itself after a save, and fails on errors",
          "[client]") {
  ckpt::testing::TempDir dir;
  auto handshake = [](FakeDaemon& daemon) {
    auto hello = daemon.Next();
    REQUIRE(hello);
    pb::DaemonMessage reply;
    reply.mutable_hello()->set_protocol_version(1);
    daemon.Reply(hello->message.request_id(), reply);
    auto reg = daemon.Next();
    REQUIRE(reg);
    REQUIRE(reg->message.has_register_());
    reply.Clear();
    reply.mutable_register_();
    daemon.Reply(reg->message.request_id(), reply);
  };
  SECTION("--kill-self-after-save") {
    FakeDaemon daemon(dir / "ckptd.sock");
    ChildProcess trainer({TrainerBinary(), "--socket", daemon.path(), "--job", "j", "--steps", "5",
                          "--tensors", "2", "--bytes-per-rank", "8KiB", "--kill-self-after-save",
                          "2", "--quiet"});
    handshake(daemon);
    pb::DaemonMessage reply;
    for (uint64_t step = 1; step <= 2; ++step) {
      auto save = daemon.Next();
      REQUIRE(save);
      REQUIRE(save->message.has_save());
      reply.Clear();
      reply.mutable_save()->set_step(step);
      daemon.Reply(save->message.request_id(), reply);
      if (step == 2) break;
      auto fence = daemon.Next();
      REQUIRE(fence);
      REQUIRE(fence->message.has_wait_snapshot());
      reply.Clear();
      reply.mutable_wait()->set_step(step);
      daemon.Reply(fence->message.request_id(), reply);
    }
    CHECK(!daemon.Next());  // the connection ends instead of a WaitSnapshot
    const int status = trainer.Wait();
    CHECK(WIFSIGNALED(status));
    CHECK(WTERMSIG(status) == SIGKILL);
  }
  SECTION("an error from the daemon") {
    FakeDaemon daemon(dir / "ckptd.sock");
    ChildProcess trainer({TrainerBinary(), "--socket", daemon.path(), "--job", "j", "--steps", "5",
                          "--tensors", "2", "--bytes-per-rank", "8KiB", "--quiet"});
    handshake(daemon);
    auto save = daemon.Next();
    REQUIRE(save);
    daemon.ReplyError(save->message.request_id(), StatusCode::kFailedPrecondition, "no");
    const int status = trainer.Wait();
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 1);
  }
}
