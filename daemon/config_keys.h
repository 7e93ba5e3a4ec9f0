// The configuration keys ckptd and ckpt-coordinator share, declared once (name, help, parser)
// for both tables (daemon/config_table.h). Both processes write and prune the same storage
// root under the same commit protocol, and both serve a gRPC endpoint under the same TLS rule
// (daemon/rpc/grpc_server.h), so these keys mean the same thing in both and must not drift:
//
//   storage-root, keep, keep-every, admin-read-only, step-timeout, log-level, metrics (the
//   Prometheus /metrics endpoint, daemon/admin/metrics_endpoint.h; the defaults differ: ckptd
//   serves it on 127.0.0.1:7461 unless emptied, ckpt-coordinator only when asked)
//
//   a served gRPC endpoint: <address key>, <prefix>tls-cert, <prefix>tls-key,
//   <prefix>tls-client-ca, <prefix>allow-plaintext — the daemon's admin endpoint has the prefix
//   "admin-" (admin, admin-tls-cert, ...), the coordinator's none (listen, tls-cert, ...).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "daemon/config_table.h"

namespace ckpt::config_keys {

template <class Config>
Option<Config> StorageRoot(std::string Config::*member) {
  return {"storage-root",
          "directory checkpoints are written under (the PFS mount; with a coordinator, the one "
          "every node and the coordinator share)",
          Str(member)};
}

template <class Config>
Option<Config> Keep(uint32_t Config::*member) {
  return {"keep",
          "committed checkpoints kept per job, not counting milestones (keep-every) and pinned "
          "steps; the newest is always kept (0 = all)",
          Integer(member)};
}

template <class Config>
Option<Config> KeepEvery(uint32_t Config::*member) {
  return {"keep-every",
          "steps that are multiples of this are milestones, kept for good whatever keep says "
          "(0 = no milestones)",
          Integer(member)};
}

template <class Config>
Option<Config> AdminReadOnly(bool Config::*member) {
  return {"admin-read-only",
          "refuse the admin API's pin, unpin and delete (PERMISSION_DENIED); status, list, "
          "describe and watch still answer",
          Boolean(member)};
}

template <class Config>
Option<Config> StepTimeout(std::chrono::milliseconds Config::*member) {
  return {"step-timeout",
          "abort a step not persisted by every rank within this of its first report, e.g. 10m",
          Duration(member)};
}

template <class Config>
Option<Config> LogLevel(std::string Config::*member) {
  return {"log-level", "trace, debug, info, warn or error", Str(member)};
}

template <class Config>
Option<Config> Metrics(std::string Config::*member) {
  return {"metrics", "Prometheus endpoint host:port (empty = off)", Str(member)};
}

// The members of a Config that describe one served gRPC endpoint.
template <class Config>
struct EndpointMembers {
  std::string Config::*address;
  std::string Config::*tls_cert;
  std::string Config::*tls_key;
  std::string Config::*tls_client_ca;
  bool Config::*allow_plaintext;
};

// The address key of an endpoint ("admin", "listen"); `serves` says what it serves.
template <class Config>
Option<Config> EndpointAddress(const std::string& key, const std::string& serves,
                               const EndpointMembers<Config>& m) {
  return {key, "gRPC address serving " + serves + " (host:port or unix:PATH)", Str(m.address)};
}

// Its TLS keys, `prefix` before each ("admin-" → admin-tls-cert, ...).
template <class Config>
std::vector<Option<Config>> EndpointTls(const std::string& prefix, const std::string& serves,
                                        const std::string& clients,
                                        const EndpointMembers<Config>& m) {
  return {
      {prefix + "tls-cert", "PEM certificate chain: serve " + serves + " over TLS",
       Str(m.tls_cert)},
      {prefix + "tls-key", "PEM private key of " + prefix + "tls-cert", Str(m.tls_key)},
      {prefix + "tls-client-ca",
       "PEM CA: " + clients + " must present a certificate it signed (mutual TLS)",
       Str(m.tls_client_ca)},
      {prefix + "allow-plaintext",
       "true: serve " + serves + " unencrypted on a non-loopback address",
       Boolean(m.allow_plaintext)},
  };
}

}  // namespace ckpt::config_keys
