// GrpcServer: how every gRPC endpoint of ckptd is served — a daemon's admin endpoint and
// ckpt-coordinator's (Coordinator + Admin on one port). One place for what they share:
//   * credentials by one rule (transport_security.h): TLS from PEM files, plaintext only on
//     loopback or a Unix socket unless explicitly allowed;
//   * grpc.health.v1.Health — NOT_SERVING from Start until SetServing(true), NOT_SERVING again
//     once SetServing(false) (draining) — and server reflection (grpcurl needs no protos);
//   * no SO_REUSEPORT: without that gRPC lets a second process start on the same port and
//     silently share it with the first;
//   * the address actually bound ("127.0.0.1:41234" for port 0; unchanged for unix:PATH).
//
// Thread safety: Start and Stop from one thread; SetServing from any.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "daemon/rpc/transport_security.h"

namespace ckpt {

class GrpcServer {
 public:
  struct Options {
    std::string what;     // "admin", "coordinator": for logs and errors
    std::string address;  // host:port or unix:PATH
    TlsFiles tls;
    bool allow_plaintext = false;
    ServerTlsOptions option_names;  // how the settings above were given, for errors
    // Probe idle peers every 2 s, so that a peer that vanished without a reset is noticed
    // (the coordinator's nodes).
    bool keepalive = false;
    int max_message_bytes = 0;  // 0: gRPC's default
  };

  // Binds and starts serving `services` (not owned; they outlive the server), health
  // NOT_SERVING. Fails naming the option when credentials cannot be built, and when the
  // address cannot be bound.
  static Result<std::unique_ptr<GrpcServer>> Start(Options options,
                                                   const std::vector<grpc::Service*>& services);
  ~GrpcServer();

  const std::string& bound_address() const { return bound_address_; }
  bool tls() const { return options_.tls.enabled(); }
  void SetServing(bool serving);
  // Ends every call within `grace` (streams are cancelled), then stops. Idempotent.
  void Stop(std::chrono::milliseconds grace);

 private:
  explicit GrpcServer(Options options) : options_(std::move(options)) {}

  Options options_;
  std::unique_ptr<grpc::Server> server_;
  std::string bound_address_;
};

}  // namespace ckpt
