#include "common/names.h"

#include <cstdint>
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
  size_t i = 0;
  for (; i < s.size() && out.size() < 80; ++i) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c >= 0x7f || c == '\\') {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  if (i < s.size()) out += "...";
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
  // Printable UTF-8: well-formed sequences (no overlongs, surrogates or code points past
  // U+10FFFF), and no C0/C1 control characters or DEL.
  const auto* p = reinterpret_cast<const unsigned char*>(name.data());
  const auto* end = p + name.size();
  while (p < end) {
    uint32_t cp;
    int extra;
    if (*p < 0x80)
      cp = *p, extra = 0;
    else if ((*p & 0xe0) == 0xc0)
      cp = *p & 0x1f, extra = 1;
    else if ((*p & 0xf0) == 0xe0)
      cp = *p & 0x0f, extra = 2;
    else if ((*p & 0xf8) == 0xf0)
      cp = *p & 0x07, extra = 3;
    else
      return InvalidArgument("tensor name '" + EscapeForLog(name) + "' is not valid UTF-8");
    if (end - p <= extra) {
      return InvalidArgument("tensor name '" + EscapeForLog(name) + "' is not valid UTF-8");
    }
    for (int k = 1; k <= extra; ++k) {
      if ((p[k] & 0xc0) != 0x80) {
        return InvalidArgument("tensor name '" + EscapeForLog(name) + "' is not valid UTF-8");
      }
      cp = (cp << 6) | (p[k] & 0x3f);
    }
    static constexpr uint32_t kMin[] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[extra] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) {
      return InvalidArgument("tensor name '" + EscapeForLog(name) + "' is not valid UTF-8");
    }
    if (cp < 0x20 || (cp >= 0x7f && cp <= 0x9f)) {
      return InvalidArgument("tensor name '" + EscapeForLog(name) +
                             "' contains a control character");
    }
    p += extra + 1;
  }
  return Status::Ok();
}

Status ValidateDataFileName(std::string_view file) {
  const auto bad = [&](const std::string& why) {
    return InvalidArgument("file name '" + EscapeForLog(file) + "' " + why);
  };
  if (file.empty() || file.size() > kMaxDataFileNameLength) {
    return bad("must be 1-" + std::to_string(kMaxDataFileNameLength) + " bytes");
  }
  for (char c : file) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    if (!ok) return bad("may hold only [A-Za-z0-9._-]");
  }
  if (file.front() == '.') return bad("must not start with '.'");
  constexpr std::string_view kSuffix = ".data";
  if (file.size() <= kSuffix.size() || file.substr(file.size() - kSuffix.size()) != kSuffix) {
    return bad("is not a data file (*.data)");
  }
  return Status::Ok();
}

}  // namespace ckpt
