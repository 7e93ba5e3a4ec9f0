// The daemon's option table (daemon/config_table.h): every key ckptd reads, its help, and how it
// is parsed and printed. Flags, CKPTD_* variables, the YAML file, --help and --print-config all
// come from this one list; keys ckpt-coordinator shares are declared in daemon/config_keys.h.
// After parsing, Validate checks what no single key can: sizes that must divide each other,
// TLS files that come in pairs, the node id's default.
#include "daemon/daemon_config.h"

#include <unistd.h>

#include <cctype>
#include <charconv>

#include "common/names.h"
#include "common/units.h"
#include "daemon/config_keys.h"
#include "daemon/config_table.h"

namespace ckpt {
namespace {

const OptionTable<DaemonConfig>& Table() {
  using C = DaemonConfig;
  const config_keys::EndpointMembers<C> admin{&C::admin, &C::admin_tls_cert, &C::admin_tls_key,
                                              &C::admin_tls_client_ca, &C::admin_allow_plaintext};
  const std::string admin_serves = "the admin API";
  static const OptionTable<C> table(
      {"ckptd",
       "node checkpoint daemon (trainers hand it tensor handles; it captures, persists and "
       "commits checkpoints in the background)",
       "CKPTD_"},
      Concat<C>({
          {
              {"socket", "Unix socket for trainers", Str(&C::socket)},
              {"socket-mode", "octal file mode of the socket", Str(&C::socket_mode)},
              config_keys::EndpointAddress("admin", admin_serves, admin),
              config_keys::StorageRoot(&C::storage_root),
              {"host-pool", "size of the pinned host staging pool, e.g. 8GiB",
               Bytes(&C::host_pool)},
              {"node-id", "name of this node (default: hostname)", Str(&C::node_id)},
              {"coordinator", "address of ckpt-coordinator (absent: embedded coordinator)",
               Str(&C::coordinator)},
              config_keys::Keep(&C::keep),
              config_keys::KeepEvery(&C::keep_every),
              {"slot-size", "pool slot / write size, e.g. 16MiB", Bytes(&C::slot_size)},
              {"checksum-chunk", "bytes covered by one checksum, e.g. 1MiB",
               Bytes(&C::checksum_chunk)},
              {"capture-threads", "threads copying trainer memory into the pool",
               Integer(&C::capture_threads)},
              {"flush-threads", "threads writing the pool to storage (queue depth)",
               Integer(&C::flush_threads)},
              {"worker-nice",
               "nice value (0-19) of the capture, flush and storage threads, so the loop "
               "answering trainers preempts them",
               Integer(&C::worker_nice)},
              config_keys::StepTimeout(&C::step_timeout),
              {"shutdown-timeout", "on SIGTERM, wait this long for in-flight steps",
               Duration(&C::shutdown_timeout)},
              {"storage-stall-timeout",
               "a write in flight this long means storage is stalled: saves that need pool space "
               "are skipped at once instead of waiting for it (0 = always wait), e.g. 5s",
               Duration(&C::storage_stall_timeout)},
              {"capture-throttle", "cap on capture copy rate in bytes/s, e.g. 2GiB (0 = none)",
               Bytes(&C::capture_throttle)},
              {"allowed-uids", "comma-separated uids allowed to connect (empty = any)",
               List<C, uint32_t>(&C::allowed_uids,
                                 [](const std::string& item) -> Result<uint32_t> {
                                   ASSIGN_OR_RETURN(uint64_t uid, ParseUint(item));
                                   // uid_t is 32 bits; (uid_t)-1 means "no uid"
                                   if (uid >= UINT32_MAX) {
                                     return InvalidArgument(item + " is not a valid uid");
                                   }
                                   return static_cast<uint32_t>(uid);
                                 })},
              config_keys::LogLevel(&C::log_level),
              // ---- global coordinator link ----
              {"coordinator-ca", "PEM CA of the coordinator's certificate (enables TLS)",
               Str(&C::coordinator_ca)},
              {"coordinator-cert", "PEM client certificate for the coordinator (mutual TLS)",
               Str(&C::coordinator_cert)},
              {"coordinator-key", "PEM private key of coordinator-cert", Str(&C::coordinator_key)},
              {"coordinator-server-name", "name to expect in the coordinator's certificate",
               Str(&C::coordinator_server_name)},
              {"coordinator-plaintext",
               "true: allow an unencrypted link to a non-loopback coordinator",
               Boolean(&C::coordinator_plaintext)},
              // ---- operations (daemon/admin) ----
              config_keys::Metrics(&C::metrics),
              {"socket-group", "group (name or gid) owning the trainer socket",
               Str(&C::socket_group)},
          },
          config_keys::EndpointTls("admin-", admin_serves, "admin clients", admin),
          {
              config_keys::AdminReadOnly(&C::admin_read_only),
              {"shared-jobs",
               "comma-separated jobs whose checkpoints any job may load (e.g. a base model)",
               List<C, std::string>(&C::shared_jobs,
                                    [](const std::string& job) -> Result<std::string> {
                                      RETURN_IF_ERROR(ValidateJobName(job));
                                      return job;
                                    })},
              // ---- daemon-to-daemon data plane (daemon/peer/) ----
              {"peer-listen",
               "host:port of the daemon-to-daemon data plane (plain TCP, for the cluster "
               "network; port 0 picks one, logged and shown as peer-bound; empty = off)",
               Str(&C::peer_listen)},
              {"peer-pool",
               "memory for regions other nodes hand this one to hold, e.g. 8GiB (full: further "
               "ones are refused, nothing is evicted; 0 = hold none)",
               Bytes(&C::peer_pool)},
              {"peer-bandwidth", "cap on bytes/s the data plane sends, e.g. 1GiB (0 = none)",
               Bytes(&C::peer_bandwidth)},
              {"peer-timeout",
               "a request to another daemon (a chunk of a load's fetch) not answered within this "
               "fails, and the load fetches those bytes from another holder of them or reads "
               "them from storage, e.g. 10s",
               Duration(&C::peer_timeout)},
              {"replicas",
               "copies of each captured step in other nodes' memory (the peer-memory tier; "
               "holders are planned by the coordinator among daemons with peer-listen and a "
               "peer-pool), up to 16; auto = 1 with a coordinator, 0 without",
               Field<C>{[](C& c, const std::string& v) -> Status {
                          if (v == "auto") {
                            c.replicas.reset();
                            return Status::Ok();
                          }
                          ASSIGN_OR_RETURN(uint64_t n, ParseSmallCount(v));
                          if (n > 16) return InvalidArgument("'" + v + "' is over 16");
                          c.replicas = static_cast<uint32_t>(n);
                          return Status::Ok();
                        },
                        [](const C& c) {
                          return c.replicas ? std::to_string(*c.replicas) : std::string("auto");
                        }}},
              {"failure-domain",
               "label of what fails together with this node (a rack, a switch): copies go "
               "outside it where possible; empty = a domain of its own",
               Str(&C::failure_domain)},
          },
      }));
  return table;
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
  if (c.failure_domain.size() > 253) return InvalidArgument("failure-domain is over 253 bytes");
  if (!c.peer_listen.empty() && c.peer_listen.rfind(':') == std::string::npos) {
    return InvalidArgument("peer-listen '" + c.peer_listen + "' is not host:port");
  }
  return Status::Ok();
}

}  // namespace

std::string DaemonConfig::ToYaml() const { return Table().ToYaml(*this); }

std::vector<std::pair<std::string, std::string>> DaemonConfig::Summary() const {
  return Table().Print(*this);
}

Result<std::optional<DaemonConfig>> LoadDaemonConfig(int argc, char** argv) {
  return Table().Load(argc, argv, Validate);
}

}  // namespace ckpt
