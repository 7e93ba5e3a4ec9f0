#include "daemon/daemon_config.h"

#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <CLI/CLI.hpp>
#include <charconv>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <map>
#include <sstream>

#include "common/names.h"
#include "common/units.h"

namespace ckpt {
namespace {

// A size that reads back exactly: "8GiB" when it is a whole number of a binary unit, else bytes.
std::string ExactSize(uint64_t bytes) {
  static constexpr std::pair<uint64_t, const char*> kUnits[] = {
      {1ull << 40, "TiB"}, {1ull << 30, "GiB"}, {1ull << 20, "MiB"}, {1ull << 10, "KiB"}};
  if (bytes == 0) return "0";
  for (const auto& [unit, name] : kUnits) {
    if (bytes % unit == 0) return std::to_string(bytes / unit) + name;
  }
  return std::to_string(bytes);
}

Result<uint64_t> ParseUint(const std::string& key, const std::string& v) {
  uint64_t out = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  if (ec != std::errc() || p != v.data() + v.size()) {
    return InvalidArgument(key + ": '" + v + "' is not a non-negative integer");
  }
  return out;
}

// How one key's value is read from a string (flag, environment, YAML) and printed back
// (--print-config) so that it reads back the same.
struct Field {
  std::function<Status(DaemonConfig&, const std::string&)> apply;
  std::function<std::string(const DaemonConfig&)> print;
};

// One user-facing key: its flag (--key), environment variable, YAML key, help and field. The
// table below is the only list of keys: parsing, --help and --print-config all read it.
struct Option {
  std::string key;
  std::string help;
  Field field;
};

Field Str(std::string DaemonConfig::*field) {
  return {[field](DaemonConfig& c, const std::string& v) {
            c.*field = v;
            return Status::Ok();
          },
          [field](const DaemonConfig& c) { return c.*field; }};
}

Field Bytes(const char* key, uint64_t DaemonConfig::*field) {
  return {[key, field](DaemonConfig& c, const std::string& v) -> Status {
            ASSIGN_OR_RETURN(c.*field, ParseByteSize(v), key);
            return Status::Ok();
          },
          [field](const DaemonConfig& c) { return ExactSize(c.*field); }};
}

Field Duration(const char* key, std::chrono::milliseconds DaemonConfig::*field) {
  return {[key, field](DaemonConfig& c, const std::string& v) -> Status {
            ASSIGN_OR_RETURN(c.*field, ParseDuration(v), key);
            return Status::Ok();
          },
          [field](const DaemonConfig& c) { return std::to_string((c.*field).count()) + "ms"; }};
}

template <class T>
Field Integer(const char* key, T DaemonConfig::*field) {
  return {[key, field](DaemonConfig& c, const std::string& v) -> Status {
            ASSIGN_OR_RETURN(uint64_t n, ParseUint(key, v));
            if (n > 1'000'000)
              return InvalidArgument(std::string(key) + ": " + v + " is too large");
            c.*field = static_cast<T>(n);
            return Status::Ok();
          },
          [field](const DaemonConfig& c) { return std::to_string(c.*field); }};
}

Field Boolean(const char* key, bool DaemonConfig::*field) {
  return {[key, field](DaemonConfig& c, const std::string& v) -> Status {
            if (v != "true" && v != "false") {
              return InvalidArgument(std::string(key) + ": '" + v + "' is not true or false");
            }
            c.*field = v == "true";
            return Status::Ok();
          },
          [field](const DaemonConfig& c) { return std::string(c.*field ? "true" : "false"); }};
}

// A comma-separated list; `item` checks and converts one element.
template <class T>
Field List(std::vector<T> DaemonConfig::*field, std::function<Result<T>(const std::string&)> item) {
  return {[field, item](DaemonConfig& c, const std::string& v) -> Status {
            (c.*field).clear();
            std::stringstream ss(v);
            std::string part;
            while (std::getline(ss, part, ',')) {
              if (part.empty()) continue;
              ASSIGN_OR_RETURN(T value, item(part));
              (c.*field).push_back(std::move(value));
            }
            return Status::Ok();
          },
          [field](const DaemonConfig& c) {
            std::string out;
            for (const auto& value : c.*field) {
              std::ostringstream one;
              one << value;
              out += (out.empty() ? "" : ",") + one.str();
            }
            return out;
          }};
}

std::vector<Option> Options() {
  return {
      {"socket", "Unix socket for trainers", Str(&DaemonConfig::socket)},
      {"socket-mode", "octal file mode of the socket", Str(&DaemonConfig::socket_mode)},
      {"admin", "gRPC admin address (host:port or unix:PATH)", Str(&DaemonConfig::admin)},
      {"storage-root", "directory checkpoints are written under (the PFS mount)",
       Str(&DaemonConfig::storage_root)},
      {"host-pool", "size of the pinned host staging pool, e.g. 8GiB",
       Bytes("host-pool", &DaemonConfig::host_pool)},
      {"node-id", "name of this node (default: hostname)", Str(&DaemonConfig::node_id)},
      {"coordinator", "address of ckpt-coordinator (absent: embedded coordinator)",
       Str(&DaemonConfig::coordinator)},
      {"keep", "committed checkpoints kept per job (0 = all)",
       Integer("keep", &DaemonConfig::keep)},
      {"slot-size", "pool slot / write size, e.g. 16MiB",
       Bytes("slot-size", &DaemonConfig::slot_size)},
      {"checksum-chunk", "bytes covered by one checksum, e.g. 1MiB",
       Bytes("checksum-chunk", &DaemonConfig::checksum_chunk)},
      {"capture-threads", "threads copying trainer memory into the pool",
       Integer("capture-threads", &DaemonConfig::capture_threads)},
      {"flush-threads", "threads writing the pool to storage (queue depth)",
       Integer("flush-threads", &DaemonConfig::flush_threads)},
      {"worker-nice",
       "nice value (0-19) of the capture, flush and storage threads, so the loop answering "
       "trainers preempts them",
       Integer("worker-nice", &DaemonConfig::worker_nice)},
      {"step-timeout", "abort a step some rank has not saved within this, e.g. 10m",
       Duration("step-timeout", &DaemonConfig::step_timeout)},
      {"shutdown-timeout", "on SIGTERM, wait this long for in-flight steps",
       Duration("shutdown-timeout", &DaemonConfig::shutdown_timeout)},
      {"storage-stall-timeout",
       "a write in flight this long means storage is stalled: saves that need pool space are "
       "skipped at once instead of waiting for it (0 = always wait), e.g. 5s",
       Duration("storage-stall-timeout", &DaemonConfig::storage_stall_timeout)},
      {"capture-throttle", "cap on capture copy rate in bytes/s, e.g. 2GiB (0 = none)",
       Bytes("capture-throttle", &DaemonConfig::capture_throttle)},
      {"allowed-uids", "comma-separated uids allowed to connect (empty = any)",
       List<uint32_t>(&DaemonConfig::allowed_uids,
                      [](const std::string& item) -> Result<uint32_t> {
                        ASSIGN_OR_RETURN(uint64_t uid, ParseUint("allowed-uids", item));
                        if (uid >= UINT32_MAX) {  // uid_t is 32 bits; (uid_t)-1 means "no uid"
                          return InvalidArgument("allowed-uids: " + item + " is not a valid uid");
                        }
                        return static_cast<uint32_t>(uid);
                      })},
      {"log-level", "trace, debug, info, warn or error", Str(&DaemonConfig::log_level)},
      // ---- global coordinator link ----
      {"coordinator-ca", "PEM CA of the coordinator's certificate (enables TLS)",
       Str(&DaemonConfig::coordinator_ca)},
      {"coordinator-cert", "PEM client certificate for the coordinator (mutual TLS)",
       Str(&DaemonConfig::coordinator_cert)},
      {"coordinator-key", "PEM private key of coordinator-cert",
       Str(&DaemonConfig::coordinator_key)},
      {"coordinator-server-name", "name to expect in the coordinator's certificate",
       Str(&DaemonConfig::coordinator_server_name)},
      {"coordinator-plaintext", "true: allow an unencrypted link to a non-loopback coordinator",
       Boolean("coordinator-plaintext", &DaemonConfig::coordinator_plaintext)},
      // ---- operations (daemon/admin) ----
      {"metrics", "Prometheus endpoint host:port (empty = off)", Str(&DaemonConfig::metrics)},
      {"socket-group", "group (name or gid) owning the trainer socket",
       Str(&DaemonConfig::socket_group)},
      {"admin-tls-cert", "PEM certificate: serve admin over TLS",
       Str(&DaemonConfig::admin_tls_cert)},
      {"admin-tls-key", "PEM private key of admin-tls-cert", Str(&DaemonConfig::admin_tls_key)},
      {"admin-tls-client-ca", "PEM CA: admin clients must present a certificate it signed",
       Str(&DaemonConfig::admin_tls_client_ca)},
      {"admin-allow-plaintext", "true: serve admin unencrypted on a non-loopback address",
       Boolean("admin-allow-plaintext", &DaemonConfig::admin_allow_plaintext)},
      {"shared-jobs", "comma-separated jobs whose checkpoints any job may load (e.g. a base model)",
       List<std::string>(&DaemonConfig::shared_jobs,
                         [](const std::string& job) -> Result<std::string> {
                           RETURN_IF_ERROR(ValidateJobName(job), "shared-jobs");
                           return job;
                         })},
  };
}

std::string EnvName(const std::string& key) {
  std::string out = "CKPTD_";
  for (char c : key) out += c == '-' ? '_' : static_cast<char>(std::toupper(c));
  return out;
}

Status Validate(DaemonConfig& c) {
  if (c.node_id.empty()) {
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    c.node_id = host;
    // Hostnames may contain characters node ids may not; keep the safe part.
    for (char& ch : c.node_id) {
      if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '-' && ch != '_' && ch != '.')
        ch = '_';
    }
    if (c.node_id.empty()) c.node_id = "node";
  }
  RETURN_IF_ERROR(ValidateNodeId(c.node_id), "node-id");
  if (c.storage_root.empty()) return InvalidArgument("storage-root is empty");
  if (c.checksum_chunk == 0 || c.checksum_chunk % 4096 != 0) {
    return InvalidArgument("checksum-chunk must be a positive multiple of 4096");
  }
  if (c.slot_size == 0 || c.slot_size % c.checksum_chunk != 0) {
    return InvalidArgument("slot-size must be a positive multiple of checksum-chunk");
  }
  if (c.host_pool < 2 * c.slot_size) {
    return InvalidArgument("host-pool (" + FormatBytes(c.host_pool) +
                           ") must hold at least two slots of " + FormatBytes(c.slot_size));
  }
  if (c.capture_threads < 1 || c.flush_threads < 1) {
    return InvalidArgument("capture-threads and flush-threads must be at least 1");
  }
  if (c.worker_nice < 0 || c.worker_nice > 19) {
    return InvalidArgument("worker-nice " + std::to_string(c.worker_nice) +
                           " is not between 0 and 19");
  }
  unsigned mode = 0;
  auto [p, ec] =
      std::from_chars(c.socket_mode.data(), c.socket_mode.data() + c.socket_mode.size(), mode, 8);
  if (ec != std::errc() || p != c.socket_mode.data() + c.socket_mode.size() || mode > 0777) {
    return InvalidArgument("socket-mode '" + c.socket_mode + "' is not an octal file mode");
  }
  if (c.admin_tls_cert.empty() != c.admin_tls_key.empty()) {
    return InvalidArgument("admin-tls-cert and admin-tls-key must be given together");
  }
  if (!c.admin_tls_client_ca.empty() && c.admin_tls_cert.empty()) {
    return InvalidArgument("admin-tls-client-ca needs admin-tls-cert and admin-tls-key");
  }
  return Status::Ok();
}

}  // namespace

