#include "daemon/admin/admin_server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>

#include <fstream>
#include <sstream>

#include "common/logging.h"

namespace ckpt {
namespace {

Result<std::string> ReadPem(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return ErrnoStatus(errno, std::string("admin TLS ") + what + " " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  if (ss.str().empty()) return InvalidArgument(std::string("admin TLS ") + what + " " + path + " is empty");
  return ss.str();
}

Result<std::shared_ptr<grpc::ServerCredentials>> Credentials(const AdminServer::Config& c) {
  if (c.tls_cert.empty() && c.tls_key.empty()) {
    if (!c.tls_client_ca.empty()) {
      return InvalidArgument("admin-tls-client-ca needs admin-tls-cert and admin-tls-key");
    }
    return grpc::InsecureServerCredentials();
  }
  if (c.tls_cert.empty() || c.tls_key.empty()) {
    return InvalidArgument("admin TLS needs both admin-tls-cert and admin-tls-key");
  }
  grpc::SslServerCredentialsOptions options(
      c.tls_client_ca.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                              : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  ASSIGN_OR_RETURN(pair.private_key, ReadPem(c.tls_key, "key"));
  ASSIGN_OR_RETURN(pair.cert_chain, ReadPem(c.tls_cert, "certificate"));
  options.pem_key_cert_pairs.push_back(std::move(pair));
  if (!c.tls_client_ca.empty()) {
    ASSIGN_OR_RETURN(options.pem_root_certs, ReadPem(c.tls_client_ca, "client CA"));
  }
  return grpc::SslServerCredentials(options);
}

}  // namespace

AdminServer::AdminServer(Config config, AdminProvider* provider)
    : config_(std::move(config)), service_(provider) {}

AdminServer::~AdminServer() { Stop(std::chrono::milliseconds(0)); }

Status AdminServer::Start() {
  ASSIGN_OR_RETURN(auto credentials, Credentials(config_));
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  // Without this gRPC sets SO_REUSEPORT, and a second daemon on the same port would start and
  // silently share it with the first.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  int port = 0;
  builder.AddListeningPort(config_.address, credentials, &port);
  builder.RegisterService(&service_);
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || (config_.address.rfind("unix:", 0) != 0 && port == 0)) {
    server_.reset();
    return Unavailable("admin: cannot serve gRPC on " + config_.address +
                       " (address in use, or not a valid host:port / unix:PATH)");
  }
  server_->GetHealthCheckService()->SetServingStatus(false);
  bound_address_ = config_.address;
  if (config_.address.rfind("unix:", 0) != 0) {
    bound_address_ = config_.address.substr(0, config_.address.rfind(':') + 1) + std::to_string(port);
  }
  spdlog::info("admin: gRPC on {}{} (health NOT_SERVING until ready)", bound_address_,
               config_.tls_cert.empty() ? "" : " with TLS");
  return Status::Ok();
}

void AdminServer::SetServing(bool serving) {
  serving_ = serving;
  if (server_ != nullptr) server_->GetHealthCheckService()->SetServingStatus(serving);
}

void AdminServer::Stop(std::chrono::milliseconds grace) {
  if (server_ == nullptr) return;
  SetServing(false);
  server_->Shutdown(std::chrono::system_clock::now() + grace);
  server_->Wait();
  server_.reset();
}

}  // namespace ckpt
