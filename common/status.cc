#include "common/status.h"

#include <cstring>
#include <string>

namespace ckpt {

std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "OK";
    case StatusCode::kCancelled:
      return "CANCELLED";
    case StatusCode::kUnknown:
      return "UNKNOWN";
    case StatusCode::kInvalidArgument:
      return "INVALID_ARGUMENT";
    case StatusCode::kDeadlineExceeded:
      return "DEADLINE_EXCEEDED";
    case StatusCode::kNotFound:
      return "NOT_FOUND";
    case StatusCode::kAlreadyExists:
      return "ALREADY_EXISTS";
    case StatusCode::kPermissionDenied:
      return "PERMISSION_DENIED";
    case StatusCode::kResourceExhausted:
      return "RESOURCE_EXHAUSTED";
    case StatusCode::kFailedPrecondition:
      return "FAILED_PRECONDITION";
    case StatusCode::kAborted:
      return "ABORTED";
    case StatusCode::kOutOfRange:
      return "OUT_OF_RANGE";
    case StatusCode::kUnimplemented:
      return "UNIMPLEMENTED";
    case StatusCode::kInternal:
      return "INTERNAL";
    case StatusCode::kUnavailable:
      return "UNAVAILABLE";
    case StatusCode::kDataLoss:
      return "DATA_LOSS";
  }
  return "UNKNOWN";
}

Status Status::WithContext(std::string_view context) const& {
  if (ok() || context.empty()) return *this;
  return Status(code_, std::string(context) + ": " + message_, errno_);
}

Status Status::WithContext(std::string_view context) && {
  if (ok() || context.empty()) return std::move(*this);
  message_ = std::string(context) + ": " + message_;
  return std::move(*this);
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  std::string s(StatusCodeName(code_));
  s += ": ";
  s += message_;
  if (errno_ != 0 && message_.find("errno " + std::to_string(errno_)) == std::string::npos) {
    s += " (errno " + std::to_string(errno_) + ", " + std::strerror(errno_) + ")";
  }
  return s;
}

Status ErrnoStatus(int err, std::string_view what, const char* file, int line) {
  StatusCode code = StatusCode::kInternal;
  switch (err) {
    case ENOSPC:
    case EDQUOT:
    case EMFILE:
    case ENFILE:
    case ENOMEM:
      code = StatusCode::kResourceExhausted;
      break;
    case ENOENT:
      code = StatusCode::kNotFound;
      break;
    case EACCES:
    case EPERM:
      code = StatusCode::kPermissionDenied;
      break;
    case EEXIST:
      code = StatusCode::kAlreadyExists;
      break;
    case EINVAL:
      code = StatusCode::kInvalidArgument;
      break;
    case ETIMEDOUT:
      code = StatusCode::kDeadlineExceeded;
      break;
    default:
      break;
  }
  std::string msg(what);
  msg += ": ";
  msg += std::strerror(err);
  msg += " (errno ";
  msg += std::to_string(err);
  msg += " at ";
  const char* base = std::strrchr(file, '/');
  msg += base ? base + 1 : file;
  msg += ":";
  msg += std::to_string(line);
  msg += ")";
  return Status(code, std::move(msg), err);
}

}  // namespace ckpt
