#include "client/ckptctl/admin_channel.h"

#include <fstream>
#include <sstream>

namespace ckpt::ctl {
namespace {

Result<std::string> ReadFile(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return ErrnoStatus(errno, std::string(what) + " " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string CodeName(grpc::StatusCode code) {
  static const char* const kNames[] = {"OK",
                                       "CANCELLED",
                                       "UNKNOWN",
                                       "INVALID_ARGUMENT",
                                       "DEADLINE_EXCEEDED",
                                       "NOT_FOUND",
                                       "ALREADY_EXISTS",
                                       "PERMISSION_DENIED",
                                       "RESOURCE_EXHAUSTED",
                                       "FAILED_PRECONDITION",
                                       "ABORTED",
                                       "OUT_OF_RANGE",
                                       "UNIMPLEMENTED",
                                       "INTERNAL",
                                       "UNAVAILABLE",
                                       "DATA_LOSS",
                                       "UNAUTHENTICATED"};
  const auto i = static_cast<size_t>(code);
  return i < std::size(kNames) ? kNames[i] : "CODE_" + std::to_string(i);
}

}  // namespace

Result<std::shared_ptr<grpc::Channel>> OpenAdminChannel(const AdminTarget& t) {
  if (t.address.empty()) return InvalidArgument("--admin is empty");
  grpc::ChannelArguments args;
  std::shared_ptr<grpc::ChannelCredentials> creds;
  if (t.tls_ca.empty() && t.tls_cert.empty()) {
    creds = grpc::InsecureChannelCredentials();
  } else {
    grpc::SslCredentialsOptions o;
    if (!t.tls_ca.empty()) {
      ASSIGN_OR_RETURN(o.pem_root_certs, ReadFile(t.tls_ca, "--tls-ca"));
    }
    if (!t.tls_cert.empty() || !t.tls_key.empty()) {
      if (t.tls_cert.empty() || t.tls_key.empty()) {
        return InvalidArgument("--tls-cert and --tls-key must be given together");
      }
      ASSIGN_OR_RETURN(o.pem_cert_chain, ReadFile(t.tls_cert, "--tls-cert"));
      ASSIGN_OR_RETURN(o.pem_private_key, ReadFile(t.tls_key, "--tls-key"));
    }
    creds = grpc::SslCredentials(o);
    if (!t.tls_server_name.empty()) {
      args.SetSslTargetNameOverride(t.tls_server_name);
    }
  }
  return grpc::CreateCustomChannel(t.address, creds, args);
}

std::unique_ptr<grpc::ClientContext> ContextWithDeadline(std::chrono::milliseconds timeout) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + timeout);
  return ctx;
}

std::string DescribeRpcError(const std::string& what, const grpc::Status& status,
                             const AdminTarget& target) {
  return what + ": " + CodeName(status.error_code()) + ": " + status.error_message() + " (admin " +
         target.address + ")";
}

}  // namespace ckpt::ctl
