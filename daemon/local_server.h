// LocalServer: the Unix socket trainers connect to. Binds (replacing a stale socket file but
// refusing to steal one a live daemon still answers on), sets the file mode, records each peer's
// pid/uid with SO_PEERCRED, optionally checks the uid against an allow list, and starts a
// Session per connection. Runs on the daemon's Asio loop.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "daemon/session.h"

namespace ckpt {

class LocalServer {
 public:
  struct Config {
    std::string path = "/run/ckptd/ckptd.sock";
    uint32_t mode = 0660;
    std::set<uint32_t> allowed_uids;  // empty: any uid that can open the socket file
    int64_t group = -1;               // gid given to the socket file; -1: the daemon's
  };
  LocalServer(boost::asio::io_context& io, Config config, SessionServices* services);
  ~LocalServer();

  Status Start();
  // Stops accepting; closes every session when close_sessions is true.
  void Stop(bool close_sessions);
  size_t sessions() const;

 private:
  void Accept();

  boost::asio::io_context& io_;
  Config config_;
  SessionServices* services_;
  boost::asio::local::stream_protocol::acceptor acceptor_;
  std::vector<std::weak_ptr<Session>> sessions_;
  uint64_t next_id_ = 1;
  bool stopped_ = false;
};

}  // namespace ckpt
