// Helpers of the data plane's loopback tests: an in-memory PeerSource, a raw TCP connection that
// speaks the protocol by hand (for frames a PeerClient would never send), and a scripted fake
// peer (for replies a PeerServer would never send).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <tuple>

#include "common/frame_io.h"
#include "common/mutex.h"
#include "daemon/peer/peer_protocol.h"
#include "daemon/peer/peer_source.h"

namespace ckpt::peer::testing {

// Deterministic bytes of a test file.
inline std::string Pattern(size_t n, uint64_t seed) {
  std::string s(n, '\0');
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    s[i] = static_cast<char>(x & 0xff);
  }
  return s;
}

// Files by (job, step, file name), served from memory.
class MemorySource final : public PeerSource {
 public:
  void Add(const std::string& job, uint64_t step, const std::string& file, std::string bytes) {
    MutexLock lock(mu_);
    files_[{job, step, file}] = std::move(bytes);
  }
  Status Read(const Region& r, std::byte* out) override {
    MutexLock lock(mu_);
    auto it = files_.find({r.job, r.step, r.file});
    if (it == files_.end()) return NotFound("test source: no " + DescribeRegion(r));
    if (r.offset + r.length > it->second.size()) {
      return OutOfRange("test source: " + DescribeRegion(r) + " past the end");
    }
    std::memcpy(out, it->second.data() + r.offset, r.length);
    return Status::Ok();
  }

 private:
  Mutex mu_;
  std::map<std::tuple<std::string, uint64_t, std::string>, std::string> files_ GUARDED_BY(mu_);
};

// A blocking loopback TCP connection; reads give up after 10 s (a hang fails the test).
// All of `bytes`, or as much as the peer takes before it closes.
inline void SendAll(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n <= 0) return;
    bytes.remove_prefix(static_cast<size_t>(n));
  }
}

class RawPeer {
 public:
  explicit RawPeer(uint16_t port) : fd_(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
    REQUIRE(fd_);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::connect(fd_.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  }
  // The server may close first; the test checks what it reads.
  void Send(std::string_view bytes) { SendAll(fd_.get(), bytes); }
  // Exactly n bytes, or fewer when the connection ends (or after 10 s).
  std::string Receive(size_t n) {
    std::string out;
    char buf[65536];
    while (out.size() < n) {
      pollfd p{fd_.get(), POLLIN, 0};
      if (::poll(&p, 1, 10000) <= 0) break;
      const ssize_t got = ::recv(fd_.get(), buf, std::min(sizeof buf, n - out.size()), 0);
      if (got <= 0) break;
      out.append(buf, static_cast<size_t>(got));
    }
    return out;
  }
  // Reads one reply: its decoded status and data. REQUIREs a well-formed reply.
  std::pair<Status, std::string> ReadReply() {
    const std::string h = Receive(kHeaderBytes);
    REQUIRE(h.size() == kHeaderBytes);
    auto header = DecodeHeader(std::span<const std::byte, kHeaderBytes>(
        reinterpret_cast<const std::byte*>(h.data()), kHeaderBytes));
    REQUIRE_OK(header);
    REQUIRE(header->type == FrameType::kReply);
    const std::string meta = Receive(header->meta_length);
    auto status = DecodeReply(meta);
    REQUIRE(status.has_value());
    return {*status, Receive(header->data_length)};
  }
  // True when the server closed the connection (EOF within 10 s).
  bool ClosedByPeer() {
    char c;
    pollfd p{fd_.get(), POLLIN, 0};
    if (::poll(&p, 1, 10000) <= 0) return false;
    return ::recv(fd_.get(), &c, 1, 0) <= 0;
  }
  int fd() const { return fd_.get(); }

 private:
  UniqueFd fd_;
};

// A listening socket on 127.0.0.1 whose one connection is handled by `script` on a thread.
class FakePeer {
 public:
  explicit FakePeer(std::function<void(int fd)> script)
      : listen_(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
    REQUIRE(listen_);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(listen_.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::listen(listen_.get(), 4) == 0);
    socklen_t len = sizeof a;
    REQUIRE(::getsockname(listen_.get(), reinterpret_cast<sockaddr*>(&a), &len) == 0);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this, script = std::move(script)] {
      UniqueFd c(::accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC));
      if (c) script(c.get());
    });
  }
  ~FakePeer() {
    ::shutdown(listen_.get(), SHUT_RDWR);  // unblocks an accept that never got a client
    thread_.join();
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  UniqueFd listen_;
  uint16_t port_ = 0;
  std::thread thread_;
};

// Reads a request's header and metadata off `fd` (blocking); its request id.
inline uint32_t ReadRequest(int fd) {
  std::byte h[kHeaderBytes];
  size_t have = 0;
  while (have < kHeaderBytes) {
    const ssize_t n = ::recv(fd, h + have, kHeaderBytes - have, 0);
    if (n <= 0) return 0;
    have += static_cast<size_t>(n);
  }
  auto header = DecodeHeader(std::span<const std::byte, kHeaderBytes>(h));
  if (!header.ok()) return 0;
  std::string meta(header->meta_length, '\0');
  have = 0;
  while (have < meta.size()) {
    const ssize_t n = ::recv(fd, meta.data() + have, meta.size() - have, 0);
    if (n <= 0) return 0;
    have += static_cast<size_t>(n);
  }
  return header->request_id;
}

}  // namespace ckpt::peer::testing
