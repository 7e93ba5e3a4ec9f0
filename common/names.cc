#include "common/names.h"

#include <cstdio>

namespace ckpt {
namespace {

Status ValidatePathComponent(std::string_view what, std::string_view s, size_t max_len) {
  if (s.empty()) return InvalidArgument(std::string(what) + " is empty");
  if (s.size() > max_len) {
    return InvalidArgument(std::string(what) + " '" + EscapeForLog(s) + "' is " +
                           std::to_string(s.size()) + " bytes; the limit is " +
                           std::to_string(max_len));
  }
  if (s == "." || s == "..") {
    return InvalidArgument(std::string(what) + " '" + std::string(s) + "' is not allowed");
  }
  for (char c : s) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-';
    if (!ok) {
      return InvalidArgument(std::string(what) + " '" + EscapeForLog(s) +
                             "' may only contain letters, digits, '.', '_' and '-'");
    }
  }
  return Status::Ok();
}

}  // namespace

std::string EscapeForLog(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size() && out.size() < 80; ++i) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c >= 0x7f || c == '\\') {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  if (out.size() >= 80 && s.size() > 80) out += "...";
  return out;
}

Status ValidateJobName(std::string_view job) {
  return ValidatePathComponent("job name", job, kMaxJobNameLength);
}

Status ValidateNodeId(std::string_view node_id) {
  return ValidatePathComponent("node id", node_id, kMaxNodeIdLength);
}

Status ValidateTensorName(std::string_view name) {
  if (name.empty()) return InvalidArgument("tensor name is empty");
  if (name.size() > kMaxTensorNameLength) {
    return InvalidArgument("tensor name '" + EscapeForLog(name) + "' is " +
                           std::to_string(name.size()) + " bytes; the limit is " +
                           std::to_string(kMaxTensorNameLength));
  }
  for (char ch : name) {
    unsigned char c = static_cast<unsigned char>(ch);
    if (c < 0x20 || c == 0x7f) {
      return InvalidArgument("tensor name '" + EscapeForLog(name) +
                             "' contains a control character");
    }
  }
  return Status::Ok();
}

}  // namespace ckpt
