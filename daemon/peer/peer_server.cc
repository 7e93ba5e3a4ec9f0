#include "daemon/peer/peer_server.h"

#include <array>
#include <boost/asio/ip/address.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <future>
#include <new>
#include <vector>

#include "common/buffer_cache.h"
#include "common/checksum.h"
#include "common/logging.h"
#include "common/names.h"
#include "daemon/peer/peer_address.h"

namespace ckpt::peer {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using boost::system::error_code;

class PeerServer::Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(PeerServer* server, tcp::socket socket)
      : server_(server), socket_(std::move(socket)), timer_(server->io_) {
    error_code ec;
    const auto remote = socket_.remote_endpoint(ec);
    peer_ = ec ? std::string("unknown peer")
               : remote.address().to_string() + ":" + std::to_string(remote.port());
    socket_.set_option(tcp::no_delay(true), ec);
  }

  void Begin() { ReadHeader(); }

  // Closes the socket and forgets the connection. Loop only; idempotent.
  void Close() {
    if (closed_) return;
    closed_ = true;
    error_code ec;
    socket_.shutdown(tcp::socket::shutdown_both, ec);
    socket_.close(ec);
    timer_.cancel();
    --server_->open_connections_;
    server_->live_.erase(shared_from_this());
  }

 private:
  // Closes the connection after `d` unless re-armed or cancelled first.
  void Arm(std::chrono::milliseconds d, std::string what) {
    timer_.expires_after(d);
    timer_.async_wait([self = shared_from_this(), d, what = std::move(what)](error_code ec) {
      if (ec || self->closed_) return;
      spdlog::warn("peer data plane: {}: no {} within {} ms: closing the connection", self->peer_,
                   what, d.count());
      self->Fail("timeout");
    });
  }

  void Fail(std::string_view reason) {
    if (server_->observer_ != nullptr) server_->observer_->OnPeerFailure(reason);
    Close();
  }

  void ReadHeader() {
    Arm(server_->config_.idle_timeout, "request");
    asio::async_read(socket_, asio::buffer(in_header_),
                     [self = shared_from_this()](error_code ec, size_t) { self->OnHeader(ec); });
  }

  void OnHeader(error_code ec) {
    if (closed_) return;
    if (ec) {
      if (ec != asio::error::eof && ec != asio::error::operation_aborted) {
        spdlog::info("peer data plane: {}: {}: closing", peer_, ec.message());
      }
      Close();
      return;
    }
    auto header = DecodeHeader(std::span<const std::byte, kHeaderBytes>(in_header_));
    if (!header.ok()) {
      Malformed(header.status());
      return;
    }
    request_ = *header;
    if (request_.type == FrameType::kReply) {
      Malformed(InvalidArgument("peer frame: a REPLY where a request was expected"));
      return;
    }
    meta_.resize(request_.meta_length);
    Arm(server_->config_.frame_timeout, "complete frame");
    asio::async_read(socket_, asio::buffer(meta_),
                     [self = shared_from_this()](error_code e, size_t) { self->OnMeta(e); });
  }

  void OnMeta(error_code ec) {
    if (closed_) return;
    if (ec) {
      spdlog::warn("peer data plane: {}: frame cut short ({}): closing", peer_, ec.message());
      Fail("malformed");
      return;
    }
    switch (request_.type) {
      case FrameType::kFetch:
        HandleFetch();
        return;
      case FrameType::kPut:
        HandlePut();
        return;
      case FrameType::kDrop:
        HandleDrop();
        return;
      case FrameType::kReply:
        break;
    }
    Close();
  }

  // A frame that cannot be parsed: log, answer once (best effort), close.
  void Malformed(const Status& why) {
    spdlog::warn("peer data plane: {}: {}: closing the connection", peer_, why.message());
    if (server_->observer_ != nullptr) server_->observer_->OnPeerFailure("malformed");
    request_.request_id = 0;
    Reply(why, nullptr, 0, 0, /*then_close=*/true);
  }

