// The daemon's configuration, assembled in one place: flags > environment (CKPTD_<KEY>, e.g.
// CKPTD_HOST_POOL) > YAML file (--config; keys are the flag names without dashes, e.g.
// `host-pool: 8GiB`) > defaults in code. Each component keeps its own small Config; this file
// maps the user-facing keys onto them and validates everything before anything starts. The keys
// are one table (daemon_config.cc, on the machinery of daemon/config_table.h) that parsing,
// --help and --print-config all read.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace ckpt {

struct DaemonConfig {
  std::string socket = "/run/ckptd/ckptd.sock";
  std::string socket_mode = "0660";
  std::string admin = "127.0.0.1:7460";
  std::string storage_root = "/var/lib/ckptd";
  uint64_t host_pool = 1ull << 30;
  std::string node_id;      // default: hostname
  std::string coordinator;  // empty: embedded
  uint32_t keep = 0;        // rolling committed steps kept per job (commit_engine.h); 0 = all
  uint32_t keep_every = 0;  // milestones: steps that are multiples of it are kept; 0 = none
  uint64_t slot_size = 16ull << 20;
  uint64_t checksum_chunk = 1ull << 20;
  int capture_threads = 2;
  int flush_threads = 8;
  int worker_nice = 10;  // capture, flush and storage threads (daemon/thread_priority.h)
  std::chrono::milliseconds step_timeout{std::chrono::minutes(10)};
  std::chrono::milliseconds shutdown_timeout{std::chrono::minutes(5)};
  // A storage call in flight this long = storage stalled: saves that need pool space are
  // skipped at once instead of waiting (0 = always wait for space).
  std::chrono::milliseconds storage_stall_timeout{std::chrono::seconds(5)};
  uint64_t capture_throttle = 0;  // bytes/s, 0 = unthrottled
  std::vector<uint32_t> allowed_uids;
  std::string log_level = "info";
  bool print_config = false;

  // ---- global coordinator link (daemon/rpc/coordinator_link.h) ----
  std::string coordinator_ca;           // PEM CA that signed the coordinator's certificate
  std::string coordinator_cert;         // PEM client certificate (mutual TLS)
  std::string coordinator_key;          // its private key
  std::string coordinator_server_name;  // name expected in the coordinator's certificate
  bool coordinator_plaintext = false;   // allow plaintext to a non-loopback coordinator
  // ---- operations: metrics, socket access, admin TLS (daemon/admin) ----
  std::string metrics = "127.0.0.1:7461";  // Prometheus HTTP endpoint; empty: off
  std::string socket_group;                // group name or gid owning the socket; empty: ours
  std::string admin_tls_cert;              // PEM; with admin_tls_key: admin over TLS
  std::string admin_tls_key;
  std::string admin_tls_client_ca;       // PEM; require client certificates signed by it
  bool admin_allow_plaintext = false;    // admin without TLS off loopback
  bool admin_read_only = false;          // refuse the admin API's pin / unpin / delete
  std::vector<std::string> shared_jobs;  // any session may load these jobs' checkpoints
  // ---- daemon-to-daemon data plane (daemon/peer/) ----
  std::string peer_listen;      // host:port of the peer server; empty: off
  uint64_t peer_pool = 0;       // bytes this node holds for other nodes (PUT); 0: none
  uint64_t peer_bandwidth = 0;  // bytes/s the data plane may send; 0: no cap
  std::chrono::milliseconds peer_timeout{std::chrono::seconds(10)};  // per request to a peer
  // The peer-memory tier: copies of each captured rank in other nodes' memory (unset, "auto":
  // 1 with a coordinator, 0 without), and the label of this node's failure domain (empty: its
  // own).
  std::optional<uint32_t> replicas;
  std::string failure_domain;
  uint32_t EffectiveReplicas() const { return replicas ? *replicas : coordinator.empty() ? 0 : 1; }

  // YAML of the effective configuration (what --print-config prints).
  std::string ToYaml() const;
  // Every key and its value as --print-config prints them, for the admin status page.
  std::vector<std::pair<std::string, std::string>> Summary() const;
};

// Parses argv (and the environment and --config file). On --help, prints usage and returns
// nullopt; errors name the offending key and value.
Result<std::optional<DaemonConfig>> LoadDaemonConfig(int argc, char** argv);

}  // namespace ckpt
