// Registration off the daemon's loop (daemon/session.h): mapping a large registration
// (MAP_POPULATE, ~0.7 s per GiB) runs on the register pool, so it holds up neither the other
// sessions on the node nor the daemon's shutdown, and a session that goes away meanwhile
// leaves nothing mapped behind.
//
// Size of the large registration: CKPT_TEST_REGISTER_BYTES (bytes), else 4 GiB, or 512 MiB when
// this binary is built with a sanitizer (kUnderSanitizer: CI memory and time). The tests that
// only need a registration to be in flight use a quarter of it.
//
// Nothing sleeps to synchronise: "in flight" is seen in the daemon's /proc/PID/maps (the memfd
// is mapped while it is being populated) or proved by timestamps taken around the round trips.
#include "tests/integration/daemon_harness.h"  // first: it configures Catch

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace pb = ::ckptd::v1;
using ckpt::HostTensor;
using ckpt::UniqueFd;
using ckpt::itest::DaemonProcess;
using ckpt::itest::ExitedWith;
using ckpt::itest::HostSpec;
using ckpt::itest::PollUntil;
using ckpt::itest::RawConnection;
using ckpt::itest::ReadWholeFile;
using ckpt::testing::TempDir;
using Clock = std::chrono::steady_clock;

uint64_t LargeRegistrationBytes() {
  if (const char* env = std::getenv("CKPT_TEST_REGISTER_BYTES"); env != nullptr && *env != 0) {
    return std::stoull(env);
  }
  return ckpt::testing::kUnderSanitizer ? (512ull << 20) : (4ull << 30);
}

// A memfd of `bytes` (pages allocated only when the daemon populates its mapping).
UniqueFd MakeMemfd(const std::string& name, uint64_t bytes) {
  UniqueFd fd(::memfd_create(name.c_str(), MFD_CLOEXEC));
  REQUIRE(fd);
  REQUIRE(::ftruncate(fd.get(), static_cast<off_t>(bytes)) == 0);
  return fd;
}

// True while the daemon has the memfd called `name` mapped.
bool DaemonMaps(const DaemonProcess& daemon, const std::string& name) {
  return ReadWholeFile("/proc/" + std::to_string(daemon.pid()) + "/maps")
             .find("/memfd:" + name + " ") != std::string::npos;
}

pb::ClientMessage RegisterOne(const std::string& tensor, uint64_t bytes) {
  pb::ClientMessage m;
  *m.mutable_register_()->add_tensors() = HostSpec(tensor, "uint8", {bytes}, 0, bytes);
  return m;
}

// A session registered with one small tensor, saving through the real client.
struct SmallRank {
  static constexpr uint64_t kBytes = 256 << 10;
  UniqueFd memfd;
  std::unique_ptr<ckpt::Client> client;

  SmallRank(const DaemonProcess& daemon, const std::string& job)
      : memfd(MakeMemfd("itest-small-" + job, kBytes)), client(daemon.Connect(job)) {
    HostTensor t;
    t.name = "w";
    t.dtype = "uint8";
    t.global_shape = {kBytes};
    t.fd = memfd.get();
    t.nbytes = kBytes;
    REQUIRE_OK(client->Register(std::span<const HostTensor>(&t, 1)));
  }
  void SaveAndWait(uint64_t step) {
    REQUIRE_OK(client->Save(step));
    REQUIRE_OK(client->WaitSnapshot());
  }
};

}  // namespace

