// ckpt::Status and ckpt::Result<T>: the error type of the C++ client (ckpt/client.h) and of
// ckptd itself.
//
// A Status carries a code, a human message that names what it is about (job, step, tensor,
// path) and, for failed system calls, the errno. A request the daemon refuses comes back with the
// daemon's code and message unchanged. Result<T> holds a T or a non-OK Status. Both are
// [[nodiscard]]; both are values, freely copyable, and safe to use from any thread.
//
//   auto client = ckpt::Client::Connect(options);
//   if (!client.ok()) { std::cerr << client.status().ToString() << "\n"; return 1; }
//   if (ckpt::Status st = (*client)->Save(step); !st.ok()) ...
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace ckpt {

// Codes mirror gRPC's so that the one mapping is trivial; the subsystem is named in the message.
enum class StatusCode : uint32_t {
  kOk = 0,
  kCancelled = 1,
  kUnknown = 2,
  kInvalidArgument = 3,
  kDeadlineExceeded = 4,
  kNotFound = 5,
  kAlreadyExists = 6,
  kPermissionDenied = 7,
  kResourceExhausted = 8,  // pool full with on_full=skip, ENOSPC, fd limits
  kFailedPrecondition = 9,
  kAborted = 10,  // a step aborted (dead rank, timeout)
  kOutOfRange = 11,
  kUnimplemented = 12,
  kInternal = 13,
  kUnavailable = 14,  // daemon or coordinator unreachable, draining
  kDataLoss = 15,     // checksum mismatch, truncated data file
};

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message, int sys_errno = 0)
      : code_(code), message_(std::move(message)), errno_(sys_errno) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  int sys_errno() const { return errno_; }

  // "context: message". Returns *this unchanged when ok.
  Status WithContext(std::string_view context) const&;
  Status WithContext(std::string_view context) &&;

  // "INVALID_ARGUMENT: message", plus " (errno N, strerror)" when the status carries an errno
  // that its message does not already name (ErrnoStatus messages do).
  std::string ToString() const;

  void IgnoreError() const {}

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
  int errno_ = 0;
};

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}        // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {  // NOLINT
    if (std::get<Status>(v_).ok()) v_ = Status(StatusCode::kInternal, "Result from OK status");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<Status, T> v_;
};

}  // namespace ckpt
