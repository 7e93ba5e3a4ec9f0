// "host:port" as the data plane's flags and clients spell an endpoint: an IPv4 address, or an
// IPv6 one in brackets ("[::1]:7470"); the port 0-65535.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace ckpt::peer {

struct HostPort {
  std::string host;  // without brackets
  uint16_t port = 0;
};

// kInvalidArgument naming the text when it is not host:port.
Result<HostPort> ParseHostPort(std::string_view text);

}  // namespace ckpt::peer