TEST_CASE("daemon: a large registration does not hold up another session's saves",
          "[daemon][register]") {
  TempDir dir;
  auto options = DaemonProcess::InDir(dir);
  options.flags = {"--keep", "2"};
  DaemonProcess daemon(options);
  const uint64_t big = LargeRegistrationBytes();
  SmallRank b(daemon, "small");
  b.SaveAndWait(1);

  RawConnection a(daemon.socket());
  REQUIRE(a.Hello("large").has_hello());
  UniqueFd memfd = MakeMemfd("itest-large", big);
  const int fds[] = {memfd.get()};

  // B saves and waits for each capture in a loop on its own thread until A's reply arrives.
  struct Cycle {
    Clock::time_point start, end;
    ckpt::Status status;
  };
  std::vector<Cycle> cycles;
  std::atomic<bool> registered{false};
  auto a_sent = Clock::now();
  a.Send(RegisterOne("huge", big), fds);
  std::thread saver([&] {
    for (uint64_t step = 2; !registered.load(); ++step) {
      Cycle c;
      c.start = Clock::now();
      c.status = b.client->Save(step);
      if (c.status.ok()) c.status = b.client->WaitSnapshot();
      c.end = Clock::now();
      cycles.push_back(c);
      if (!c.status.ok()) return;
    }
  });
  auto reply = a.Next();
  const auto a_answered = Clock::now();
  registered = true;
  saver.join();
  REQUIRE(reply.has_value());
  INFO("reply " << reply->ShortDebugString());
  REQUIRE(reply->has_register_());
  REQUIRE(reply->register_().bytes() == big);
  for (const auto& c : cycles) REQUIRE_OK(c.status);

  const double registration_s = std::chrono::duration<double>(a_answered - a_sent).count();
  // Every cycle B started before A was answered ran at least partly during the registration;
  // those that started and ended inside it prove the overlap.
  std::vector<double> latencies_ms;
  size_t inside = 0;
  for (const auto& c : cycles) {
    if (c.start >= a_answered) continue;
    latencies_ms.push_back(std::chrono::duration<double, std::milli>(c.end - c.start).count());
    if (c.start >= a_sent && c.end <= a_answered) ++inside;
  }
  REQUIRE(!latencies_ms.empty());
  std::sort(latencies_ms.begin(), latencies_ms.end());
  const double worst_ms = latencies_ms.back();
  const double p99_ms = latencies_ms[(latencies_ms.size() - 1) * 99 / 100];
  std::ostringstream measured;
  measured << "A registered " << big << " bytes in " << registration_s * 1e3 << " ms; B ran "
           << latencies_ms.size() << " save+wait cycles meanwhile (" << inside
           << " wholly inside it), p99 " << p99_ms << " ms, worst " << worst_ms << " ms";
  std::cout << "register: " << measured.str() << "\n";
  CHECK_TIMING(inside >= 5, measured.str());
  // The p99, not the worst: one cycle can lose the 2 cores to the registration's populate for
  // a while under a loaded ctest -j2 (worst 0.1–0.9 s seen), which is scheduling, not blocking.
  CHECK_TIMING(p99_ms < registration_s * 1e3 / 4, measured.str());

  // Both sessions go on as before.
  b.SaveAndWait(1'000'000);
  pb::ClientMessage save;
  save.mutable_save()->set_step(1);
  auto saved = a.Call(save);
  INFO("save reply " << saved.ShortDebugString());
  REQUIRE(saved.has_save());
}

