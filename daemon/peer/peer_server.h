// PeerServer: the serving side of the daemon-to-daemon data plane (--peer-listen HOST:PORT;
// the protocol is peer_protocol.h's).
//
// Threads. The server runs its own Asio loop on one thread ("peer-io"), so that peer traffic —
// frames of up to 64 MiB — never queues behind or ahead of the trainer socket's handlers on the
// daemon's loop. The loop only moves bytes and parses frames; everything that can block runs on
// the server's TaskPool ("peer"): FETCH reads its source there (storage reads, copies out of the
// hot cache and the peer store, the XXH3 of the reply), and PUT verifies its chunk's checksum
// and commits it to the PeerStore there. Each connection is owned by the shared_ptr its pending
// handler holds; its state is touched only by the loop, or by the one pool task it is waiting
// for (one request at a time per connection).
//
// Deadlines. A connection waiting for its next request is closed after `idle_timeout`; once a
// frame's header has arrived, the rest of the frame must arrive within `frame_timeout`, and a
// reply must be written within `frame_timeout` (a stalled or dead peer is dropped, never
// waited on). A connection beyond `max_connections` is closed at once, with a log line.
//
// Errors. A frame that does not parse closes its connection after a best-effort error reply
// (request id 0) and one warning naming the peer and the reason; a request that parses but
// cannot be served (hostile names, unknown step, peer pool full, bad checksum) gets an error
// reply and the connection serves on. A refused PUT's data is read and discarded, so the stream
// stays in step. Nothing a peer sends can stop the server or the daemon.
//
// Bandwidth. Replies with data wait on the TokenBucket (--peer-bandwidth) before they are
// written: the wait is a timer on the loop, not a blocked thread.
//
// TLS is not offered yet: the data plane is plain TCP, for a trusted cluster network (the
// addresses are the nodes' own). The names a request may carry are validated all the same.
//
// Start/Stop from one thread (the daemon's main thread); Stop closes the listener and every
// connection, joins the loop and drains the pool.
#pragma once

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <chrono>
#include <memory>
#include <set>
#include <string>
#include <thread>

#include "common/status.h"
#include "daemon/peer/peer_observer.h"
#include "daemon/peer/peer_protocol.h"
#include "daemon/peer/peer_source.h"
#include "daemon/peer/peer_store.h"
#include "daemon/peer/token_bucket.h"
#include "daemon/task_pool.h"

namespace ckpt::peer {

class PeerServer {
 public:
  struct Config {
    std::string listen;  // "host:port"; port 0 picks one (see bound_address)
    int threads = 2;     // the pool running source reads and PUT verification
    std::chrono::milliseconds idle_timeout{std::chrono::seconds(120)};
    std::chrono::milliseconds frame_timeout{std::chrono::seconds(30)};
    size_t max_connections = 256;
    // Bytes of FETCH replies being read or sent at once; a FETCH beyond it is answered
    // RESOURCE_EXHAUSTED at once (the asker reads storage or another holder instead).
    uint64_t max_fetch_bytes = 256ull << 20;
    int nice = 0;  // of the pool's threads: the daemon's worker_nice, below capture's
  };

  // `source` serves FETCH; `store` keeps PUTs (null: every PUT and DROP is refused);
  // `bucket` caps what is sent (null: no cap); `observer` may be null. All must outlive the
  // server.
  PeerServer(Config config, PeerSource* source, PeerStore* store, TokenBucket* bucket,
             PeerObserver* observer);
  ~PeerServer();  // Stop()
  PeerServer(const PeerServer&) = delete;
  PeerServer& operator=(const PeerServer&) = delete;

  // Binds and starts the loop and the pool. Fails (naming the address) when it cannot bind.
  Status Start();
  void Stop();

  // "host:port" bound, after Start.
  std::string bound_address() const;
  uint16_t port() const { return port_; }
  size_t connections() const { return open_connections_.load(); }

 private:
  class Connection;
  void Accept();

  Config config_;
  PeerSource* source_;
  PeerStore* store_;
  TokenBucket* bucket_;
  PeerObserver* observer_;
  boost::asio::io_context io_;
  boost::asio::ip::tcp::acceptor acceptor_{io_};
  TaskPool pool_;
  std::atomic<uint64_t> fetch_bytes_{0};  // of FETCH replies in flight (Config::max_fetch_bytes)
  std::thread loop_;
  std::string host_;
  uint16_t port_ = 0;
  bool started_ = false;
  std::atomic<size_t> open_connections_{0};
  // Live connections, so that Stop can close them. Loop only.
  std::set<std::shared_ptr<Connection>> live_;
};

}  // namespace ckpt::peer
