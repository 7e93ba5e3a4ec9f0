// Framing of the local data plane (proto/ckptd/v1/local.proto, proto/README.md).
//
// A frame is [u32 little-endian payload length][payload], the payload a serialized
// ClientMessage or DaemonMessage, at most kMaxFrameBytes. File descriptors travel as
// SCM_RIGHTS on the frame's first sendmsg (so they arrive with its header) — at most
// kMaxFdsPerFrame. The reader reads each frame's header and payload exactly, never past the
// frame's end, so descriptors can never be attributed to the wrong frame.
//
// Blocking helpers for clients live here; the daemon uses FrameReader from its Asio loop with a
// non-blocking socket. Thread safety: FrameReader is single-threaded; SendFrame is safe when
// calls on one socket are serialized by the caller.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"

namespace ckpt {

inline constexpr uint32_t kMaxFrameBytes = 64u << 20;
inline constexpr size_t kMaxFdsPerFrame = 250;

// An owned file descriptor: closed on destruction. Move-only.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.release()) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept;
  ~UniqueFd();
  int get() const { return fd_; }
  int release() {
    int f = fd_;
    fd_ = -1;
    return f;
  }
  explicit operator bool() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

struct Frame {
  std::string payload;
  std::vector<UniqueFd> fds;
};

// Incremental reader of frames from a stream socket.
class FrameReader {
 public:
  // Reads what is available without blocking (socket must be non-blocking; for a blocking
  // socket it blocks until some bytes arrive). Returns a complete frame, nullopt when more bytes
  // are needed (EAGAIN), kUnavailable "peer closed" on EOF, kInvalidArgument for an oversized
  // frame or descriptors in the middle of a frame, or the errno status.
  Result<std::optional<Frame>> ReadSome(int fd);

 private:
  char header_[4];
  size_t header_have_ = 0;
  uint32_t length_ = 0;
  Frame current_;
  size_t payload_have_ = 0;
};

// Sends one frame with its descriptors (blocking until all bytes are written; EAGAIN is waited
// out with poll). kInvalidArgument if the payload or fd count is over the limits.
Status SendFrame(int socket_fd, std::string_view payload, std::span<const int> fds = {});

// As SendFrame, but gives up at `deadline` with kDeadlineExceeded. `*sent` is set to the bytes
// of the frame that went out: 0 leaves the stream usable, anything between 0 and the whole frame
// means the stream now holds part of a frame and must be abandoned.
Status SendFrameUntil(int socket_fd, std::string_view payload, std::span<const int> fds,
                      std::chrono::steady_clock::time_point deadline, size_t* sent);

// Encodes [len][payload] without descriptors (for the daemon's async writes).
std::string EncodeFrame(std::string_view payload);

}  // namespace ckpt
