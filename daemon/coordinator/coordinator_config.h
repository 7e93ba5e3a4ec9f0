// ckpt-coordinator's configuration: flags > --config YAML file (keys are the flag names without
// dashes, e.g. `keep: 3`) > defaults in code. Read through the same option-table machinery as
// ckptd's (daemon/config_table.h), with the keys both share declared once
// (daemon/config_keys.h): storage-root, keep, step-timeout, log-level, metrics and the served
// endpoint's TLS keys. Unlike ckptd, no environment variables: the coordinator never read any.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace ckpt {

struct CoordinatorConfig {
  std::string listen = "127.0.0.1:7470";  // gRPC: Coordinator, Admin, health
  std::string storage_root;               // required: the root every daemon writes under
  uint32_t keep = 0;        // rolling committed steps kept per job (commit_engine.h); 0 = all
  uint32_t keep_every = 0;  // milestones: steps that are multiples of it are kept; 0 = none
  std::chrono::milliseconds step_timeout{std::chrono::minutes(10)};
  std::chrono::milliseconds lease{std::chrono::seconds(10)};  // a silent node is lost after it
  // The peer tier's holder plan waits this long after a node joins, changes or leaves, for more
  // changes to plan at once (holder_registry.h).
  std::chrono::milliseconds holder_replan_delay{100};
  // A job none of whose ranks is registered for this long has its copies in memory released
  // (coordinator_core.h); 0: never.
  std::chrono::milliseconds peer_job_ttl{std::chrono::minutes(30)};
  std::string metrics;        // Prometheus HTTP endpoint host:port; empty (the default): off
  std::string tls_cert;       // PEM chain; with tls_key: serve over TLS
  std::string tls_key;        //
  std::string tls_client_ca;  // PEM CA: daemons must present a certificate it signed
  bool allow_plaintext = false;
  bool admin_read_only = false;  // refuse the admin API's pin / unpin / delete
  std::string log_level = "info";
  bool print_config = false;

  // YAML of the effective configuration (what --print-config prints).
  std::string ToYaml() const;
  // Every key and its value, for the admin status page.
  std::vector<std::pair<std::string, std::string>> Summary() const;
};

// Parses argv (and the --config file). On --help, prints usage and returns nullopt; errors name
// the offending key and value.
Result<std::optional<CoordinatorConfig>> LoadCoordinatorConfig(int argc, char** argv);

}  // namespace ckpt
