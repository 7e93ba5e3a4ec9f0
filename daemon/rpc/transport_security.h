// Transport security of every gRPC endpoint (the coordinator and its link, the admin endpoint
// of either process): TLS credentials from PEM file paths, and one rule — plaintext only on
// loopback or a Unix socket, unless an operator explicitly allows it.
//
//   server: cert + key (required together); client_ca → clients must present a certificate
//           signed by it (mutual TLS).
//   client: ca → verify the coordinator's certificate (else the system roots); cert + key →
//           present a client certificate; server_name overrides the name checked in the
//           coordinator's certificate (default: the host part of the address).
#pragma once

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>

#include <memory>
#include <string>

#include "common/status.h"

namespace ckpt {

struct TlsFiles {
  std::string cert;         // PEM certificate chain of this side
  std::string key;          // PEM private key of this side
  std::string ca;           // PEM CA: server side verifies clients; client side verifies the server
  std::string server_name;  // client side only: name to expect in the server's certificate
  bool enabled() const { return !cert.empty() || !key.empty() || !ca.empty(); }
};

// The option names an endpoint's TLS settings are given under, for errors that name them: the
// coordinator's command-line flags by default, the daemon's admin-* config keys for its admin
// endpoint (AdminTlsOptions).
struct ServerTlsOptions {
  std::string listen = "--listen";
  std::string cert = "--tls-cert";
  std::string key = "--tls-key";
  std::string client_ca = "--tls-client-ca";
  std::string allow_plaintext = "--allow-plaintext";
};
ServerTlsOptions AdminTlsOptions();

// True for "localhost:P", "127.x.x.x:P", "[::1]:P", "unix:PATH".
bool IsLoopbackAddress(const std::string& address);

// Errors name the flag and file that is missing or unreadable, and refuse plaintext on a
// non-loopback address unless `allow_plaintext`.
Result<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const std::string& listen, const TlsFiles& tls, bool allow_plaintext,
    const ServerTlsOptions& names = {});
Result<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(const std::string& target,
                                                                         const TlsFiles& tls,
                                                                         bool allow_plaintext);

}  // namespace ckpt
