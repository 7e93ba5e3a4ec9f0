// A scripted fake ckptd for client tests: it listens on a real Unix socket, accepts one
// connection after another, and hands every frame it receives (with its descriptors) to the test
// thread, which checks it and decides what to answer. Nothing waits on a sleep: the test thread
// waits for frames, and for the client's calls through futures with a generous bound that only
// matters when something hangs.
#pragma once

#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <deque>
#include <future>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ckpt/client.h"
#include "ckptd/v1/local.pb.h"
#include "common/frame_io.h"
#include "common/mutex.h"
#include "tests/test_util.h"

namespace ckpt::itest::fake {

namespace pb = ::ckptd::v1;
using ckpt::Client;
using ckpt::ClientOptions;
using ckpt::StatusCode;
using ckpt::UniqueFd;
using std::chrono::milliseconds;
using std::chrono::seconds;

// Bound on any wait for something that should happen at once; reached only when a test fails.
inline constexpr seconds kHang{10};

struct Received {
  pb::ClientMessage message;
  std::vector<UniqueFd> fds;
  size_t payload_bytes = 0;
};

// Accepts connections one after another and queues every frame it receives for the test thread.
class FakeDaemon {
 public:
  explicit FakeDaemon(std::string path) : path_(std::move(path)) {
    listen_ = UniqueFd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    REQUIRE(listen_);
    struct sockaddr_un addr = {};
    addr.sun_family = AF_UNIX;
    REQUIRE(path_.size() < sizeof addr.sun_path);
    std::memcpy(addr.sun_path, path_.data(), path_.size());
    REQUIRE(::bind(listen_.get(), reinterpret_cast<struct sockaddr*>(&addr), sizeof addr) == 0);
    REQUIRE(::listen(listen_.get(), 4) == 0);
    thread_ = std::thread([this] { Serve(); });
  }
  ~FakeDaemon() {
    ::shutdown(listen_.get(), SHUT_RDWR);  // wakes accept
    ::unlink(path_.c_str());
    {
      MutexLock lock(mu_);
      if (conn_) ::shutdown(conn_.get(), SHUT_RDWR);
    }
    thread_.join();
  }

  const std::string& path() const { return path_; }

  // The next frame from the client; nullopt when none came within kHang or the client left.
  std::optional<Received> Next() {
    MutexLock lock(mu_);
    cv_.WaitFor(mu_, kHang, [&]() REQUIRES(mu_) { return !frames_.empty() || ended_; });
    if (frames_.empty()) return std::nullopt;
    Received r = std::move(frames_.front());
    frames_.pop_front();
    return r;
  }

  void Reply(uint64_t request_id, pb::DaemonMessage message) {
    message.set_request_id(request_id);
    SendRaw(message.SerializeAsString());
  }
  void ReplyError(uint64_t request_id, StatusCode code, const std::string& text) {
    pb::DaemonMessage m;
    m.mutable_error()->set_code(static_cast<uint32_t>(code));
    m.mutable_error()->set_message(text);
    Reply(request_id, std::move(m));
  }
  void SendEvent(uint64_t step, pb::StepState state, const std::string& reason = "") {
    pb::DaemonMessage m;
    m.mutable_event()->set_job("job-a");
    m.mutable_event()->set_step(step);
    m.mutable_event()->set_state(state);
    m.mutable_event()->set_reason(reason);
    Reply(0, std::move(m));
  }
  void SendRaw(const std::string& payload) {
    MutexLock lock(mu_);
    ckpt::SendFrame(conn_.get(), payload).IgnoreError();
  }
  // Connections accepted so far.
  int connections() {
    MutexLock lock(mu_);
    return connections_;
  }
  // Waits (at most kHang) until `n` connections were accepted.
  bool WaitConnections(int n) {
    MutexLock lock(mu_);
    return cv_.WaitFor(mu_, kHang, [&]() REQUIRES(mu_) { return connections_ >= n; });
  }
  // Like a daemon that exits: the client sees EOF.
  void CloseConnection() {
    MutexLock lock(mu_);
    ::shutdown(conn_.get(), SHUT_RDWR);
  }

 private:
  void Serve() {
    while (true) {
      const int c = ::accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) break;
      {
        MutexLock lock(mu_);
        conn_ = UniqueFd(c);
        ended_ = false;
        ++connections_;
        cv_.NotifyAll();
      }
      ckpt::FrameReader reader;
      while (true) {
        auto frame = reader.ReadSome(c);
        if (!frame.ok()) break;
        if (!frame->has_value()) continue;
        Received r;
        r.payload_bytes = (*frame)->payload.size();
        if (!r.message.ParseFromString((*frame)->payload)) break;
        r.fds = std::move((*frame)->fds);
        MutexLock lock(mu_);
        frames_.push_back(std::move(r));
        cv_.NotifyAll();
      }
      MutexLock lock(mu_);
      ended_ = true;
      cv_.NotifyAll();
    }
    MutexLock lock(mu_);
    ended_ = true;
    cv_.NotifyAll();
  }

