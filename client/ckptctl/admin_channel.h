// How ckptctl reaches a daemon's or coordinator's admin endpoint: the address (host:port or
// unix:PATH, default $CKPTCTL_ADMIN or 127.0.0.1:7460), optional TLS, and a per-call deadline.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>

#include "common/status.h"

namespace ckpt::ctl {

inline constexpr const char* kDefaultAdminAddress = "127.0.0.1:7460";

struct AdminTarget {
  std::string address = kDefaultAdminAddress;
  std::string tls_ca;           // PEM: connect with TLS, trusting this CA
  std::string tls_cert;         // PEM client certificate (servers that require one)
  std::string tls_key;          // PEM key of tls_cert
  std::string tls_server_name;  // expected name in the server certificate, if not the host
  std::chrono::milliseconds timeout{10000};
  bool json = false;
};

// A channel to the target; errors name the file that could not be read.
Result<std::shared_ptr<grpc::Channel>> OpenAdminChannel(const AdminTarget& target);

// A client context whose deadline is `timeout` from now.
std::unique_ptr<grpc::ClientContext> ContextWithDeadline(std::chrono::milliseconds timeout);

// "what: CODE: message (admin ADDRESS)" for a failed call.
std::string DescribeRpcError(const std::string& what, const grpc::Status& status,
                             const AdminTarget& target);

}  // namespace ckpt::ctl
