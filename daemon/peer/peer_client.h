// PeerClient: the calling side of the data plane (peer_protocol.h). One client talks to one
// peer daemon over one TCP connection, opened on first use and again after any failure.
//
// Every call is blocking with a deadline: each request (one chunk) must be answered within
// `timeout` of being started — connecting, writing and reading included — or the call fails
// with kDeadlineExceeded naming the peer and the region, and the connection is dropped. A peer
// that dies mid-transfer fails the call at once (kUnavailable, the connection reset or closed);
// a peer that stalls fails it at its deadline. Nothing is retried here: the caller knows
// whether another peer or storage can serve instead (the load path falls back to storage).
//
// Fetch splits a region into requests of at most `chunk_bytes` and receives each chunk straight
// into the caller's buffer; a chunk whose XXH3 does not match its frame fails the call with
// kDataLoss (the buffer then holds unspecified bytes and must not be used). Put sends one region
// of at most kMaxChunkBytes from the caller's memory — a host pool slot — as the frame's data
// buffer (a gathered write: header and metadata, then the caller's bytes, no copy). The caller
// keeps that memory unchanged until Put returns.
//
// The TokenBucket, when given, paces what this client sends (PUT data): the calling thread
// sleeps for the bucket's wait before writing. That is the caller's thread, never an event loop.
//
// Thread safety: calls on one client are serialized (a mutex); use one client per thread for
// parallel transfers.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <chrono>
#include <cstddef>
#include <string>

#include "common/mutex.h"
#include "common/status.h"
#include "daemon/peer/peer_observer.h"
#include "daemon/peer/peer_protocol.h"
#include "daemon/peer/token_bucket.h"

namespace ckpt::peer {

class PeerClient {
 public:
  struct Config {
    std::string address;  // the peer's --peer-listen, "host:port"
    std::chrono::milliseconds timeout{std::chrono::seconds(10)};  // per request (chunk)
    uint64_t chunk_bytes = 16ull << 20;  // FETCH request size, 1 .. kMaxChunkBytes
  };

  // `bucket` and `observer` may be null; both must outlive the client.
  explicit PeerClient(Config config, TokenBucket* bucket = nullptr,
                      PeerObserver* observer = nullptr);
  ~PeerClient();
  PeerClient(const PeerClient&) = delete;
  PeerClient& operator=(const PeerClient&) = delete;

  // Reads region.length bytes of the region (any length) into `out`. Errors: the peer's reply
  // (kNotFound: it has no such step, kOutOfRange, kInvalidArgument), kDataLoss (checksum),
  // kDeadlineExceeded, kUnavailable (cannot connect, connection lost).
  Status Fetch(const Region& region, std::byte* out);
  // Hands the peer a copy of the region (length <= kMaxChunkBytes) to hold in its peer pool.
  // kResourceExhausted when its pool is full (it evicts nothing), kFailedPrecondition when it
  // holds nothing for others, plus the transport errors above.
  Status Put(const Region& region, const std::byte* data);
  // Asks the peer to forget every region of (job, step) it holds for others; with `file`, only
  // that data file's (the copies this node sent of its own rank).
  Status Drop(const std::string& job, uint64_t step, const std::string& file = "");

  const std::string& address() const { return config_.address; }

 private:
  using Clock = std::chrono::steady_clock;
  // One request/reply exchange: sends header + meta + `send` bytes, reads the reply; an OK
  // reply's data (exactly `expect` bytes) lands in `receive`.
  Status Exchange(FrameType type, const std::string& meta, const std::byte* send,
                  uint64_t send_length, std::byte* receive, uint64_t expect,
                  const std::string& what) REQUIRES(mu_);
  Status Connect(Clock::time_point deadline, const std::string& what) REQUIRES(mu_);
  // Runs the started async operation until it completes or `deadline` passes (then the socket
  // is closed and kDeadlineExceeded returned).
  template <typename StartOp>
  Status RunUntil(Clock::time_point deadline, const std::string& what, StartOp start) REQUIRES(mu_);
  void Disconnect() REQUIRES(mu_);
  Status Failed(Status status) REQUIRES(mu_);

  const Config config_;
  TokenBucket* const bucket_;
  PeerObserver* const observer_;
  Mutex mu_;
  boost::asio::io_context io_;  // driven only by the calling thread, under mu_
  boost::asio::ip::tcp::socket socket_ GUARDED_BY(mu_){io_};
  bool connected_ GUARDED_BY(mu_) = false;
  uint32_t next_id_ GUARDED_BY(mu_) = 1;
};

}  // namespace ckpt::peer
