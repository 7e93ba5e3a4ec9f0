// The client's deadlines and its re-attach state machine, against the scripted fake daemon
// (fake_daemon.h): what a frozen, dead or restarted daemon looks like from a trainer, frame by
// frame. The same behaviour against real daemon processes: daemon_reattach_test.cpp.
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <string>

#include "ckpt/client.h"
#include "tests/integration/fake_daemon.h"
#include "tests/test_util.h"

namespace {

using namespace ckpt::itest::fake;  // NOLINT: the fake daemon and its helpers
using ckpt::HostTensor;

ClientOptions Quick(const std::string& socket, milliseconds call_timeout) {
  ClientOptions o = Options(socket);
  o.call_timeout = call_timeout;
  return o;
}

void AnswerRegister(FakeDaemon& daemon, const Received& r) {
  pb::DaemonMessage reply;
  reply.mutable_register_()->set_tensors(
      static_cast<uint32_t>(r.message.register_().tensors_size()));
  daemon.Reply(r.message.request_id(), reply);
}

void AnswerSave(FakeDaemon& daemon, const Received& r) {
  pb::DaemonMessage reply;
  reply.mutable_save()->set_step(r.message.save().step());
  daemon.Reply(r.message.request_id(), reply);
}

// Registers one 4 KiB memfd tensor "w" through the fake daemon.
void RegisterOne(FakeDaemon& daemon, Client& client, int fd) {
  HostTensor t{.name = "w", .dtype = "uint8", .global_shape = {4096}, .fd = fd, .nbytes = 4096};
  auto call = std::async(std::launch::async, [&] { return client.Register({&t, 1}); });
  auto r = daemon.Next();
  REQUIRE(r);
  REQUIRE(r->message.has_register_());
  REQUIRE(r->fds.size() == 1);
  CHECK(Inode(r->fds[0].get()) == Inode(fd));
  AnswerRegister(daemon, *r);
  REQUIRE_OK(Finish(daemon, call));
}

ckpt::Status SaveThrough(FakeDaemon& daemon, Client& client, uint64_t step) {
  auto call = std::async(std::launch::async, [&] { return client.Save(step); });
  auto r = daemon.Next();
  REQUIRE(r);
  REQUIRE(r->message.has_save());
  CHECK(r->message.save().step() == step);
  AnswerSave(daemon, *r);
  return Finish(daemon, call);
}

}  // namespace

TEST_CASE("client: a re-attach re-registers the same memory, then makes the call", "[client]") {
  ckpt::testing::TempDir dir;
  FakeDaemon daemon(dir / "ckptd.sock");
  auto client = ConnectTo(daemon, Options(daemon.path()));
  UniqueFd memfd = MakeMemfd(4096, 3);
  RegisterOne(daemon, *client, memfd.get());
  REQUIRE_OK(SaveThrough(daemon, *client, 1));
  daemon.CloseConnection();  // the daemon "restarts"

  auto save = std::async(std::launch::async, [&] { return client->Save(2); });
  AnswerHello(daemon, 2, /*expect_reattach=*/1);
  auto reg = daemon.Next();
  REQUIRE(reg);
  REQUIRE(reg->message.has_register_());
  REQUIRE(reg->message.register_().tensors_size() == 1);
  CHECK(reg->message.register_().tensors(0).name() == "w");
  REQUIRE(reg->fds.size() == 1);
  CHECK(Inode(reg->fds[0].get()) == Inode(memfd.get()));  // the same memory, sent again
  AnswerRegister(daemon, *reg);
  auto r = daemon.Next();
  REQUIRE(r);
  REQUIRE(r->message.has_save());
  CHECK(r->message.save().step() == 2);
  AnswerSave(daemon, *r);
  REQUIRE_OK(Finish(daemon, save));
  CHECK(client->reattaches() == 1);
  CHECK(client->registered());
}

TEST_CASE("client: a re-attach never sends a descriptor that now names other memory", "[client]") {
  ckpt::testing::TempDir dir;
  FakeDaemon daemon(dir / "ckptd.sock");
  auto client = ConnectTo(daemon, Options(daemon.path()));
  UniqueFd memfd = MakeMemfd(4096, 3);
  RegisterOne(daemon, *client, memfd.get());
  // The trainer freed the memory and the descriptor number was reused for other memory.
  UniqueFd other = MakeMemfd(4096, 9);
  REQUIRE(::dup2(other.get(), memfd.get()) == memfd.get());
  daemon.CloseConnection();

  auto save = std::async(std::launch::async, [&] { return client->Save(2); });
  AnswerHello(daemon, 2, /*expect_reattach=*/1);
  ckpt::Status st = Finish(daemon, save);
  CHECK(st.code() == StatusCode::kFailedPrecondition);
  CHECK_THAT(st.message(), Catch::Contains("register them again"));
  CHECK(!client->registered());
  // Nothing was sent after the hello; a new Register and Save go through the same connection.
  RegisterOne(daemon, *client, memfd.get());
  REQUIRE_OK(SaveThrough(daemon, *client, 2));
  CHECK(daemon.connections() == 2);
}

