#include "daemon/local_server.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <filesystem>

#include "common/logging.h"

namespace ckpt {

namespace {

// True when something accepts connections on `path` (another daemon).
bool SocketInUse(const std::string& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_un addr = {};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path.c_str());
  bool in_use = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  ::close(fd);
  return in_use;
}

}  // namespace

LocalServer::LocalServer(boost::asio::io_context& io, Config config, SessionServices* services)
    : io_(io), config_(std::move(config)), services_(services), acceptor_(io) {}

LocalServer::~LocalServer() { Stop(true); }

Status LocalServer::Start() {
  const std::string& path = config_.path;
  if (path.size() >= sizeof(sockaddr_un{}.sun_path)) {
    return InvalidArgument("socket path '" + path + "' is longer than " +
                           std::to_string(sizeof(sockaddr_un{}.sun_path) - 1) + " bytes");
  }
  std::error_code ec;
  const auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return FailedPrecondition("'" + path +
                                "' exists and is not a socket; refusing to replace it");
    }
    if (SocketInUse(path)) {
      return FailedPrecondition("another daemon is serving on '" + path + "'");
    }
    ::unlink(path.c_str());  // stale: its daemon is gone
  }
  boost::system::error_code bec;
  acceptor_.open(boost::asio::local::stream_protocol(), bec);
  if (!bec) acceptor_.bind(boost::asio::local::stream_protocol::endpoint(path), bec);
  if (!bec) acceptor_.listen(boost::asio::socket_base::max_listen_connections, bec);
  if (bec) return Unavailable("listening on '" + path + "': " + bec.message());
  if (::chmod(path.c_str(), config_.mode) != 0) return ErrnoStatus(errno, "chmod " + path);
  if (config_.group >= 0 &&
      ::chown(path.c_str(), static_cast<uid_t>(-1), static_cast<gid_t>(config_.group)) != 0) {
    return ErrnoStatus(errno, "chown " + path + " to group " + std::to_string(config_.group));
  }
  spdlog::info("listening for trainers on {} (mode {:o})", path, config_.mode);
  Accept();
  return Status::Ok();
}

void LocalServer::Accept() {
  acceptor_.async_accept([this](const boost::system::error_code& ec,
                                boost::asio::local::stream_protocol::socket socket) {
    if (stopped_) return;
    if (ec) {
      if (ec == boost::asio::error::operation_aborted) return;
      spdlog::warn("accept on {}: {}", config_.path, ec.message());
    } else {
      ucred cred = {};
      socklen_t len = sizeof cred;
      ::getsockopt(socket.native_handle(), SOL_SOCKET, SO_PEERCRED, &cred, &len);
      if (!config_.allowed_uids.empty() && config_.allowed_uids.count(cred.uid) == 0) {
        spdlog::warn("refused a client with uid {} (pid {}): not in the allowed uids", cred.uid,
                     cred.pid);
        boost::system::error_code ignored;
        socket.close(ignored);
      } else {
        auto session =
            std::make_shared<Session>(std::move(socket), next_id_++, cred.pid, cred.uid, services_);
        std::erase_if(sessions_, [](const auto& w) { return w.expired(); });
        sessions_.push_back(session);
        session->Start();
      }
    }
    Accept();
  });
}

void LocalServer::Stop(bool close_sessions) {
  if (!stopped_) {
    stopped_ = true;
    boost::system::error_code ignored;
    acceptor_.close(ignored);
    ::unlink(config_.path.c_str());
  }
  if (close_sessions) {
    for (auto& w : sessions_) {
      if (auto s = w.lock()) s->Close("daemon shutting down");
    }
    sessions_.clear();
  }
}

size_t LocalServer::sessions() const {
  size_t n = 0;
  for (const auto& w : sessions_) {
    if (auto s = w.lock(); s && !s->closed()) ++n;
  }
  return n;
}

}  // namespace ckpt
