// Status and Result<T>: the one error type of ckptd.
//
// Every fallible function returns Status or Result<T>; both are [[nodiscard]]. A Status carries
// a code, a human message that names what it is about (job, step, tensor, path) and, for
// failed system calls, the errno. Context is prepended while an error propagates:
//
//   RETURN_IF_ERROR(writer.Finish(), "step " + std::to_string(step));
//   ASSIGN_OR_RETURN(auto manifest, ReadManifest(fs, dir));
//
// No exceptions cross threads, Asio handlers or RPC boundaries; the gRPC mapping lives in
// exactly one function (daemon/admin). Thread safety: values, freely copyable.
#pragma once

#include <cerrno>
#include <cstdint>
#include <optional>
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
  kResourceExhausted = 8,   // pool full with on_full=skip, ENOSPC, fd limits
  kFailedPrecondition = 9,
  kAborted = 10,            // a step aborted (dead rank, timeout)
  kOutOfRange = 11,
  kUnimplemented = 12,
  kInternal = 13,
  kUnavailable = 14,        // daemon or coordinator unreachable, draining
  kDataLoss = 15,           // checksum mismatch, truncated data file
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

// Status for a failed system call: the code follows errno (ENOSPC/EDQUOT/EMFILE/ENFILE/ENOMEM →
// kResourceExhausted, ENOENT → kNotFound, EACCES/EPERM → kPermissionDenied, EEXIST →
// kAlreadyExists, EINVAL → kInvalidArgument, ETIMEDOUT → kDeadlineExceeded, others →
// kInternal); the message is "what: strerror(err) (errno N at file:line)"; the errno is kept.
Status ErrnoStatus(int err, std::string_view what, const char* file = __builtin_FILE(),
                   int line = __builtin_LINE());

inline Status InvalidArgument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status FailedPrecondition(std::string m) {
  return {StatusCode::kFailedPrecondition, std::move(m)};
}
inline Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
inline Status DataLoss(std::string m) { return {StatusCode::kDataLoss, std::move(m)}; }
inline Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
inline Status Aborted(std::string m) { return {StatusCode::kAborted, std::move(m)}; }
inline Status ResourceExhausted(std::string m) {
  return {StatusCode::kResourceExhausted, std::move(m)};
}
inline Status DeadlineExceeded(std::string m) {
  return {StatusCode::kDeadlineExceeded, std::move(m)};
}
inline Status PermissionDenied(std::string m) {
  return {StatusCode::kPermissionDenied, std::move(m)};
}
inline Status OutOfRange(std::string m) { return {StatusCode::kOutOfRange, std::move(m)}; }
inline Status Unimplemented(std::string m) { return {StatusCode::kUnimplemented, std::move(m)}; }

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
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

namespace detail {
inline Status AsStatus(const Status& s) { return s; }
template <typename T>
Status AsStatus(const Result<T>& r) { return r.status(); }
}  // namespace detail

}  // namespace ckpt

#define CKPT_CONCAT_INNER(a, b) a##b
#define CKPT_CONCAT(a, b) CKPT_CONCAT_INNER(a, b)

// RETURN_IF_ERROR(expr) or RETURN_IF_ERROR(expr, context): expr is a Status or Result<T>.
#define RETURN_IF_ERROR(...) CKPT_RIE_PICK(__VA_ARGS__, CKPT_RIE2, CKPT_RIE1)(__VA_ARGS__)
#define CKPT_RIE_PICK(_1, _2, NAME, ...) NAME
#define CKPT_RIE1(expr)                                              \
  do {                                                               \
    ::ckpt::Status _st = ::ckpt::detail::AsStatus(expr);             \
    if (!_st.ok()) return _st;                                       \
  } while (0)
#define CKPT_RIE2(expr, context)                                     \
  do {                                                               \
    ::ckpt::Status _st = ::ckpt::detail::AsStatus(expr);             \
    if (!_st.ok()) return std::move(_st).WithContext(context);       \
  } while (0)

// ASSIGN_OR_RETURN(lhs, expr) or ASSIGN_OR_RETURN(lhs, expr, context): expr is a Result<T>;
// on error returns its status (with context prepended).
#define ASSIGN_OR_RETURN(...) CKPT_AOR_PICK(__VA_ARGS__, CKPT_AOR3, CKPT_AOR2)(__VA_ARGS__)
#define CKPT_AOR_PICK(_1, _2, _3, NAME, ...) NAME
#define CKPT_AOR2(lhs, expr) CKPT_AOR_IMPL(CKPT_CONCAT(_result_, __LINE__), lhs, expr, "")
#define CKPT_AOR3(lhs, expr, context) \
  CKPT_AOR_IMPL(CKPT_CONCAT(_result_, __LINE__), lhs, expr, context)
#define CKPT_AOR_IMPL(tmp, lhs, expr, context)                      \
  auto tmp = (expr);                                                \
  if (!tmp.ok()) return tmp.status().WithContext(context);          \
  lhs = std::move(tmp).value()
