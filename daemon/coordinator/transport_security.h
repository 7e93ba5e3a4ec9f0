// Transport security of the coordinator link: TLS credentials from PEM file paths, and the rule
// that plaintext is used only on loopback unless an operator explicitly allows it.
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

// True for "localhost:P", "127.x.x.x:P", "[::1]:P", "unix:PATH".
bool IsLoopbackAddress(const std::string& address);

// Errors name the flag and file that is missing or unreadable, and refuse plaintext on a
// non-loopback address unless `allow_plaintext`.
Result<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(const std::string& listen,
                                                                       const TlsFiles& tls,
                                                                       bool allow_plaintext);
Result<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(const std::string& target,
                                                                         const TlsFiles& tls,
                                                                         bool allow_plaintext);

}  // namespace ckpt