  void HandleFetch() {
    auto region = DecodeRegion(meta_);
    if (!region.ok()) {
      Malformed(region.status());
      return;
    }
    if (Status v = ValidateRegion(*region); !v.ok()) {
      Reply(v, nullptr, 0, 0);
      return;
    }
    // Reserved until the reply's buffer is freed (written, failed or the connection closed).
    PeerServer* server = server_;
    const uint64_t bytes = region->length;
    if (server->fetch_bytes_.fetch_add(bytes) + bytes > server->config_.max_fetch_bytes) {
      server->fetch_bytes_ -= bytes;
      if (server->observer_ != nullptr) server->observer_->OnPeerFailure("full");
      Reply(ResourceExhausted("peer: FETCH of " + DescribeRegion(*region) + ": " +
                              std::to_string(server->config_.max_fetch_bytes) +
                              " bytes of replies already in flight; read it elsewhere"),
            nullptr, 0, 0);
      return;
    }
    std::shared_ptr<void> reserved(nullptr,
                                   [server, bytes](void*) { server->fetch_bytes_ -= bytes; });
    timer_.cancel();  // no read pending while the pool works
    auto self = shared_from_this();
    const bool posted = server_->pool_.Post([self, region = *region, reserved] {
      if (self->closed_) return;  // closed while queued (or the server stopping): no read
      // The reply's bytes go into a buffer from the shared cache, given back once sent: a node
      // serving FETCH after FETCH does not fault in and zero a fresh one each time.
      std::shared_ptr<AlignedBuffer> buffer;
      try {
        buffer = std::make_shared<AlignedBuffer>(
            BufferCache::Shared().Take(std::max<uint64_t>(region.length, 1)));
      } catch (const std::bad_alloc&) {
        asio::post(self->server_->io_, [self, region] {
          self->Reply(ResourceExhausted("peer: FETCH of " + DescribeRegion(region) +
                                        ": no memory for the reply; read it elsewhere"),
                      nullptr, 0, 0);
        });
        return;
      }
      std::shared_ptr<std::byte[]> data(buffer->data(), [buffer, reserved](std::byte*) {
        BufferCache::Shared().Give(std::move(*buffer));
      });
      Status status = self->server_->source_->Read(region, data.get());
      const uint64_t sum = status.ok() ? Xxh3(data.get(), region.length) : 0;
      asio::post(self->server_->io_, [self, status = std::move(status), data, region, sum] {
        self->Reply(status, data, region.length, sum);
      });
    });
    if (!posted) Reply(DaemonStopping("peer: FETCH of " + DescribeRegion(*region)), nullptr, 0, 0);
  }

  void HandlePut() {
    auto region = DecodeRegion(meta_);
    if (!region.ok()) {
      Malformed(region.status());
      return;
    }
    if (region->length != request_.data_length) {
      Malformed(InvalidArgument("peer frame PUT: region of " + std::to_string(region->length) +
                                " bytes carries " + std::to_string(request_.data_length) +
                                " bytes of data"));
      return;
    }
    Status admitted = ValidateRegion(*region);
    std::unique_ptr<PeerStore::Reservation> reservation;
    if (admitted.ok() && server_->store_ == nullptr) {
      admitted =
          FailedPrecondition("peer: PUT of " + DescribeRegion(*region) +
                             ": this daemon holds no copies for other nodes (--peer-pool 0)");
    }
    if (admitted.ok()) {
      auto r = server_->store_->Reserve(*region);
      if (r.ok()) {
        reservation = std::move(r).value();
      } else {
        admitted = r.status();
      }
    }
    if (!admitted.ok()) {
      Discard(request_.data_length, admitted);
      return;
    }
    // Received straight into the region's own buffer: no copy.
    auto held = std::shared_ptr<PeerStore::Reservation>(std::move(reservation));
    asio::async_read(socket_, asio::buffer(held->data(), region->length),
                     [self = shared_from_this(), held](error_code ec, size_t n) mutable {
                       if (self->closed_) return;
                       if (ec) {
                         spdlog::warn("peer data plane: {}: PUT of {} cut short ({}): closing",
                                      self->peer_, DescribeRegion(held->region()), ec.message());
                         self->Fail("unavailable");
                         return;
                       }
                       self->OnPutData(std::move(held), n);
                     });
  }

