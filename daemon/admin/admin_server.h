// AdminServer: the gRPC endpoint of a daemon or coordinator — ckptd.v1.Admin (over an
// AdminProvider), grpc.health.v1.Health and server reflection (grpcurl works without protos).
//
// Health: NOT_SERVING from Start until SetServing(true) (the daemon calls it once its pool is
// pinned and its trainer socket bound), SERVING after, NOT_SERVING again once SetServing(false)
// (draining). gRPC's health service starts out SERVING; Start flips it to NOT_SERVING before
// returning, so only a probe racing the first microseconds could see SERVING early.
//
// Address: "host:port" (TCP; port 0 picks one, see bound_address) or "unix:PATH". TLS when
// cert and key are given (PEM files); with a client CA, clients must present a certificate
// signed by it. Plaintext only on loopback or a Unix socket unless allow_plaintext — the rule
// of every endpoint (daemon/rpc/grpc_server.h serves it). Thread safety: Start/Stop from one
// thread; SetServing from any.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "common/status.h"
#include "daemon/admin/admin_provider.h"
#include "daemon/admin/admin_service.h"
#include "daemon/rpc/grpc_server.h"

namespace ckpt {

class AdminServer {
 public:
  struct Config {
    std::string address = "127.0.0.1:7460";
    std::string tls_cert;          // PEM file; empty: plaintext
    std::string tls_key;           // PEM file
    std::string tls_client_ca;     // PEM file; non-empty: require client certificates
    bool allow_plaintext = false;  // plaintext off loopback (admin-allow-plaintext)
    bool read_only = false;        // refuse pin / unpin / delete (admin-read-only)
  };

  AdminServer(Config config, AdminProvider* provider);
  ~AdminServer();

  // Binds and starts serving (health NOT_SERVING). Fails when the address cannot be bound or
  // the TLS files cannot be read.
  Status Start();
  void SetServing(bool serving);
  bool serving() const { return serving_; }
  // The address actually bound ("127.0.0.1:41234" for port 0; unchanged for unix:).
  const std::string& bound_address() const;
  // Ends every call (watch streams are cancelled) within `grace`, then stops.
  void Stop(std::chrono::milliseconds grace = std::chrono::seconds(2));

 private:
  Config config_;
  AdminService service_;
  std::unique_ptr<GrpcServer> server_;
  std::atomic<bool> serving_{false};
};

}  // namespace ckpt
