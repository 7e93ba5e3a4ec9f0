// A catalogue of hostile local clients, one daemon for all of them, and a well-behaved rank on
// the same daemon that saves before, between and after them. Each entry must get a clear Error
// (non-empty, naming what was wrong: the expected words are listed with the entry) and either
// keep its session (semantic errors) or lose its connection (a broken stream); the daemon must
// stay up, and the good rank's steps must commit bit-exact.
//
// Complements daemon_failure_test.cpp ("a broken stream…", "bad requests…"), which covers
// garbage bytes, a 0xFFFFFFFF length prefix, a truncated frame, a non-ClientMessage payload,
// a first message other than Hello, job "../etc", a range beyond the memfd, a control character
// in a name, dtype float128, a missing descriptor and a wait for state "aborted". This file adds
// the rest of the list: descriptors of the wrong size or kind, shapes that overflow or disagree,
// boxes past the tensor, more path-like job names, 10k tensors with one name, oversized frames
// and extras, too many descriptors, bad ranks and world sizes, and replays.
#include "tests/integration/daemon_harness.h"  // first: it configures Catch

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <functional>
#include <limits>
#include <string>
#include <vector>

namespace {

namespace pb = ::ckptd::v1;
using ckpt::UniqueFd;
using ckpt::itest::DaemonProcess;
using ckpt::itest::HostSpec;
using ckpt::itest::InProcessRank;
using ckpt::itest::PathExists;
using ckpt::itest::RawConnection;
using ckpt::testing::TempDir;
using std::chrono::seconds;

constexpr uint64_t kMemfdBytes = 64 << 10;

UniqueFd MakeMemfd(uint64_t bytes) {
  UniqueFd fd(::memfd_create("hostile", MFD_CLOEXEC));
  REQUIRE(fd);
  REQUIRE(::ftruncate(fd.get(), static_cast<off_t>(bytes)) == 0);
  return fd;
}

// Sends `m` on a session that said hello as job `job`; requires an Error reply whose message
// holds every one of `words`; then requires the session to go on (Latest answers).
void ExpectSemanticError(RawConnection& conn, pb::ClientMessage m, std::span<const int> fds,
                         const std::vector<std::string>& words) {
  const pb::DaemonMessage reply = conn.Call(std::move(m), fds);
  INFO("reply: " << reply.ShortDebugString());
  REQUIRE(reply.has_error());
  for (const auto& w : words) CHECK_THAT(reply.error().message(), Catch::Contains(w));
  pb::ClientMessage latest;
  latest.mutable_latest();
  const pb::DaemonMessage after = conn.Call(latest);
  INFO("latest after the error: " << after.ShortDebugString());
  REQUIRE(after.has_latest());
}

// A Hello that must be refused with an Error naming `words`, and the connection closed.
void ExpectHelloRefused(const std::string& socket, pb::Hello hello,
                        const std::vector<std::string>& words) {
  RawConnection conn(socket);
  pb::ClientMessage m;
  *m.mutable_hello() = std::move(hello);
  const pb::DaemonMessage reply = conn.Call(m);
  INFO("reply: " << reply.ShortDebugString());
  REQUIRE(reply.has_error());
  for (const auto& w : words) CHECK_THAT(reply.error().message(), Catch::Contains(w));
  REQUIRE(!conn.Next().has_value());
}

pb::Hello MakeHello(const std::string& job, uint32_t rank = 0, uint32_t world_size = 1) {
  pb::Hello h;
  h.set_protocol_version(1);
  h.set_job(job);
  h.set_rank(rank);
  h.set_world_size(world_size);
  h.set_client_version("hostile");
  return h;
}

pb::ClientMessage RegisterOf(std::vector<pb::TensorSpec> specs) {
  pb::ClientMessage m;
  for (auto& s : specs) *m.mutable_register_()->add_tensors() = std::move(s);
  return m;
}

}  // namespace