  void OnPutData(std::shared_ptr<PeerStore::Reservation> held, uint64_t bytes) {
    if (server_->observer_ != nullptr) server_->observer_->OnPeerBytes(Direction::kReceived, bytes);
    timer_.cancel();
    auto self = shared_from_this();
    const uint64_t expected = request_.data_xxh3;
    const bool posted = server_->pool_.Post([self, held, expected]() mutable {
      const Region& r = held->region();
      const uint64_t got = Xxh3(held->data(), r.length);
      Status status = Status::Ok();
      if (got != expected) {
        status = DataLoss("peer: PUT of " + DescribeRegion(r) +
                          ": checksum mismatch (the frame says " + std::to_string(expected) +
                          ", the bytes hash to " + std::to_string(got) + "): not stored");
        spdlog::warn("peer data plane: {}: {}", self->peer_, status.message());
      } else {
        self->server_->store_->Commit(*held);
      }
      held.reset();
      asio::post(self->server_->io_,
                 [self, status = std::move(status)] { self->Reply(status, nullptr, 0, 0); });
    });
    if (!posted) Reply(DaemonStopping("peer: PUT"), nullptr, 0, 0);
  }

  // Reads and throws away `remaining` data bytes of a refused PUT, then answers `status`.
  void Discard(uint64_t remaining, Status status) {
    if (remaining == 0) {
      Reply(status, nullptr, 0, 0);
      return;
    }
    if (scratch_.empty()) scratch_.resize(1 << 20);
    const size_t n = static_cast<size_t>(std::min<uint64_t>(remaining, scratch_.size()));
    asio::async_read(socket_, asio::buffer(scratch_.data(), n),
                     [self = shared_from_this(), remaining, n, status = std::move(status)](
                         error_code ec, size_t) mutable {
                       if (self->closed_) return;
                       if (ec) {
                         self->Close();
                         return;
                       }
                       self->Discard(remaining - n, std::move(status));
                     });
  }

  void HandleDrop() {
    auto step = DecodeStep(meta_);
    if (!step.ok()) {
      Malformed(step.status());
      return;
    }
    if (Status v = ValidateJobName(step->job); !v.ok()) {
      Reply(v.WithContext("peer DROP"), nullptr, 0, 0);
      return;
    }
    if (!step->file.empty()) {
      if (Status v = ValidateDataFileName(step->file); !v.ok()) {
        Reply(v.WithContext("peer DROP"), nullptr, 0, 0);
        return;
      }
    }
    if (server_->store_ == nullptr) {
      Reply(FailedPrecondition("peer: DROP of job '" + step->job + "' step " +
                               std::to_string(step->step) +
                               ": this daemon holds no copies for other nodes (--peer-pool 0)"),
            nullptr, 0, 0);
      return;
    }
    const uint64_t freed = step->file.empty()
                               ? server_->store_->DropStep(step->job, step->step)
                               : server_->store_->DropFile(step->job, step->step, step->file);
    spdlog::debug("peer data plane: {}: dropped job '{}' step {} {}({} bytes)", peer_, step->job,
                  step->step, step->file.empty() ? "" : "file " + step->file + " ", freed);
    Reply(Status(StatusCode::kOk, "dropped " + std::to_string(freed) + " bytes"), nullptr, 0, 0);
  }

  // Answers the current request: `status`, and for an OK FETCH its `length` data bytes.
  void Reply(Status status, std::shared_ptr<std::byte[]> data, uint64_t length, uint64_t sum,
             bool then_close = false) {
    if (closed_) return;
    if (!status.ok()) {
      length = 0;
      data.reset();
      if (!then_close && server_->observer_ != nullptr) {
        server_->observer_->OnPeerFailure(PeerFailureReason(status.code()));
      }
    }
    FrameHeader h;
    h.type = FrameType::kReply;
    h.request_id = request_.request_id;
    out_meta_ = EncodeReply(status);
    h.meta_length = static_cast<uint32_t>(out_meta_.size());
    h.data_length = length;
    h.data_xxh3 = length == 0 ? 0 : sum;
    EncodeHeader(h, out_header_);
    out_data_ = std::move(data);
    const auto wait = (length > 0 && server_->bucket_ != nullptr) ? server_->bucket_->Take(length)
                                                                  : std::chrono::nanoseconds(0);
    if (wait.count() > 0) {
      timer_.expires_after(wait);
      timer_.async_wait([self = shared_from_this(), length, then_close](error_code ec) {
        if (ec || self->closed_) return;
        self->Write(length, then_close);
      });
      return;
    }
    Write(length, then_close);
  }