std::string DaemonConfig::ToYaml() const {
  YAML::Emitter out;
  out << YAML::BeginMap;
  for (const Option& o : Options())
    out << YAML::Key << o.key << YAML::Value << o.field.print(*this);
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

Result<std::optional<DaemonConfig>> LoadDaemonConfig(int argc, char** argv) {
  const auto options = Options();
  CLI::App app{
      "ckptd: node checkpoint daemon (trainers hand it tensor handles; it captures, "
      "persists and commits checkpoints in the background)"};
  std::map<std::string, std::string> from_flags;
  for (const auto& o : options) {
    app.add_option_function<std::string>(
           "--" + o.key, [&from_flags, key = o.key](const std::string& v) { from_flags[key] = v; },
           o.help + " [env " + EnvName(o.key) + "]")
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // a repeated flag: last wins
  }
  std::string config_file;
  bool print_config = false;
  app.add_option("--config", config_file, "YAML file with any of the keys above");
  app.add_flag("--print-config", print_config, "print the effective configuration and exit");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return std::optional<DaemonConfig>();
  } catch (const CLI::ParseError& e) {
    return InvalidArgument(e.what());
  }

  std::map<std::string, std::string> values;
  if (!config_file.empty()) {
    try {
      YAML::Node root = YAML::LoadFile(config_file);
      if (!root.IsMap() && !root.IsNull()) {
        return InvalidArgument("config file '" + config_file + "' is not a YAML mapping");
      }
      for (const auto& kv : root) {
        const std::string key = kv.first.as<std::string>();
        bool known = false;
        for (const auto& o : options) known |= o.key == key;
        if (!known) {
          return InvalidArgument("config file '" + config_file + "': unknown key '" + key + "'");
        }
        values[key] = kv.second.IsNull() ? "" : kv.second.as<std::string>();
      }
    } catch (const YAML::Exception& e) {
      return InvalidArgument("config file '" + config_file + "': " + e.what());
    }
  }
  for (const auto& o : options) {
    if (const char* env = std::getenv(EnvName(o.key).c_str())) values[o.key] = env;
  }
  for (auto& [k, v] : from_flags) values[k] = v;

  DaemonConfig config;
  for (const auto& o : options) {
    auto it = values.find(o.key);
    if (it != values.end()) RETURN_IF_ERROR(o.field.apply(config, it->second));
  }
  config.print_config = print_config;
  RETURN_IF_ERROR(Validate(config));
  return std::optional<DaemonConfig>(std::move(config));
}

}  // namespace ckpt
