#include "daemon/peer/peer_address.h"

#include <charconv>

namespace ckpt::peer {

Result<HostPort> ParseHostPort(std::string_view text) {
  const auto bad = [&](const std::string& why) {
    return InvalidArgument("'" + std::string(text) + "' is not host:port (" + why + ")");
  };
  const size_t colon = text.rfind(':');
  if (colon == std::string_view::npos) return bad("no port");
  std::string_view host = text.substr(0, colon);
  const std::string_view port = text.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  } else if (host.find(':') != std::string_view::npos) {
    return bad("an IPv6 address goes in brackets");
  }
  if (host.empty()) return bad("no host");
  unsigned value = 0;
  const auto [p, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (port.empty() || ec != std::errc() || p != port.data() + port.size() || value > 65535) {
    return bad("bad port");
  }
  return HostPort{std::string(host), static_cast<uint16_t>(value)};
}

}  // namespace ckpt::peer