  void Write(uint64_t length, bool then_close) {
    Arm(server_->config_.frame_timeout, "progress writing a reply");
    std::array<asio::const_buffer, 3> buffers = {
        asio::buffer(out_header_), asio::buffer(out_meta_),
        asio::buffer(out_data_.get(), static_cast<size_t>(length))};
    asio::async_write(socket_, buffers,
                      [self = shared_from_this(), length, then_close](error_code ec, size_t) {
                        self->out_data_.reset();
                        // Counted even when the connection was closed meanwhile: the bytes
                        // went out.
                        if (!ec && length > 0 && self->server_->observer_ != nullptr) {
                          self->server_->observer_->OnPeerBytes(Direction::kSent, length);
                        }
                        if (self->closed_) return;
                        if (ec) {
                          spdlog::warn("peer data plane: {}: writing a reply: {}: closing",
                                       self->peer_, ec.message());
                          self->Fail("unavailable");
                          return;
                        }
                        if (then_close) {
                          self->Close();
                          return;
                        }
                        self->ReadHeader();
                      });
  }

  PeerServer* server_;
  tcp::socket socket_;
  asio::steady_timer timer_;
  std::string peer_;
  std::atomic<bool> closed_{false};  // set on the loop, read by pool tasks too
  std::byte in_header_[kHeaderBytes];
  FrameHeader request_;
  std::string meta_;
  std::vector<std::byte> scratch_;
  std::byte out_header_[kHeaderBytes];
  std::string out_meta_;
  std::shared_ptr<std::byte[]> out_data_;
};

PeerServer::PeerServer(Config config, PeerSource* source, PeerStore* store, TokenBucket* bucket,
                       PeerObserver* observer)
    : config_(std::move(config)),
      source_(source),
      store_(store),
      bucket_(bucket),
      observer_(observer),
      pool_(std::max(1, config_.threads), config_.nice, "peer") {}

PeerServer::~PeerServer() { Stop(); }

Status PeerServer::Start() {
  ASSIGN_OR_RETURN(const HostPort hp, ParseHostPort(config_.listen), "peer-listen");
  error_code ec;
  const auto address = asio::ip::make_address(hp.host, ec);
  if (ec) {
    return InvalidArgument("peer-listen: '" + hp.host + "' is not an IP address (" + ec.message() +
                           ")");
  }
  const tcp::endpoint endpoint(address, hp.port);
  const auto fail = [&](const char* what) {
    return Unavailable("peer-listen: cannot serve the peer data plane on " + config_.listen + ": " +
                       what + ": " + ec.message());
  };
  acceptor_.open(endpoint.protocol(), ec);
  if (ec) return fail("open");
  acceptor_.set_option(tcp::acceptor::reuse_address(true), ec);
  acceptor_.bind(endpoint, ec);
  if (ec) return fail("bind");
  acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return fail("listen");
  host_ = hp.host;
  port_ = acceptor_.local_endpoint().port();
  pool_.Start();
  Accept();
  started_ = true;
  loop_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "peer-io");
    io_.run();
  });
  spdlog::info("peer data plane: serving on {}", bound_address());
  return Status::Ok();
}

void PeerServer::Accept() {
  acceptor_.async_accept([this](error_code ec, tcp::socket socket) {
    if (ec) {
      if (ec == asio::error::operation_aborted || !acceptor_.is_open()) return;
      spdlog::warn("peer data plane: accept: {}", ec.message());
      Accept();
      return;
    }
    if (live_.size() >= config_.max_connections) {
      spdlog::warn("peer data plane: {} connections open (the limit): refusing another",
                   live_.size());
      if (observer_ != nullptr) observer_->OnPeerFailure("unavailable");
      error_code ignored;
      socket.close(ignored);
    } else {
      auto connection = std::make_shared<Connection>(this, std::move(socket));
      live_.insert(connection);
      ++open_connections_;
      connection->Begin();
    }
    Accept();
  });
}

void PeerServer::Stop() {
  if (!started_) return;
  started_ = false;
  // Close the listener and every connection on the loop, and wait until that ran.
  std::promise<void> closed;
  asio::post(io_, [this, &closed] {
    error_code ec;
    acceptor_.close(ec);
    const auto live = live_;  // Close erases from live_
    for (const auto& c : live) c->Close();
    closed.set_value();
  });
  closed.get_future().wait();
  // Tasks still running finish; what they post back finds its connection closed.
  pool_.Stop();
  io_.stop();
  loop_.join();
  spdlog::info("peer data plane: stopped");
}

std::string PeerServer::bound_address() const {
  const bool v6 = host_.find(':') != std::string::npos;
  return (v6 ? "[" + host_ + "]" : host_) + ":" + std::to_string(port_);
}

}  // namespace ckpt::peer
