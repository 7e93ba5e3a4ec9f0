#include "daemon/admin/admin_server.h"

namespace ckpt {

AdminServer::AdminServer(Config config, AdminProvider* provider)
    : config_(std::move(config)), service_(provider, config_.read_only) {}

AdminServer::~AdminServer() { Stop(std::chrono::milliseconds(0)); }

Status AdminServer::Start() {
  GrpcServer::Options options;
  options.what = "admin";
  options.address = config_.address;
  options.tls = TlsFiles{config_.tls_cert, config_.tls_key, config_.tls_client_ca, {}};
  options.allow_plaintext = config_.allow_plaintext;
  options.option_names = AdminTlsOptions();
  ASSIGN_OR_RETURN(server_, GrpcServer::Start(std::move(options), {&service_}));
  return Status::Ok();
}

const std::string& AdminServer::bound_address() const {
  static const std::string kNone;
  return server_ != nullptr ? server_->bound_address() : kNone;
}

void AdminServer::SetServing(bool serving) {
  serving_ = serving;
  if (server_ != nullptr) server_->SetServing(serving);
}

void AdminServer::Stop(std::chrono::milliseconds grace) {
  if (server_ == nullptr) return;
  serving_ = false;
  server_->Stop(grace);
  server_.reset();
}

}  // namespace ckpt
