// Scraping a Prometheus endpoint the way a scraper does, for the tests of ckptd's and
// ckpt-coordinator's `--metrics`: a plain HTTP/1.0 GET over a socket (no HTTP library in the
// tests), and the value of one sample line of the text page. Include it after the harness
// (daemon_harness.h or coordinator_harness.h), which configures Catch.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <sstream>
#include <string>

#include "common/frame_io.h"  // UniqueFd

namespace ckpt::itest {

// GET http://host:port/path; the body. Fails the test unless the answer is 200.
inline std::string HttpGet(const std::string& host_port, const std::string& path) {
  const auto colon = host_port.rfind(':');
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(std::stoi(host_port.substr(colon + 1))));
  REQUIRE(::inet_pton(AF_INET, host_port.substr(0, colon).c_str(), &addr.sin_addr) == 1);
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  REQUIRE(fd);
  REQUIRE(::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  const std::string request =
      "GET " + path + " HTTP/1.0\r\nHost: " + host_port + "\r\nConnection: close\r\n\r\n";
  REQUIRE(::send(fd.get(), request.data(), request.size(), MSG_NOSIGNAL) ==
          static_cast<ssize_t>(request.size()));
  std::string response;
  char buf[8192];
  for (ssize_t n; (n = ::recv(fd.get(), buf, sizeof buf, 0)) > 0;) response.append(buf, n);
  const auto body = response.find("\r\n\r\n");
  INFO(response.substr(0, 200));
  REQUIRE(response.rfind("HTTP/1.", 0) == 0);
  REQUIRE(response.find(" 200 ") != std::string::npos);
  return body == std::string::npos ? "" : response.substr(body + 4);
}

// The value of one sample line ("name{labels} value") of a Prometheus text page; -1 if absent.
inline double Sample(const std::string& page, const std::string& series) {
  std::istringstream in(page);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(series + " ", 0) == 0) return std::stod(line.substr(series.size() + 1));
  }
  return -1;
}

}  // namespace ckpt::itest