TEST_CASE(
    "client: a save the daemon does not answer times out after call_timeout and is "
    "abandoned",
    "[client]") {
  ckpt::testing::TempDir dir;
  FakeDaemon daemon(dir / "ckptd.sock");
  // Long enough for this thread to answer the Latest at the end on a loaded machine.
  auto client = ConnectTo(daemon, Quick(daemon.path(), milliseconds(1000)));
  CHECK(client->call_timeout() == milliseconds(1000));

  // Protocol 2: an Abandon of the step follows the unanswered Save on the same connection.
  ckpt::Status st = client->Save(5);
  CHECK(st.code() == StatusCode::kDeadlineExceeded);
  CHECK_THAT(st.message(), Catch::Contains("save of step 5") && Catch::Contains("timed out"));
  auto save = daemon.Next();
  REQUIRE(save);
  CHECK(save->message.has_save());
  auto abandon = daemon.Next();
  REQUIRE(abandon);
  REQUIRE(abandon->message.has_abandon());
  CHECK(abandon->message.abandon().step() == 5);
  // The connection is still good; the late reply is dropped.
  AnswerSave(daemon, *save);
  ExpectNextIsLatest(daemon, *client);
}

TEST_CASE("client: with a protocol 1 daemon an abandoned save ends the connection instead",
          "[client]") {
  ckpt::testing::TempDir dir;
  FakeDaemon daemon(dir / "ckptd.sock");
  auto client = ConnectTo(daemon, Quick(daemon.path(), milliseconds(200)), /*protocol=*/1);
  CHECK(client->Save(5).code() == StatusCode::kDeadlineExceeded);
  auto save = daemon.Next();
  REQUIRE(save);
  CHECK(save->message.has_save());
  CHECK(!daemon.Next());  // EOF: a protocol 1 daemon aborts the uncaptured step on it
}

TEST_CASE("client: Abandon sends the last saved step and frees the fence", "[client]") {
  ckpt::testing::TempDir dir;
  FakeDaemon daemon(dir / "ckptd.sock");
  auto client = ConnectTo(daemon, Options(daemon.path()));
  REQUIRE_OK(SaveThrough(daemon, *client, 8));
  REQUIRE_OK(client->Abandon(std::nullopt, "fence gave up"));
  auto abandon = daemon.Next();
  REQUIRE(abandon);
  REQUIRE(abandon->message.has_abandon());
  CHECK(abandon->message.abandon().step() == 8);
  CHECK(abandon->message.abandon().reason() == "fence gave up");
  // Nothing left to wait for: WaitSnapshot asks the daemon, which has nothing pending either.
  auto snapshot = std::async(std::launch::async, [&] { return client->WaitSnapshot(); });
  auto r = daemon.Next();
  REQUIRE(r);
  REQUIRE(r->message.has_wait_snapshot());
  pb::DaemonMessage reply;
  reply.mutable_wait()->set_state(pb::STEP_STATE_CAPTURED);
  daemon.Reply(r->message.request_id(), reply);
  REQUIRE_OK(Finish(daemon, snapshot));
}

TEST_CASE("client: a wait goes on while the daemon answers probes and fails once it stops",
          "[client]") {
  ckpt::testing::TempDir dir;
  FakeDaemon daemon(dir / "ckptd.sock");
  // Each probe is answered by this thread through the fake daemon's: a call timeout well above
  // a loaded machine's scheduling delays, so only the daemon's silence can end the wait.
  auto client = ConnectTo(daemon, Quick(daemon.path(), milliseconds(1500)));
  REQUIRE_OK(SaveThrough(daemon, *client, 4));
  auto snapshot = std::async(std::launch::async, [&] { return client->WaitSnapshot(); });
  auto w = daemon.Next();
  REQUIRE(w);
  REQUIRE(w->message.has_wait_snapshot());
  // A live daemon answers every probe: the wait outlasts several call timeouts.
  constexpr int kPongs = 10;  // probes every call_timeout / 4: 2.5 call timeouts
  for (int i = 0; i < kPongs; ++i) {
    auto ping = daemon.Next();
    REQUIRE(ping);
    REQUIRE(ping->message.has_ping());
    pb::DaemonMessage pong;
    pong.mutable_pong();
    daemon.Reply(ping->message.request_id(), pong);
  }
  CHECK(snapshot.wait_for(milliseconds(0)) != std::future_status::ready);
  // Then it freezes: the wait ends within about one call timeout.
  ckpt::Status st = Finish(daemon, snapshot);
  CHECK(st.code() == StatusCode::kDeadlineExceeded);
  CHECK_THAT(st.message(), Catch::Contains("answered nothing") && Catch::Contains("step 4"));
}

TEST_CASE("client: while the daemon is unreachable, re-attach backs off and calls fail at once",
          "[client]") {
  ckpt::testing::TempDir dir;
  std::unique_ptr<Client> client;
  {
    FakeDaemon daemon(dir / "ckptd.sock");
    client = ConnectTo(daemon, Options(daemon.path()));
  }  // the daemon is gone: its socket file too
  // The first call may still find the old connection (and learn it broke); the one after it
  // tries to connect again and gives up within its window.
  ckpt::Status first;
  for (int i = 0; i < 2 && first.message().find("is not listening") == std::string::npos; ++i) {
    first = client->Save(1);
    CHECK(first.code() == StatusCode::kUnavailable);
  }
  CHECK_THAT(first.message(), Catch::Contains("is not listening") && Catch::Contains("ckptd.sock"));
  // The next call inside the backoff fails at once. One that comes after it (this thread was
  // descheduled for longer than the first backoff, 100 ms) tries again instead; each failed try
  // doubles the backoff, so a few calls suffice.
  ckpt::Status second;
  for (int i = 0; i < 5; ++i) {
    second = client->Save(1);
    CHECK(second.code() == StatusCode::kUnavailable);
    if (second.message().find("next attempt to reconnect in") != std::string::npos) break;
  }
  CHECK_THAT(second.message(), Catch::Contains("next attempt to reconnect in"));
  CHECK(client->reattaches() == 0);
}
