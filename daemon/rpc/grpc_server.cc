#include "daemon/rpc/grpc_server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>

#include "common/logging.h"

namespace ckpt {

Result<std::unique_ptr<GrpcServer>> GrpcServer::Start(Options options,
                                                      const std::vector<grpc::Service*>& services) {
  ASSIGN_OR_RETURN(auto credentials,
                   MakeServerCredentials(options.address, options.tls, options.allow_plaintext,
                                         options.option_names));
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  if (options.keepalive) {
    // A peer that stops answering (frozen, or cut off without a reset) is noticed within about
    // 3 s: a ping a second, 2 s for its answer. The coordinator's node streams rely on it
    // (proto/README.md §4.2: a node that no longer answers stops counting as a copy).
    builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 1000);
    builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 2000);
    builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
    builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 1000);
    builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  }
  if (options.max_message_bytes > 0) {
    builder.SetMaxReceiveMessageSize(options.max_message_bytes);
    builder.SetMaxSendMessageSize(options.max_message_bytes);
  }
  int port = 0;
  builder.AddListeningPort(options.address, credentials, &port);
  for (grpc::Service* service : services) builder.RegisterService(service);
  std::unique_ptr<GrpcServer> server(new GrpcServer(std::move(options)));
  const std::string& address = server->options_.address;
  const bool unix_socket = address.rfind("unix:", 0) == 0;
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || (!unix_socket && port == 0)) {
    server->server_.reset();
    return Unavailable(server->options_.what + ": cannot serve gRPC on " + address +
                       " (address in use, or not a valid host:port / unix:PATH)");
  }
  server->server_->GetHealthCheckService()->SetServingStatus(false);
  server->bound_address_ =
      unix_socket ? address : address.substr(0, address.rfind(':') + 1) + std::to_string(port);
  spdlog::info("{}: gRPC on {}{} (health NOT_SERVING until ready)", server->options_.what,
               server->bound_address_,
               !server->tls() ? " (plaintext)"
                              : (server->options_.tls.ca.empty() ? " (TLS)" : " (mutual TLS)"));
  return server;
}

GrpcServer::~GrpcServer() { Stop(std::chrono::milliseconds(0)); }

void GrpcServer::SetServing(bool serving) {
  if (server_ != nullptr) server_->GetHealthCheckService()->SetServingStatus(serving);
}

void GrpcServer::Stop(std::chrono::milliseconds grace) {
  if (server_ == nullptr) return;
  SetServing(false);
  server_->Shutdown(std::chrono::system_clock::now() + grace);
  server_->Wait();
  server_.reset();
}

}  // namespace ckpt
