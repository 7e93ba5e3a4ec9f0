// Status and Result<T> — the one error type of ckptd, public in client/include/ckpt/status.h —
// and what the code inside ckptd uses with them: errno statuses, one constructor per code, and
// the propagation macros. Every fallible function returns Status or Result<T>. Context is
// prepended while an error propagates:
//
//   RETURN_IF_ERROR(writer.Finish(), "step " + std::to_string(step));
//   ASSIGN_OR_RETURN(auto manifest, ReadManifest(fs, dir));
//
// No exceptions cross threads, Asio handlers or RPC boundaries; the gRPC mapping lives in
// exactly one function (daemon/rpc/grpc_status.h).
#pragma once

#include <cerrno>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "ckpt/status.h"

namespace ckpt {

// Status for a failed system call: the code follows errno (ENOSPC/EDQUOT/EMFILE/ENFILE/ENOMEM →
// kResourceExhausted, ENOENT → kNotFound, EACCES/EPERM → kPermissionDenied, EEXIST →
// kAlreadyExists, EINVAL → kInvalidArgument, ETIMEDOUT → kDeadlineExceeded, others →
// kInternal); the message is "what: strerror(err) (errno N at file:line)"; the errno is kept.
Status ErrnoStatus(int err, std::string_view what, const char* file = __builtin_FILE(),
                   int line = __builtin_LINE());

inline Status InvalidArgument(std::string m) {
  return {StatusCode::kInvalidArgument, std::move(m)};
}
inline Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status FailedPrecondition(std::string m) {
  return {StatusCode::kFailedPrecondition, std::move(m)};
}
inline Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
inline Status DataLoss(std::string m) { return {StatusCode::kDataLoss, std::move(m)}; }
inline Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
// What work is answered once the daemon is stopping and the threads that would do it are gone:
// "<what>: the daemon is stopping", or "... (<detail>)" with a detail. One spelling for every
// refusal, because tests and operators match on it.
inline Status DaemonStopping(std::string_view what, std::string_view detail = {}) {
  std::string m(what);
  m += ": the daemon is stopping";
  if (!detail.empty()) {
    m += " (";
    m += detail;
    m += ")";
  }
  return Unavailable(std::move(m));
}
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

namespace detail {
inline Status AsStatus(const Status& s) { return s; }
template <typename T>
Status AsStatus(const Result<T>& r) {
  return r.status();
}
}  // namespace detail

}  // namespace ckpt

#define CKPT_CONCAT_INNER(a, b) a##b
#define CKPT_CONCAT(a, b) CKPT_CONCAT_INNER(a, b)

// RETURN_IF_ERROR(expr) or RETURN_IF_ERROR(expr, context): expr is a Status or Result<T>.
#define RETURN_IF_ERROR(...) CKPT_RIE_PICK(__VA_ARGS__, CKPT_RIE2, CKPT_RIE1)(__VA_ARGS__)
#define CKPT_RIE_PICK(_1, _2, NAME, ...) NAME
#define CKPT_RIE1(expr)                                  \
  do {                                                   \
    ::ckpt::Status _st = ::ckpt::detail::AsStatus(expr); \
    if (!_st.ok()) return _st;                           \
  } while (0)
#define CKPT_RIE2(expr, context)                               \
  do {                                                         \
    ::ckpt::Status _st = ::ckpt::detail::AsStatus(expr);       \
    if (!_st.ok()) return std::move(_st).WithContext(context); \
  } while (0)

// ASSIGN_OR_RETURN(lhs, expr) or ASSIGN_OR_RETURN(lhs, expr, context): expr is a Result<T>;
// on error returns its status (with context prepended).
#define ASSIGN_OR_RETURN(...) CKPT_AOR_PICK(__VA_ARGS__, CKPT_AOR3, CKPT_AOR2)(__VA_ARGS__)
#define CKPT_AOR_PICK(_1, _2, _3, NAME, ...) NAME
#define CKPT_AOR2(lhs, expr) CKPT_AOR_IMPL(CKPT_CONCAT(_result_, __LINE__), lhs, expr, "")
#define CKPT_AOR3(lhs, expr, context) \
  CKPT_AOR_IMPL(CKPT_CONCAT(_result_, __LINE__), lhs, expr, context)
#define CKPT_AOR_IMPL(tmp, lhs, expr, context)             \
  auto tmp = (expr);                                       \
  if (!tmp.ok()) return tmp.status().WithContext(context); \
  lhs = std::move(tmp).value()
