#include "common/frame_io.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace ckpt {

UniqueFd& UniqueFd::operator=(UniqueFd&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.release();
  }
  return *this;
}

UniqueFd::~UniqueFd() {
  if (fd_ >= 0) ::close(fd_);
}

namespace {

// recvmsg into buf, appending received descriptors to *fds. Returns bytes read (0 = EOF),
// -1 with errno on error.
ssize_t RecvWithFds(int fd, void* buf, size_t len, std::vector<UniqueFd>* fds, bool* truncated) {
  alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerFrame)];
  struct iovec iov = {buf, len};
  struct msghdr msg = {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t n;
  do {
    n = ::recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return n;
  *truncated = (msg.msg_flags & MSG_CTRUNC) != 0;
  for (struct cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      const unsigned char* data = CMSG_DATA(c);
      for (size_t i = 0; i < count; ++i) {
        int received;
        std::memcpy(&received, data + i * sizeof(int), sizeof(int));
        fds->emplace_back(received);
      }
    }
  }
  return n;
}

}  // namespace

Result<std::optional<Frame>> FrameReader::ReadSome(int fd) {
  while (true) {
    std::vector<UniqueFd> fds;
    bool truncated = false;
    ssize_t n;
    const bool in_header = header_have_ < sizeof header_;
    if (in_header) {
      n = RecvWithFds(fd, header_ + header_have_, sizeof header_ - header_have_, &fds, &truncated);
    } else {
      // The buffer grows with the bytes that actually arrive (doubling, from 64 KiB), so a
      // header that merely claims a large frame costs the reader nothing.
      if (payload_have_ == current_.payload.size()) {
        const size_t grown = std::max<size_t>(current_.payload.size() * 2, 64 << 10);
        current_.payload.resize(std::min<size_t>(grown, length_));
      }
      n = RecvWithFds(fd, current_.payload.data() + payload_have_,
                      current_.payload.size() - payload_have_, &fds, &truncated);
    }
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return std::optional<Frame>();
      return ErrnoStatus(errno, "recvmsg on the local socket");
    }
    if (n == 0) {
      if (header_have_ == 0) return Unavailable("peer closed the connection");
      return Unavailable("peer closed the connection in the middle of a frame");
    }
    if (truncated) {
      return InvalidArgument("more than " + std::to_string(kMaxFdsPerFrame) +
                             " descriptors sent with one frame");
    }
    if (!fds.empty()) {
      // Descriptors belong to a frame's first byte.
      if (!(in_header && header_have_ == 0)) {
        return InvalidArgument("descriptors received in the middle of a frame");
      }
      if (current_.fds.size() + fds.size() > kMaxFdsPerFrame) {
        return InvalidArgument("too many descriptors for one frame");
      }
      for (auto& f : fds) current_.fds.push_back(std::move(f));
    }
    if (in_header) {
      header_have_ += static_cast<size_t>(n);
      if (header_have_ < sizeof header_) continue;
      length_ = static_cast<uint32_t>(static_cast<unsigned char>(header_[0])) |
                static_cast<uint32_t>(static_cast<unsigned char>(header_[1])) << 8 |
                static_cast<uint32_t>(static_cast<unsigned char>(header_[2])) << 16 |
                static_cast<uint32_t>(static_cast<unsigned char>(header_[3])) << 24;
      if (length_ > kMaxFrameBytes) {
        return InvalidArgument("frame of " + std::to_string(length_) + " bytes is over the " +
                               std::to_string(kMaxFrameBytes) + "-byte limit");
      }
      current_.payload.clear();
      payload_have_ = 0;
    } else {
      payload_have_ += static_cast<size_t>(n);
    }
    if (header_have_ == sizeof header_ && payload_have_ == length_) {
      Frame done = std::move(current_);
      current_ = Frame();
      header_have_ = 0;
      payload_have_ = 0;
      length_ = 0;
      return std::optional<Frame>(std::move(done));
    }
  }
}

std::string EncodeFrame(std::string_view payload) {
  std::string out;
  out.reserve(4 + payload.size());
  const uint32_t n = static_cast<uint32_t>(payload.size());
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  out.append(payload);
  return out;
}

namespace {

// Sends a whole frame; waits for room with poll until `deadline` (none: forever).
Status SendFrameImpl(int socket_fd, std::string_view payload, std::span<const int> fds,
                     std::optional<std::chrono::steady_clock::time_point> deadline,
                     size_t* sent_out) {
  size_t sent = 0;
  if (sent_out != nullptr) *sent_out = 0;
  if (payload.size() > kMaxFrameBytes) {
    return InvalidArgument("frame of " + std::to_string(payload.size()) +
                           " bytes is over the limit; split the request");
  }
  if (fds.size() > kMaxFdsPerFrame) {
    return InvalidArgument(std::to_string(fds.size()) + " descriptors in one frame; the limit is " +
                           std::to_string(kMaxFdsPerFrame));
  }
  std::string bytes = EncodeFrame(payload);
  bool fds_sent = fds.empty();
  alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerFrame)];
  while (sent < bytes.size()) {
    struct iovec iov = {bytes.data() + sent, bytes.size() - sent};
    struct msghdr msg = {};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    if (!fds_sent) {
      std::memset(control, 0, sizeof control);
      msg.msg_control = control;
      msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
      struct cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
      std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
    }
    ssize_t n = ::sendmsg(socket_fd, &msg, MSG_NOSIGNAL | (deadline ? MSG_DONTWAIT : 0));
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        int wait_ms = -1;
        if (deadline) {
          const auto left = std::chrono::ceil<std::chrono::milliseconds>(
              *deadline - std::chrono::steady_clock::now());
          if (left.count() <= 0) {
            return DeadlineExceeded("the peer took none of the last " +
                                    std::to_string(bytes.size() - sent) + " bytes of a " +
                                    std::to_string(bytes.size()) + "-byte frame in time");
          }
          wait_ms = static_cast<int>(std::min<int64_t>(left.count(), 1 << 30));
        }
        struct pollfd p = {socket_fd, POLLOUT, 0};
        ::poll(&p, 1, wait_ms);
        continue;
      }
      return ErrnoStatus(errno, "sendmsg on the local socket");
    }
    fds_sent = true;
    sent += static_cast<size_t>(n);
    if (sent_out != nullptr) *sent_out = sent;
  }
  return Status::Ok();
}

}  // namespace

Status SendFrame(int socket_fd, std::string_view payload, std::span<const int> fds) {
  return SendFrameImpl(socket_fd, payload, fds, std::nullopt, nullptr);
}

Status SendFrameUntil(int socket_fd, std::string_view payload, std::span<const int> fds,
                      std::chrono::steady_clock::time_point deadline, size_t* sent) {
  return SendFrameImpl(socket_fd, payload, fds, deadline, sent);
}

}  // namespace ckpt