TEST_CASE("hostile: a catalogue of hostile clients gets clear errors and a good rank is unaffected",
          "[daemon][hostile]") {
  TempDir dir;
  DaemonProcess daemon(DaemonProcess::InDir(dir));
  const uint64_t seed = ckpt::testing::TestSeed() + 70;
  constexpr uint64_t kGoodBytes = 1ull << 20;
  InProcessRank good(kGoodBytes, 2, 0, 1, seed);
  auto client = daemon.Connect("good");
  REQUIRE_OK(client->Register(good.Specs()));
  uint64_t good_step = 0;
  auto good_saves = [&] {
    ++good_step;
    INFO("the good rank saves step " << good_step);
    good.Fill(good_step);
    REQUIRE_OK(client->Save(good_step, good.Extra(good_step)));
    REQUIRE_OK(client->WaitSnapshot(seconds(60)));
    REQUIRE_OK(client->Wait(good_step, ckpt::WaitState::kCommitted, seconds(60)));
    ckpt::itest::RequireTrainerStep(daemon.root(), "good", good_step, kGoodBytes, 2, 1, seed);
    REQUIRE(daemon.Alive());
  };
  good_saves();

  UniqueFd memfd = MakeMemfd(kMemfdBytes);
  const int one_fd[] = {memfd.get()};

  SECTION("hostile hellos") {
    ExpectHelloRefused(daemon.socket(), MakeHello(".."), {"'..'"});
    ExpectHelloRefused(daemon.socket(), MakeHello("a/../../b"), {"a/../../b"});
    ExpectHelloRefused(daemon.socket(), MakeHello("/abs"), {"/abs"});
    ExpectHelloRefused(daemon.socket(), MakeHello(""), {"job name is empty"});
    ExpectHelloRefused(daemon.socket(), MakeHello(std::string("nul\0byte", 8)), {"job"});
    ExpectHelloRefused(daemon.socket(), MakeHello(std::string(5000, 'j')), {"5000 bytes"});
    ExpectHelloRefused(daemon.socket(), MakeHello("ranks", 4, 4), {"rank 4"});
    ExpectHelloRefused(daemon.socket(), MakeHello("ranks", 0, 0), {"world size 0"});
    // Older than the oldest protocol this daemon speaks: refused, naming both sides' versions.
    // (A newer client is answered in this daemon's version: it is the client that downgrades.)
    pb::Hello version = MakeHello("version");
    version.set_protocol_version(0);
    ExpectHelloRefused(daemon.socket(), version, {"protocol version 0", "1 to 3"});
    REQUIRE(!PathExists(dir / "b"));
    REQUIRE(!PathExists("/abs"));
  }

  SECTION("descriptors of the wrong size or kind") {
    RawConnection conn(daemon.socket());
    REQUIRE(conn.Hello("fds").has_hello());
    // A memfd smaller than the tensor it is said to hold.
    UniqueFd tiny = MakeMemfd(4096);
    const int tiny_fd[] = {tiny.get()};
    ExpectSemanticError(conn, RegisterOf({HostSpec("w", "uint8", {kMemfdBytes}, 0, kMemfdBytes)}),
                        tiny_fd, {"tensor 'w'"});
    // An offset past the end, and one where offset + length wraps around 2^64.
    ExpectSemanticError(conn, RegisterOf({HostSpec("w", "uint8", {16}, kMemfdBytes + 4096, 16)}),
                        one_fd, {"tensor 'w'"});
    ExpectSemanticError(
        conn,
        RegisterOf({HostSpec("w", "uint8", {16}, std::numeric_limits<uint64_t>::max() - 7, 16)}),
        one_fd, {"tensor 'w'"});
    // Not memory at all: a pipe, and a directory.
    int pipe_fds[2];
    REQUIRE(::pipe2(pipe_fds, O_CLOEXEC) == 0);
    UniqueFd pipe_r(pipe_fds[0]), pipe_w(pipe_fds[1]);
    const int pipe_fd[] = {pipe_r.get()};
    ExpectSemanticError(conn, RegisterOf({HostSpec("w", "uint8", {16}, 0, 16)}), pipe_fd,
                        {"tensor 'w'"});
    UniqueFd dir_fd(::open(dir.path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    REQUIRE(dir_fd);
    const int dir_fds[] = {dir_fd.get()};
    ExpectSemanticError(conn, RegisterOf({HostSpec("w", "uint8", {16}, 0, 16)}), dir_fds,
                        {"tensor 'w'"});
    // A descriptor index past those sent.
    ExpectSemanticError(conn, RegisterOf({HostSpec("w", "uint8", {16}, 0, 16, 7)}), one_fd,
                        {"tensor 'w'"});
  }

  SECTION("shapes that overflow, disagree or lie") {
    RawConnection conn(daemon.socket());
    REQUIRE(conn.Hello("shapes").has_hello());
    const uint64_t huge = uint64_t{1} << 62;
    // numel overflows 2^64.
    ExpectSemanticError(conn, RegisterOf({HostSpec("w", "float32", {huge, huge}, 0, 16)}), one_fd,
                        {"tensor 'w'"});
    // "Negative" dims as a signed client would send them.
    ExpectSemanticError(
        conn, RegisterOf({HostSpec("w", "float32", {static_cast<uint64_t>(-4), 4}, 0, 64)}), one_fd,
        {"tensor 'w'"});
    // Bytes that do not match shape × dtype.
    ExpectSemanticError(conn, RegisterOf({HostSpec("w", "float32", {16}, 0, 60)}), one_fd,
                        {"tensor 'w'"});
    // A box past the global shape.
    pb::TensorSpec past = HostSpec("w", "uint8", {16, 16}, 0, 256);
    past.mutable_geometry()->mutable_box()->set_offsets(0, 8);
    ExpectSemanticError(conn, RegisterOf({past}), one_fd, {"tensor 'w'"});
    // A box whose rank differs from the shape's.
    pb::TensorSpec rank = HostSpec("w", "uint8", {16, 16}, 0, 256);
    rank.mutable_geometry()->mutable_box()->add_offsets(0);
    ExpectSemanticError(conn, RegisterOf({rank}), one_fd, {"tensor 'w'"});
    // A flat range past the end, and one that wraps.
    pb::TensorSpec flat = HostSpec("w", "uint8", {256}, 0, 16);
    flat.mutable_geometry()->mutable_flat()->set_flat_offset(250);
    flat.mutable_geometry()->mutable_flat()->set_numel(16);
    ExpectSemanticError(conn, RegisterOf({flat}), one_fd, {"tensor 'w'"});
    flat.mutable_geometry()->mutable_flat()->set_flat_offset(std::numeric_limits<uint64_t>::max());
    ExpectSemanticError(conn, RegisterOf({flat}), one_fd, {"tensor 'w'"});
    // Unknown and empty dtypes.
    ExpectSemanticError(conn, RegisterOf({HostSpec("w", "complex64", {16}, 0, 128)}), one_fd,
                        {"complex64"});
    ExpectSemanticError(conn, RegisterOf({HostSpec("w", "", {16}, 0, 16)}), one_fd, {"dtype"});
    // An empty name, and a name of 100 kB.
    ExpectSemanticError(conn, RegisterOf({HostSpec("", "uint8", {16}, 0, 16)}), one_fd, {"name"});
    ExpectSemanticError(conn,
                        RegisterOf({HostSpec(std::string(100000, 'n'), "uint8", {16}, 0, 16)}),
                        one_fd, {"name"});
  }

  SECTION("10k tensors with the same name") {
    RawConnection conn(daemon.socket());
    REQUIRE(conn.Hello("dups").has_hello());
    std::vector<pb::TensorSpec> specs;
    for (int i = 0; i < 10000; ++i) specs.push_back(HostSpec("same", "uint8", {4}, 0, 4));
    ExpectSemanticError(conn, RegisterOf(std::move(specs)), one_fd, {"same"});
  }

  SECTION("10k distinct tiny tensors register, save and commit") {
    // Not an error: many tensors are legitimate; the daemon must simply cope.
    RawConnection conn(daemon.socket());
    REQUIRE(conn.Hello("many").has_hello());
    std::vector<pb::TensorSpec> specs;
    for (int i = 0; i < 10000; ++i) {
      specs.push_back(HostSpec("t" + std::to_string(i), "uint8", {4}, uint64_t(i % 1000) * 4, 4));
    }
    const pb::DaemonMessage reply = conn.Call(RegisterOf(std::move(specs)), one_fd);
    INFO("reply: " << reply.ShortDebugString().substr(0, 500));
    REQUIRE(reply.has_register_());
    CHECK(reply.register_().tensors() == 10000);
  }

  SECTION("oversized messages and too many descriptors") {
    {
      // A Save whose extra blob is larger than a frame may be: refused before sending.
      RawConnection conn(daemon.socket());
      REQUIRE(conn.Hello("big").has_hello());
      pb::ClientMessage save;
      save.set_request_id(9);
      save.mutable_save()->set_step(1);
      save.mutable_save()->set_extra(std::string(ckpt::kMaxFrameBytes + 1, 'x'));
      CHECK(!ckpt::SendFrame(conn.fd(), save.SerializeAsString()).ok());
      // Sent by hand anyway: the daemon refuses the frame and closes.
      const std::string payload = save.SerializeAsString();
      const uint32_t n = static_cast<uint32_t>(payload.size());
      conn.SendBytes(std::string(reinterpret_cast<const char*>(&n), 4) +
                     payload.substr(0, 1 << 20));
      auto first = conn.Next();
      if (first) {
        INFO("reply: " << first->ShortDebugString());
        REQUIRE(first->has_error());
        CHECK_THAT(first->error().message(), Catch::Contains("frame"));
        REQUIRE(!conn.Next().has_value());
      }
    }
    {
      // 250 descriptors (the most a frame may carry) on a Latest that takes none.
      RawConnection conn(daemon.socket());
      REQUIRE(conn.Hello("fdflood").has_hello());
      std::vector<UniqueFd> owned;
      std::vector<int> fds;
      for (size_t i = 0; i < ckpt::kMaxFdsPerFrame; ++i) {
        owned.push_back(MakeMemfd(4096));
        fds.push_back(owned.back().get());
      }
      pb::ClientMessage latest;
      latest.mutable_latest();
      const pb::DaemonMessage reply = conn.Call(latest, fds);
      INFO("reply: " << reply.ShortDebugString());
      REQUIRE((reply.has_latest() || reply.has_error()));
    }
  }

  SECTION("replays and requests out of place") {
    RawConnection conn(daemon.socket());
    REQUIRE(conn.Hello("replay").has_hello());
    // A second Hello on the same session.
    pb::ClientMessage hello;
    *hello.mutable_hello() = MakeHello("replay");
    const pb::DaemonMessage again = conn.Call(hello);
    INFO("second hello: " << again.ShortDebugString());
    REQUIRE(again.has_error());
    CHECK_THAT(again.error().message(), Catch::Contains("Hello"));
  }

  SECTION("steps that do not exist") {
    RawConnection conn(daemon.socket());
    REQUIRE(conn.Hello("nosteps").has_hello());
    pb::ClientMessage load;
    load.mutable_load()->set_has_step(true);
    load.mutable_load()->set_step(std::numeric_limits<uint64_t>::max());
    ExpectSemanticError(conn, load, {}, {"register"});
    pb::ClientMessage save0;
    save0.mutable_save()->set_step(0);
    ExpectSemanticError(conn, save0, {}, {"step"});
  }

  // Whatever the section did, the daemon is up and the good rank still commits exact bytes.
  good_saves();
  REQUIRE(daemon.Alive());
}

// Regression: the frame reader once allocated (and zeroed) the whole length a header claimed
// before any payload arrived, so 4-byte headers claiming 64 MiB on many connections could
// make the daemon commit gigabytes. Found by fuzz_frame_decoder (each such input took ~20 ms).
TEST_CASE("hostile: headers claiming 64 MiB frames on 50 connections cost the daemon no memory",
          "[daemon][hostile]") {
  TempDir dir;
  DaemonProcess daemon(DaemonProcess::InDir(dir));
  auto resident_kib = [&] {
    std::ifstream in("/proc/" + std::to_string(daemon.pid()) + "/status");
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6));
    }
    FAIL("no VmRSS for the daemon");
    return 0ull;
  };
  const uint64_t before = resident_kib();
  std::vector<std::unique_ptr<RawConnection>> conns;
  const uint32_t claim = ckpt::kMaxFrameBytes;
  for (int i = 0; i < 50; ++i) {
    conns.push_back(std::make_unique<RawConnection>(daemon.socket()));
    conns.back()->SendBytes(std::string(reinterpret_cast<const char*>(&claim), 4) + "partial");
  }
  // A round trip on a fresh connection: the daemon's loop has read every header by then.
  {
    RawConnection probe(daemon.socket());
    REQUIRE(probe.Hello("probe").has_hello());
  }
  const uint64_t after = resident_kib();
  INFO("daemon RSS " << before / 1024 << " MiB before, " << after / 1024 << " MiB after");
  CHECK(after < before + 256 * 1024);  // 50 × 64 MiB would be 3200 MiB
  REQUIRE(daemon.Alive());
}
