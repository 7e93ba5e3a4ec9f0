#include "daemon/peer/peer_client.h"

#include <array>
#include <boost/asio/connect.hpp>
#include <boost/asio/ip/address.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <thread>

#include "common/checksum.h"
#include "common/names.h"
#include "daemon/peer/peer_address.h"

namespace ckpt::peer {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using boost::system::error_code;

PeerClient::PeerClient(Config config, TokenBucket* bucket, PeerObserver* observer)
    : config_(std::move(config)), bucket_(bucket), observer_(observer) {}

PeerClient::~PeerClient() {
  MutexLock lock(mu_);
  Disconnect();
}

void PeerClient::Disconnect() {
  error_code ec;
  socket_.close(ec);
  connected_ = false;
}

Status PeerClient::Failed(Status status) {
  if (observer_ != nullptr) observer_->OnPeerFailure(PeerFailureReason(status.code()));
  return status;
}

template <typename StartOp>
Status PeerClient::RunUntil(Clock::time_point deadline, const std::string& what, StartOp start) {
  bool done = false;
  error_code result;
  start([&](error_code ec, auto&&...) {
    done = true;
    result = ec;
  });
  io_.restart();
  io_.run_until(deadline);
  if (!done) {
    // Deadline: closing the socket makes the operation complete (aborted); run it to the end so
    // that nothing refers to this frame afterwards.
    Disconnect();
    io_.restart();
    io_.run();
    return DeadlineExceeded("peer " + config_.address + ": " + what + ": no answer within " +
                            std::to_string(config_.timeout.count()) + " ms");
  }
  if (result) {
    Disconnect();
    return Unavailable("peer " + config_.address + ": " + what + ": " + result.message());
  }
  return Status::Ok();
}

Status PeerClient::Connect(Clock::time_point deadline, const std::string& what) {
  if (connected_) return Status::Ok();
  ASSIGN_OR_RETURN(const HostPort hp, ParseHostPort(config_.address), "peer address");
  error_code ec;
  const auto address = asio::ip::make_address(hp.host, ec);
  if (ec) {
    return InvalidArgument("peer address '" + config_.address + "': '" + hp.host +
                           "' is not an IP address");
  }
  const tcp::endpoint endpoint(address, hp.port);
  RETURN_IF_ERROR(RunUntil(deadline, what + " (connecting)", [&](auto handler) REQUIRES(mu_) {
    socket_.async_connect(endpoint, handler);
  }));
  socket_.set_option(tcp::no_delay(true), ec);
  connected_ = true;
  return Status::Ok();
}

Status PeerClient::Exchange(FrameType type, const std::string& meta, const std::byte* send,
                            uint64_t send_length, std::byte* receive, uint64_t expect,
                            const std::string& what) {
  // Pacing first, on the caller's thread: the request's deadline counts from when it may go,
  // so a wait for bandwidth never uses up the time the peer has to answer.
  if (send_length > 0 && bucket_ != nullptr)
    std::this_thread::sleep_for(bucket_->Take(send_length));
  const Clock::time_point deadline = Clock::now() + config_.timeout;
  RETURN_IF_ERROR(Connect(deadline, what));
  FrameHeader h;
  h.type = type;
  h.request_id = next_id_++;
  h.meta_length = static_cast<uint32_t>(meta.size());
  h.data_length = send_length;
  h.data_xxh3 = send_length == 0 ? 0 : Xxh3(send, send_length);
  std::byte header[kHeaderBytes];
  EncodeHeader(h, header);
  const std::array<asio::const_buffer, 3> out = {asio::buffer(header), asio::buffer(meta),
                                                 asio::buffer(send, send_length)};
  RETURN_IF_ERROR(RunUntil(deadline, what + " (sending)", [&](auto handler) REQUIRES(mu_) {
    asio::async_write(socket_, out, handler);
  }));
  if (send_length > 0 && observer_ != nullptr) {
    observer_->OnPeerBytes(Direction::kSent, send_length);
  }

  std::byte reply_header[kHeaderBytes];
  RETURN_IF_ERROR(
      RunUntil(deadline, what + " (waiting for the reply)", [&](auto handler) REQUIRES(mu_) {
        asio::async_read(socket_, asio::buffer(reply_header), handler);
      }));
  auto reply = DecodeHeader(std::span<const std::byte, kHeaderBytes>(reply_header));
  const auto protocol_error = [&](const std::string& why) REQUIRES(mu_) {
    Disconnect();
    return Internal("peer " + config_.address + ": " + what + ": " + why);
  };
  if (!reply.ok()) return protocol_error(reply.status().message());
  if (reply->type != FrameType::kReply || reply->request_id != h.request_id) {
    return protocol_error("the answer is not the reply to request " + std::to_string(h.request_id));
  }
  std::string reply_meta(reply->meta_length, '\0');
  RETURN_IF_ERROR(
      RunUntil(deadline, what + " (reading the reply)", [&](auto handler) REQUIRES(mu_) {
        asio::async_read(socket_, asio::buffer(reply_meta), handler);
      }));
  auto status = DecodeReply(reply_meta);
  if (!status.has_value()) return protocol_error("malformed reply metadata");
  if (!status->ok()) {
    if (reply->data_length != 0) return protocol_error("an error reply carries data");
    return status->WithContext("peer " + config_.address + ": " + what);
  }
  if (reply->data_length != expect) {
    return protocol_error("the reply carries " + std::to_string(reply->data_length) + " bytes, " +
                          std::to_string(expect) + " were asked for");
  }
  if (expect == 0) return Status::Ok();
  RETURN_IF_ERROR(RunUntil(deadline, what + " (receiving data)", [&](auto handler) REQUIRES(mu_) {
    asio::async_read(socket_, asio::buffer(receive, expect), handler);
  }));
  if (observer_ != nullptr) observer_->OnPeerBytes(Direction::kReceived, expect);
  const uint64_t got = Xxh3(receive, expect);
  if (got != reply->data_xxh3) {
    Disconnect();
    return DataLoss("peer " + config_.address + ": " + what +
                    ": checksum mismatch (the frame says " + std::to_string(reply->data_xxh3) +
                    ", the bytes hash to " + std::to_string(got) + "): the chunk is rejected");
  }
  return Status::Ok();
}

Status PeerClient::Fetch(const Region& region, std::byte* out) {
  RETURN_IF_ERROR(ValidateJobName(region.job), "peer FETCH");
  RETURN_IF_ERROR(ValidateDataFileName(region.file), "peer FETCH");
  if (region.offset + region.length < region.offset) {
    return InvalidArgument("peer FETCH: " + DescribeRegion(region) + ": region end overflows");
  }
  const uint64_t chunk = std::clamp<uint64_t>(config_.chunk_bytes, 1, kMaxChunkBytes);
  MutexLock lock(mu_);
  for (uint64_t done = 0; done < region.length;) {
    Region piece = region;
    piece.offset = region.offset + done;
    piece.length = std::min(chunk, region.length - done);
    const std::string what = "FETCH of " + DescribeRegion(piece);
    if (Status s = Exchange(FrameType::kFetch, EncodeRegion(piece), nullptr, 0, out + done,
                            piece.length, what);
        !s.ok()) {
      return Failed(std::move(s));
    }
    done += piece.length;
  }
  return Status::Ok();
}

Status PeerClient::Put(const Region& region, const std::byte* data) {
  RETURN_IF_ERROR(ValidateRegion(region), "peer PUT");
  MutexLock lock(mu_);
  if (Status s = Exchange(FrameType::kPut, EncodeRegion(region), data, region.length, nullptr, 0,
                          "PUT of " + DescribeRegion(region));
      !s.ok()) {
    return Failed(std::move(s));
  }
  return Status::Ok();
}

Status PeerClient::Drop(const std::string& job, uint64_t step, const std::string& file) {
  RETURN_IF_ERROR(ValidateJobName(job), "peer DROP");
  if (!file.empty()) RETURN_IF_ERROR(ValidateDataFileName(file), "peer DROP");
  MutexLock lock(mu_);
  if (Status s = Exchange(FrameType::kDrop, EncodeStep({job, step, file}), nullptr, 0, nullptr, 0,
                          "DROP of job '" + job + "' step " + std::to_string(step) +
                              (file.empty() ? "" : " file " + file));
      !s.ok()) {
    return Failed(std::move(s));
  }
  return Status::Ok();
}

}  // namespace ckpt::peer
