// The coordinator's option table (daemon/config_table.h). Its keys keep the names, defaults and
// help ckpt-coordinator always had; those it shares with ckptd come from daemon/config_keys.h.
#include "daemon/coordinator/coordinator_config.h"

#include "daemon/config_keys.h"
#include "daemon/config_table.h"

namespace ckpt {
namespace {

const OptionTable<CoordinatorConfig>& Table() {
  using C = CoordinatorConfig;
  const config_keys::EndpointMembers<C> endpoint{&C::listen, &C::tls_cert, &C::tls_key,
                                                 &C::tls_client_ca, &C::allow_plaintext};
  const std::string serves = "the coordinator and admin APIs";
  Option<C> storage_root = config_keys::StorageRoot(&C::storage_root);
  storage_root.help += " (required)";
  static const OptionTable<C> table(
      {"ckpt-coordinator", "global commit of multi-node checkpoints for ckptd daemons",
       /*env_prefix=*/""},
      Concat<C>({
          {
              config_keys::EndpointAddress("listen", serves, endpoint),
              storage_root,
              config_keys::Keep(&C::keep),
              config_keys::KeepEvery(&C::keep_every),
              config_keys::StepTimeout(&C::step_timeout),
              {"lease", "a node whose event stream stays closed this long is lost, e.g. 10s",
               Duration(&C::lease)},
              {"holder-replan-delay",
               "the peer tier's holders are planned again this long after a node joins, changes "
               "or leaves (more changes meanwhile join the same plan), e.g. 100ms",
               Duration(&C::holder_replan_delay)},
              {"peer-job-ttl",
               "a job none of whose ranks is registered on any node for this long (its trainers "
               "ended) has its copies in other nodes' memory dropped and its memory-only steps "
               "no longer restorable; 0 keeps them until their holders restart, e.g. 30m",
               Duration(&C::peer_job_ttl)},
              config_keys::Metrics(&C::metrics),
          },
          config_keys::EndpointTls("", serves, "daemons", endpoint),
          {config_keys::AdminReadOnly(&C::admin_read_only), config_keys::LogLevel(&C::log_level)},
      }));
  return table;
}

Status Validate(const CoordinatorConfig& c) {
  if (c.storage_root.empty()) {
    return InvalidArgument("storage-root is required (--storage-root DIR or the config file)");
  }
  if (c.step_timeout.count() <= 0) return InvalidArgument("step-timeout must be positive");
  if (c.lease.count() <= 0) return InvalidArgument("lease must be positive");
  if (c.holder_replan_delay.count() < 0) {
    return InvalidArgument("holder-replan-delay must not be negative");
  }
  if (c.peer_job_ttl.count() < 0) return InvalidArgument("peer-job-ttl must not be negative");
  return Status::Ok();
}

}  // namespace

std::string CoordinatorConfig::ToYaml() const { return Table().ToYaml(*this); }

std::vector<std::pair<std::string, std::string>> CoordinatorConfig::Summary() const {
  return Table().Print(*this);
}

Result<std::optional<CoordinatorConfig>> LoadCoordinatorConfig(int argc, char** argv) {
  return Table().Load(argc, argv, Validate);
}

}  // namespace ckpt
