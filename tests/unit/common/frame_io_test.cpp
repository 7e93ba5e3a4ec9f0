// Framing of the local data plane over a real socketpair (common/frame_io.h): payloads and
// descriptors, limits, EOF, and descriptors always arriving with their own frame.
#include "common/frame_io.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <future>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tests/test_util.h"

namespace ckpt {
namespace {

using Catch::Matchers::Contains;

struct SocketPair {
  SocketPair() {
    int sv[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
    writer = UniqueFd(sv[0]);
    reader = UniqueFd(sv[1]);
  }
  UniqueFd writer;
  UniqueFd reader;
};

void SetNonBlocking(int fd) {
  const int flags = ::fcntl(fd, F_GETFL);
  REQUIRE(::fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0);
}

void WriteAll(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd, bytes.data(), bytes.size());
    REQUIRE(n > 0);
    bytes.remove_prefix(static_cast<size_t>(n));
  }
}

std::string LengthPrefix(uint32_t n) {
  std::string s(4, '\0');
  for (int i = 0; i < 4; ++i) s[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return s;
}

// An anonymous in-memory file holding `content`.
UniqueFd MemFile(const std::string& content) {
  UniqueFd fd(::memfd_create("frame-io-test", MFD_CLOEXEC));
  REQUIRE(fd);
  WriteAll(fd.get(), content);
  return fd;
}

std::string ReadAllAt0(int fd) {
  struct stat st;
  REQUIRE(::fstat(fd, &st) == 0);
  std::string out(static_cast<size_t>(st.st_size), '\0');
  REQUIRE(::pread(fd, out.data(), out.size(), 0) == static_cast<ssize_t>(out.size()));
  return out;
}

bool SameFile(int a, int b) {
  struct stat sa, sb;
  REQUIRE(::fstat(a, &sa) == 0);
  REQUIRE(::fstat(b, &sb) == 0);
  return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

size_t OpenFdCount() {
  size_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

// Shuts a socket down when it goes out of scope, so that a sender thread blocked on a full
// socket fails instead of hanging the test when a REQUIRE on the reading side throws.
struct ShutdownOnExit {
  int fd;
  ~ShutdownOnExit() { ::shutdown(fd, SHUT_RDWR); }
};

// Reads one complete frame from a blocking socket.
Result<Frame> ReadFrame(FrameReader& reader, int fd) {
  while (true) {
    auto r = reader.ReadSome(fd);
    if (!r.ok()) return r.status();
    if (r->has_value()) return std::move(**r);
  }
}

Status ReadError(FrameReader& reader, int fd) {
  while (true) {
    auto r = reader.ReadSome(fd);
    if (!r.ok()) return r.status();
    if (!r->has_value()) return Internal("would block");
  }
}

TEST_CASE("EncodeFrame is a little-endian u32 length and the payload", "[frame_io]") {
  CHECK(EncodeFrame("") == std::string(4, '\0'));
  const std::string payload(258, 'p');
  const std::string frame = EncodeFrame(payload);
  REQUIRE(frame.size() == 262);
  CHECK(frame.substr(0, 4) == std::string("\x02\x01\x00\x00", 4));
  CHECK(frame.substr(4) == payload);
}

TEST_CASE("frames round-trip: empty, binary and larger than the socket buffer", "[frame_io]") {
  SocketPair sp;
  std::mt19937_64 rng(ckpt::testing::TestSeed());
  std::string big(3 << 20, '\0');
  for (char& c : big) c = static_cast<char>(rng());
  const std::vector<std::string> payloads = {"", "x", std::string("\0\1\2\0", 4), big, "tail"};
  auto sender = std::async(std::launch::async, [&] {
    for (const auto& p : payloads) {
      Status s = SendFrame(sp.writer.get(), p);
      if (!s.ok()) return s;
    }
    return Status::Ok();
  });
  ShutdownOnExit unblock{sp.reader.get()};
  FrameReader reader;
  for (size_t i = 0; i < payloads.size(); ++i) {
    INFO("frame " << i);
    auto f = ReadFrame(reader, sp.reader.get());
    REQUIRE_OK(f);
    CHECK(f->payload.size() == payloads[i].size());
    CHECK(f->payload == payloads[i]);
    CHECK(f->fds.empty());
  }
  REQUIRE_OK(sender.get());
}

TEST_CASE("descriptors arrive with their frame and refer to the same file", "[frame_io]") {
  const size_t fds_before = OpenFdCount();
  {
    SocketPair sp;
    UniqueFd a = MemFile("contents of a");
    UniqueFd b = MemFile("contents of b");
    const int to_send[] = {a.get(), b.get()};
    REQUIRE_OK(SendFrame(sp.writer.get(), "register", to_send));
    FrameReader reader;
    auto f = ReadFrame(reader, sp.reader.get());
    REQUIRE_OK(f);
    CHECK(f->payload == "register");
    REQUIRE(f->fds.size() == 2);
    CHECK(f->fds[0].get() != a.get());
    CHECK(SameFile(f->fds[0].get(), a.get()));
    CHECK(SameFile(f->fds[1].get(), b.get()));
    CHECK(ReadAllAt0(f->fds[0].get()) == "contents of a");
    CHECK(ReadAllAt0(f->fds[1].get()) == "contents of b");
    // Writes through the received descriptor reach the sender's object.
    REQUIRE(::pwrite(f->fds[1].get(), "B", 1, 0) == 1);
    CHECK(ReadAllAt0(b.get()) == "Bontents of b");
  }
  // Every received descriptor was owned and closed.
  CHECK(OpenFdCount() == fds_before);
}

TEST_CASE("250 descriptors in one frame are fine, SendFrame refuses 251", "[frame_io]") {
  const size_t fds_before = OpenFdCount();
  {
    SocketPair sp;
    UniqueFd file = MemFile("shared");
    std::vector<int> many(kMaxFdsPerFrame, file.get());
    REQUIRE_OK(SendFrame(sp.writer.get(), "many", many));
    FrameReader reader;
    auto f = ReadFrame(reader, sp.reader.get());
    REQUIRE_OK(f);
    REQUIRE(f->fds.size() == kMaxFdsPerFrame);
    for (const auto& fd : f->fds) CHECK(SameFile(fd.get(), file.get()));

    many.push_back(file.get());
    const Status s = SendFrame(sp.writer.get(), "too many", many);
    REQUIRE_FALSE(s.ok());
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK_THAT(s.message(), Contains("251"));
    // Nothing of the refused frame was sent.
    SetNonBlocking(sp.reader.get());
    auto none = reader.ReadSome(sp.reader.get());
    REQUIRE_OK(none);
    CHECK_FALSE(none->has_value());
  }
  CHECK(OpenFdCount() == fds_before);
}

TEST_CASE("the reader rejects 251 descriptors sent by a raw sendmsg", "[frame_io]") {
  const size_t fds_before = OpenFdCount();
  {
    SocketPair sp;
    UniqueFd file = MemFile("x");
    const size_t count = kMaxFdsPerFrame + 1;
    std::string frame = EncodeFrame("p");
    std::vector<char> control(CMSG_SPACE(sizeof(int) * count), 0);
    struct iovec iov = {frame.data(), frame.size()};
    struct msghdr msg = {};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    struct cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * count);
    std::vector<int> fds(count, file.get());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * count);
    REQUIRE(::sendmsg(sp.writer.get(), &msg, 0) == static_cast<ssize_t>(frame.size()));

    FrameReader reader;
    const Status s = ReadError(reader, sp.reader.get());
    REQUIRE_FALSE(s.ok());
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK_THAT(s.message(), Contains("250"));
  }
  CHECK(OpenFdCount() == fds_before);
}

TEST_CASE("descriptors in the middle of a frame are rejected", "[frame_io]") {
  SocketPair sp;
  UniqueFd file = MemFile("x");
  // Header without descriptors, then the payload carrying one.
  WriteAll(sp.writer.get(), LengthPrefix(3));
  std::string payload = "abc";
  alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  struct iovec iov = {payload.data(), payload.size()};
  struct msghdr msg = {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  struct cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  const int fd = file.get();
  std::memcpy(CMSG_DATA(c), &fd, sizeof fd);
  REQUIRE(::sendmsg(sp.writer.get(), &msg, 0) == 3);

  FrameReader reader;
  const Status s = ReadError(reader, sp.reader.get());
  REQUIRE_FALSE(s.ok());
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(s.message(), Contains("middle of a frame"));
}

TEST_CASE("an oversized length prefix is rejected before any payload is read", "[frame_io]") {
  for (uint32_t len : {kMaxFrameBytes + 1, 0xffffffffu}) {
    INFO("length " << len);
    SocketPair sp;
    WriteAll(sp.writer.get(), LengthPrefix(len));
    FrameReader reader;
    const Status s = ReadError(reader, sp.reader.get());
    REQUIRE_FALSE(s.ok());
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK_THAT(s.message(), Contains(std::to_string(len)));
  }
}

TEST_CASE("a length prefix of exactly the limit is accepted", "[frame_io]") {
  SocketPair sp;
  WriteAll(sp.writer.get(), LengthPrefix(kMaxFrameBytes));
  REQUIRE(::shutdown(sp.writer.get(), SHUT_WR) == 0);
  FrameReader reader;
  // Not refused for its size: the reader waits for the payload and then sees EOF.
  const Status s = ReadError(reader, sp.reader.get());
  CHECK(s.code() == StatusCode::kUnavailable);
}

TEST_CASE("SendFrame refuses a payload over the limit", "[frame_io]") {
  SocketPair sp;
  const std::string big(size_t{kMaxFrameBytes} + 1, 'b');
  const Status s = SendFrame(sp.writer.get(), big);
  REQUIRE_FALSE(s.ok());
  CHECK(s.code() == StatusCode::kInvalidArgument);
}

TEST_CASE("EOF is kUnavailable, and says so when it cuts a frame", "[frame_io]") {
  SECTION("between frames") {
    SocketPair sp;
    REQUIRE_OK(SendFrame(sp.writer.get(), "whole"));
    sp.writer = UniqueFd();
    FrameReader reader;
    auto f = ReadFrame(reader, sp.reader.get());
    REQUIRE_OK(f);
    CHECK(f->payload == "whole");
    const Status s = ReadError(reader, sp.reader.get());
    CHECK(s.code() == StatusCode::kUnavailable);
    CHECK_THAT(s.message(), Contains("peer closed"));
    CHECK_THAT(s.message(), !Contains("middle"));
  }
  SECTION("in the middle of the header") {
    SocketPair sp;
    WriteAll(sp.writer.get(), LengthPrefix(10).substr(0, 2));
    sp.writer = UniqueFd();
    FrameReader reader;
    const Status s = ReadError(reader, sp.reader.get());
    CHECK(s.code() == StatusCode::kUnavailable);
    CHECK_THAT(s.message(), Contains("middle of a frame"));
  }
  SECTION("in the middle of the payload") {
    SocketPair sp;
    WriteAll(sp.writer.get(), LengthPrefix(10) + "abc");
    sp.writer = UniqueFd();
    FrameReader reader;
    const Status s = ReadError(reader, sp.reader.get());
    CHECK(s.code() == StatusCode::kUnavailable);
    CHECK_THAT(s.message(), Contains("middle of a frame"));
  }
}

TEST_CASE("a non-blocking reader assembles a frame from pieces", "[frame_io]") {
  SocketPair sp;
  SetNonBlocking(sp.reader.get());
  FrameReader reader;
  auto nothing = reader.ReadSome(sp.reader.get());
  REQUIRE_OK(nothing);
  CHECK_FALSE(nothing->has_value());

  const std::string frame = EncodeFrame("hello, daemon");
  size_t sent = 0;
  // Cuts inside the header, at its end, and inside the payload.
  for (size_t cut : {size_t{1}, size_t{3}, size_t{4}, size_t{10}}) {
    WriteAll(sp.writer.get(), frame.substr(sent, cut - sent));
    sent = cut;
    auto partial = reader.ReadSome(sp.reader.get());
    INFO("after " << cut << " bytes");
    REQUIRE_OK(partial);
    CHECK_FALSE(partial->has_value());
  }
  WriteAll(sp.writer.get(), frame.substr(10));
  auto done = reader.ReadSome(sp.reader.get());
  REQUIRE_OK(done);
  REQUIRE(done->has_value());
  CHECK((*done)->payload == "hello, daemon");
  // The reader is ready for the next frame.
  auto next = reader.ReadSome(sp.reader.get());
  REQUIRE_OK(next);
  CHECK_FALSE(next->has_value());
}

TEST_CASE("many frames back to back, each with its own descriptors", "[frame_io]") {
  const size_t fds_before = OpenFdCount();
  {
    SocketPair sp;
    constexpr int kFiles = 8, kFrames = 300;
    std::vector<UniqueFd> files;
    for (int k = 0; k < kFiles; ++k) files.push_back(MemFile("file-" + std::to_string(k)));
    // Frame i carries i % 5 descriptors: files (i + j) % kFiles; its payload lists them.
    auto plan = [&](int i) {
      std::vector<int> which;
      for (int j = 0; j < i % 5; ++j) which.push_back((i + j) % kFiles);
      return which;
    };
    auto sender = std::async(std::launch::async, [&] {
      for (int i = 0; i < kFrames; ++i) {
        std::vector<int> fds;
        std::string payload = "frame " + std::to_string(i) + ":";
        for (int k : plan(i)) {
          fds.push_back(files[k].get());
          payload += " file-" + std::to_string(k);
        }
        Status s = SendFrame(sp.writer.get(), payload, fds);
        if (!s.ok()) return s;
      }
      return Status::Ok();
    });
    ShutdownOnExit unblock{sp.reader.get()};
    FrameReader reader;
    for (int i = 0; i < kFrames; ++i) {
      INFO("frame " << i);
      auto f = ReadFrame(reader, sp.reader.get());
      REQUIRE_OK(f);
      const std::vector<int> which = plan(i);
      std::string expect = "frame " + std::to_string(i) + ":";
      for (int k : which) expect += " file-" + std::to_string(k);
      CHECK(f->payload == expect);
      REQUIRE(f->fds.size() == which.size());
      for (size_t j = 0; j < which.size(); ++j) {
        CHECK(ReadAllAt0(f->fds[j].get()) == "file-" + std::to_string(which[j]));
      }
    }
    REQUIRE_OK(sender.get());
  }
  CHECK(OpenFdCount() == fds_before);
}

TEST_CASE("SendFrame to a closed peer is an error, not SIGPIPE", "[frame_io]") {
  SocketPair sp;
  sp.reader = UniqueFd();
  const Status s = SendFrame(sp.writer.get(), "anyone there?");
  REQUIRE_FALSE(s.ok());
  CHECK(s.sys_errno() == EPIPE);
}

TEST_CASE("UniqueFd owns, moves and releases a descriptor", "[frame_io]") {
  int raw = -1;
  {
    UniqueFd a(::memfd_create("unique-fd", MFD_CLOEXEC));
    REQUIRE(a);
    raw = a.get();
    UniqueFd b(std::move(a));
    CHECK_FALSE(a);  // NOLINT(bugprone-use-after-move): moved-from is documented empty
    CHECK(b.get() == raw);
    UniqueFd c;
    c = std::move(b);
    CHECK(c.get() == raw);
    CHECK(::fcntl(raw, F_GETFD) != -1);
  }
  CHECK(::fcntl(raw, F_GETFD) == -1);  // closed with its owner

  UniqueFd d(::memfd_create("unique-fd", MFD_CLOEXEC));
  const int released = d.release();
  CHECK_FALSE(d);
  CHECK(::fcntl(released, F_GETFD) != -1);
  ::close(released);
}

}  // namespace
}  // namespace ckpt
