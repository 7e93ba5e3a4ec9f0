#include "daemon/rpc/transport_security.h"

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>

#include <fstream>
#include <sstream>

namespace ckpt {
namespace {

Result<std::string> ReadPem(const std::string& flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return ErrnoStatus(errno, flag + " " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string pem = ss.str();
  if (pem.find("-----BEGIN ") == std::string::npos) {
    return InvalidArgument(flag + " " + path + ": not a PEM file");
  }
  return pem;
}

std::string HostOf(const std::string& address) {
  std::string a = address;
  if (a.rfind("dns:///", 0) == 0) a = a.substr(7);
  if (a.rfind("ipv4:", 0) == 0) a = a.substr(5);
  if (a.rfind("ipv6:", 0) == 0) a = a.substr(5);
  if (!a.empty() && a[0] == '[') return a.substr(1, a.find(']') - 1);
  return a.substr(0, a.rfind(':'));
}

}  // namespace

ServerTlsOptions AdminTlsOptions() {
  return {"admin", "admin-tls-cert", "admin-tls-key", "admin-tls-client-ca",
          "admin-allow-plaintext"};
}

bool IsLoopbackAddress(const std::string& address) {
  if (address.rfind("unix:", 0) == 0) return true;
  const std::string host = HostOf(address);
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

Result<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const std::string& listen, const TlsFiles& tls, bool allow_plaintext,
    const ServerTlsOptions& names) {
  if (!tls.enabled()) {
    if (!IsLoopbackAddress(listen) && !allow_plaintext) {
      return FailedPrecondition(names.listen + " " + listen + " is not a loopback address: give " +
                                names.cert + " and " + names.key + ", or " + names.allow_plaintext +
                                " to accept unencrypted connections");
    }
    return grpc::InsecureServerCredentials();
  }
  if (tls.cert.empty() || tls.key.empty()) {
    return InvalidArgument((tls.cert.empty() && tls.key.empty() ? names.client_ca + " needs "
                                                                : std::string("TLS needs ")) +
                           "both " + names.cert + " and " + names.key);
  }
  grpc::SslServerCredentialsOptions options(
      tls.ca.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                     : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  ASSIGN_OR_RETURN(pair.cert_chain, ReadPem(names.cert, tls.cert));
  ASSIGN_OR_RETURN(pair.private_key, ReadPem(names.key, tls.key));
  options.pem_key_cert_pairs.push_back(std::move(pair));
  if (!tls.ca.empty()) {
    ASSIGN_OR_RETURN(options.pem_root_certs, ReadPem(names.client_ca, tls.ca));
  }
  return grpc::SslServerCredentials(options);
}

Result<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(const std::string& target,
                                                                         const TlsFiles& tls,
                                                                         bool allow_plaintext) {
  if (!tls.enabled()) {
    if (!IsLoopbackAddress(target) && !allow_plaintext) {
      return FailedPrecondition("--coordinator " + target +
                                " is not a loopback address: give --coordinator-ca (TLS), or "
                                "--coordinator-plaintext to connect unencrypted");
    }
    return grpc::InsecureChannelCredentials();
  }
  if (tls.cert.empty() != tls.key.empty()) {
    return InvalidArgument(
        "a client certificate needs both --coordinator-cert and --coordinator-key");
  }
  grpc::SslCredentialsOptions options;
  if (!tls.ca.empty()) {
    ASSIGN_OR_RETURN(options.pem_root_certs, ReadPem("--coordinator-ca", tls.ca));
  }
  if (!tls.cert.empty()) {
    ASSIGN_OR_RETURN(options.pem_cert_chain, ReadPem("--coordinator-cert", tls.cert));
    ASSIGN_OR_RETURN(options.pem_private_key, ReadPem("--coordinator-key", tls.key));
  }
  return grpc::SslCredentials(options);
}

}  // namespace ckpt