TEST_CASE("daemon: a session closed while its registration runs leaves nothing behind",
          "[daemon][register]") {
  TempDir dir;
  DaemonProcess daemon(DaemonProcess::InDir(dir));
  const uint64_t big = LargeRegistrationBytes() / 4;
  SmallRank b(daemon, "small");
  b.SaveAndWait(1);
  UniqueFd memfd = MakeMemfd("itest-orphan", big);
  const int fds[] = {memfd.get()};
  uint64_t step = 2;

  SECTION("the trainer goes away") {
    uint64_t session_id = 0;
    {
      RawConnection a(daemon.socket());
      auto hello = a.Hello("orphan");
      REQUIRE(hello.has_hello());
      session_id = hello.hello().session_id();
      a.Send(RegisterOne("huge", big), fds);
      REQUIRE(PollUntil([&] { return DaemonMaps(daemon, "itest-orphan"); }));
      // A's connection closes here, its registration still running.
    }
    b.SaveAndWait(step++);
    const std::string closed = "session " + std::to_string(session_id) + ": closed";
    REQUIRE(PollUntil([&] { return daemon.Log().find(closed) != std::string::npos; }));
    // The registration's mapping went with the session.
    REQUIRE(PollUntil([&] { return !DaemonMaps(daemon, "itest-orphan"); }));
    b.SaveAndWait(step++);
    // A new session registers the same object and saves.
    RawConnection c(daemon.socket());
    REQUIRE(c.Hello("orphan").has_hello());
    auto registered = c.Call(RegisterOne("huge", big), fds);
    INFO("register reply " << registered.ShortDebugString());
    REQUIRE(registered.has_register_());
    pb::ClientMessage save;
    save.mutable_save()->set_step(1);
    REQUIRE(c.Call(save).has_save());
    b.SaveAndWait(step++);
  }

  SECTION("the daemon stops") {
    RawConnection a(daemon.socket());
    REQUIRE(a.Hello("orphan").has_hello());
    a.Send(RegisterOne("huge", big), fds);
    REQUIRE(PollUntil([&] { return DaemonMaps(daemon, "itest-orphan"); }));
    const int status = daemon.Terminate();
    INFO("ckptd " << ckpt::itest::DescribeWaitStatus(status) << "; log:\n" << daemon.LogTail());
    REQUIRE(ExitedWith(status, 0));
  }
}

TEST_CASE("daemon: an Abandon behind a registration aborts a step captured meanwhile",
          "[daemon][register]") {
  // The capture of step 1 finishes while the registration sent after its Save runs (or before
  // the daemon has read that registration); either way the Abandon sent after the registration
  // must still be read before the capture counts (session.h). The daemon is frozen while the
  // three frames are sent, so all of them are in its socket before the capture can finish: a
  // trainer writes its Abandon before it touches the memory, and only that touch can tear a copy.
  TempDir dir;
  DaemonProcess daemon(DaemonProcess::InDir(dir));
  const uint64_t big = LargeRegistrationBytes() / 4;
  constexpr uint64_t kSmall = 64 << 10;
  UniqueFd small = MakeMemfd("itest-abandon-small", kSmall);
  UniqueFd large = MakeMemfd("itest-abandon-large", big);
  const int small_fds[] = {small.get()};
  const int large_fds[] = {large.get()};

  RawConnection a(daemon.socket());
  REQUIRE(a.Hello("abandoning").has_hello());
  REQUIRE(a.Call(RegisterOne("w", kSmall), small_fds).has_register_());
  pb::ClientMessage save;
  save.set_request_id(101);
  save.mutable_save()->set_step(1);
  pb::ClientMessage reg = RegisterOne("huge", big);
  reg.set_request_id(102);
  pb::ClientMessage abandon;
  abandon.set_request_id(103);
  abandon.mutable_abandon()->set_step(1);
  abandon.mutable_abandon()->set_reason("the fence gave up");
  daemon.Freeze();
  a.Send(save);
  a.Send(reg, large_fds);
  a.Send(abandon);
  daemon.Kill(SIGCONT);
  // Answered in the order sent.
  for (uint64_t id : {101, 102, 103}) {
    auto m = a.Next();
    REQUIRE(m.has_value());
    INFO("reply " << m->ShortDebugString());
    REQUIRE(m->request_id() == id);
    if (id == 101) REQUIRE(m->has_save());
    if (id == 102) REQUIRE(m->has_register_());
    if (id == 103) {
      REQUIRE(m->has_abandon());
      CHECK(m->abandon().aborted());
    }
  }
  pb::ClientMessage wait;
  wait.mutable_wait()->set_step(1);
  wait.mutable_wait()->set_state(pb::STEP_STATE_CAPTURED);
  auto waited = a.Call(wait);
  INFO("wait reply " << waited.ShortDebugString());
  CHECK(waited.has_error());
}