  std::string path_;
  UniqueFd listen_;
  Mutex mu_;
  CondVar cv_;
  UniqueFd conn_ GUARDED_BY(mu_);
  std::deque<Received> frames_ GUARDED_BY(mu_);
  bool ended_ GUARDED_BY(mu_) = false;  // the current connection ended
  int connections_ GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

inline ClientOptions Options(const std::string& socket) {
  ClientOptions o;
  o.socket = socket;
  o.job = "job-a";
  o.rank = 1;
  o.world_size = 4;
  o.local_rank = 1;
  o.connect_timeout = milliseconds(5000);
  return o;
}

// Waits for a call of the client made with std::async; when it does not finish, the fake
// daemon drops the connection (so the call and the future can end) and the test fails.
template <typename T>
T Finish(FakeDaemon& daemon, std::future<T>& call) {
  if (call.wait_for(kHang) != std::future_status::ready) {
    daemon.CloseConnection();
    FAIL("the client call did not return within " << kHang.count() << " s");
  }
  return call.get();
}

// Answers the hello of the client's next connection, speaking `protocol`.
inline void AnswerHello(FakeDaemon& daemon, uint32_t protocol = 2, uint32_t expect_reattach = 0) {
  // A re-attach is the client's connection number expect_reattach + 1.
  REQUIRE(daemon.WaitConnections(static_cast<int>(expect_reattach) + 1));
  auto hello = daemon.Next();
  REQUIRE(hello);
  REQUIRE(hello->message.has_hello());
  CHECK(hello->message.hello().protocol_version() == 3);
  CHECK(hello->message.hello().reattach() == expect_reattach);
  pb::DaemonMessage reply;
  reply.mutable_hello()->set_protocol_version(protocol);
  reply.mutable_hello()->set_node_id("node-a");
  reply.mutable_hello()->set_daemon_version("fake");
  daemon.Reply(hello->message.request_id(), reply);
}

inline std::unique_ptr<Client> ConnectTo(FakeDaemon& daemon, ClientOptions options,
                                         uint32_t protocol = 2) {
  auto call = std::async(std::launch::async, [options] { return Client::Connect(options); });
  AnswerHello(daemon, protocol);
  auto client = Finish(daemon, call);
  REQUIRE_OK(client);
  return std::move(client).value();
}

// A round trip that proves which frame the client sent next.
inline void ExpectNextIsLatest(FakeDaemon& daemon, Client& client) {
  auto call = std::async(std::launch::async, [&] { return client.Latest(); });
  auto next = daemon.Next();
  REQUIRE(next);
  CHECK(next->message.body_case() == pb::ClientMessage::kLatest);
  pb::DaemonMessage reply;
  reply.mutable_latest()->set_has_step(false);
  daemon.Reply(next->message.request_id(), reply);
  auto latest = Finish(daemon, call);
  REQUIRE_OK(latest);
  CHECK(!latest->has_value());
}

inline UniqueFd MakeMemfd(size_t size, uint8_t seed) {
  UniqueFd fd(::memfd_create("client_protocol_test", MFD_CLOEXEC));
  REQUIRE(fd);
  std::vector<uint8_t> bytes(size);
  for (size_t i = 0; i < size; ++i) bytes[i] = static_cast<uint8_t>(seed * 131 + i * 7);
  REQUIRE(::pwrite(fd.get(), bytes.data(), size, 0) == static_cast<ssize_t>(size));
  return fd;
}

inline ino_t Inode(int fd) {
  struct stat st;
  REQUIRE(::fstat(fd, &st) == 0);
  return st.st_ino;
}

// The bytes [offset, offset+length) of what `fd` maps.
inline std::vector<uint8_t> MappedBytes(int fd, uint64_t offset, uint64_t length) {
  struct stat st;
  REQUIRE(::fstat(fd, &st) == 0);
  REQUIRE(offset + length <= static_cast<uint64_t>(st.st_size));
  void* p = ::mmap(nullptr, st.st_size, PROT_READ, MAP_SHARED, fd, 0);
  REQUIRE(p != MAP_FAILED);
  const auto* base = static_cast<const uint8_t*>(p);
  std::vector<uint8_t> out(base + offset, base + offset + length);
  ::munmap(p, st.st_size);
  return out;
}

}  // namespace ckpt::itest::fake
