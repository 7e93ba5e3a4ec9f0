// ckpt-coordinator: the global coordinator of multi-node jobs (docs/design.md §6). Scans the
// storage root (commits every fully persisted step, removes the rest), then serves
// ckptd.v1.Coordinator until SIGTERM/SIGINT. See coordinator_core.h for the protocol.
// The same endpoint serves ckptd.v1.Admin (role "coordinator", coordinator_admin_provider.h),
// grpc.health.v1.Health and reflection, so `ckptctl --admin HOST:7470 status` works as against a
// daemon. Under systemd (NOTIFY_SOCKET) it sends READY=1 once serving and STOPPING=1 on a signal.
// With --metrics HOST:PORT it serves Prometheus text on /metrics (coordinator_metrics.h), bound
// before the recovery scan so a taken port fails the start at once.
//
//   ckpt-coordinator --listen ADDR --storage-root DIR [--keep N] [--keep-every M]
//                    [--step-timeout 10m] [--lease 10s] [--holder-replan-delay 100ms]
//                    [--peer-job-ttl 30m]
//                    [--tls-cert PEM --tls-key PEM [--tls-client-ca PEM]] [--allow-plaintext]
//                    [--admin-read-only] [--metrics HOST:PORT] [--log-level info]
//                    [--config FILE] [--print-config]
// Every flag is also a key of the --config YAML file (coordinator_config.h).
#include <unistd.h>

#include <csignal>
#include <iostream>
#include <random>

#include "common/file_system.h"
#include "common/logging.h"
#include "daemon/admin/admin_service.h"
#include "daemon/admin/systemd_notify.h"
#include "daemon/coordinator/coordinator_admin_provider.h"
#include "daemon/coordinator/coordinator_config.h"
#include "daemon/coordinator/coordinator_core.h"
#include "daemon/coordinator/coordinator_metrics.h"
#include "daemon/rpc/coordinator_service.h"
#include "daemon/rpc/grpc_server.h"
#include "daemon/version.h"

namespace {

std::string RandomHex() {
  std::random_device rd;
  std::mt19937_64 gen((static_cast<uint64_t>(rd()) << 32) ^ rd() ^
                      static_cast<uint64_t>(::getpid()));
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(gen()));
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  auto loaded = ckpt::LoadCoordinatorConfig(argc, argv);
  if (!loaded.ok()) {
    std::cerr << "ckpt-coordinator: " << loaded.status().message() << "\n";
    return 2;
  }
  if (!loaded->has_value()) return 0;  // --help
  const ckpt::CoordinatorConfig& flags = **loaded;
  if (flags.print_config) {
    std::cout << flags.ToYaml();
    return 0;
  }
  ckpt::InitLogging("ckpt-coordinator", flags.log_level);
  ckpt::TlsFiles tls;
  tls.cert = flags.tls_cert;
  tls.key = flags.tls_key;
  tls.ca = flags.tls_client_ca;
  ckpt::CoordinatorCore::Config config;
  config.storage_root = flags.storage_root;
  config.keep = flags.keep;
  config.step_timeout = flags.step_timeout;
  config.lease = flags.lease;
  config.holder_replan_delay = flags.holder_replan_delay;
  config.peer_job_ttl = flags.peer_job_ttl;
  config.writer = std::string("ckpt-coordinator ") + ckpt::kVersion;
  ckpt::CoordinatorMetrics metrics(ckpt::kVersion);
  if (!flags.metrics.empty()) {
    if (ckpt::Status st = metrics.Serve(flags.metrics); !st.ok()) {
      spdlog::error("{}", st.ToString());
      return 1;
    }
  }
  metrics.Hook(config);
  // The core's commit engine, built here so that it carries keep-every (the core builds its own
  // from `config` otherwise, which knows only keep) and the admin provider can pin and delete
  // through it. Its commit points reach config.on_commit_point (set below) when one is set.
  ckpt::CommitEngine::Config commit_config;
  commit_config.storage_root = config.storage_root;
  commit_config.keep = flags.keep;
  commit_config.keep_every = flags.keep_every;
  commit_config.writer = config.writer;
  commit_config.on_point = [&config](std::string_view point) {
    if (config.on_commit_point) config.on_commit_point(point);
  };
  ckpt::CommitEngine commit(std::move(commit_config), ckpt::PosixFileSystem());
  ckpt::CoordinatorAdminProvider::Sources admin_sources;
  admin_sources.commit = &commit;
  admin_sources.fs = ckpt::PosixFileSystem();
  admin_sources.storage_root = flags.storage_root;
  admin_sources.version = ckpt::kVersion;
  admin_sources.config = flags.Summary();
  admin_sources.config.emplace_back("tls",
                                    tls.enabled() ? (tls.ca.empty() ? "server" : "mutual") : "off");
  if (!flags.metrics.empty())
    admin_sources.config.emplace_back("metrics-bound", metrics.bound_address());
  ckpt::CoordinatorAdminProvider admin(std::move(admin_sources));
  config.on_step_state = [&admin, &metrics](const std::string& job, uint64_t step,
                                            ckptd::v1::StepState state, const std::string& reason) {
    admin.OnStepState(job, step, state, reason);
    metrics.OnStepState(job, step, state);
  };
  // CKPT_COORDINATOR_CRASH_AT=<point>[:<n>] kills this process (SIGKILL) at that point of its
  // n-th commit (default 1st): how the crash tests stop it mid-commit. Never set in production.
  if (const char* crash = std::getenv("CKPT_COORDINATOR_CRASH_AT"); crash && *crash) {
    std::string spec = crash;
    const auto colon = spec.find(':');
    const std::string point = spec.substr(0, colon);
    const int nth = colon == std::string::npos ? 1 : std::atoi(spec.c_str() + colon + 1);
    spdlog::warn("CKPT_COORDINATOR_CRASH_AT={}: will kill itself at '{}' of commit {}", spec, point,
                 nth);
    config.on_commit_point = [point, nth, seen = std::make_shared<int>(0)](std::string_view p) {
      if (p == "before-manifest") ++*seen;
      if (p == point && *seen == nth) {
        spdlog::warn("crash point '{}' reached: killing the process", point);
        spdlog::default_logger()->flush();
        ::raise(SIGKILL);
      }
    };
  }
  ckpt::CoordinatorCore core(config, ckpt::PosixFileSystem(), &commit);
  const auto metrics_reads_core = metrics.Attach(&core);  // detached before `core` goes
  spdlog::info(
      "ckpt-coordinator {} starting: storage root {}, keep {}, keep-every {}, step timeout {} ms, "
      "lease {} ms",
      ckpt::kVersion, flags.storage_root, flags.keep, flags.keep_every, flags.step_timeout.count(),
      flags.lease.count());
  auto recovered = core.Start();
  if (!recovered.ok()) {
    spdlog::error("recovery scan of {}: {}", flags.storage_root, recovered.status().ToString());
    return 1;
  }
  for (const auto& line : *recovered) spdlog::warn("recovery: {}", line);

  // Block the stop signals before gRPC starts its threads, so only sigwait below sees them.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);

  admin.Start(&core);
  ckpt::CoordinatorService service(&core, RandomHex());
  ckpt::AdminService admin_service(&admin, flags.admin_read_only);
  ckpt::GrpcServer::Options endpoint;
  endpoint.what = "coordinator";
  endpoint.address = flags.listen;
  endpoint.tls = tls;
  endpoint.allow_plaintext = flags.allow_plaintext;
  endpoint.keepalive = true;  // notice a node that vanished even when no reset arrives
  endpoint.max_message_bytes = 1 << 30;
  auto server = ckpt::GrpcServer::Start(std::move(endpoint), {&service, &admin_service});
  if (!server.ok()) {
    spdlog::error("{}", server.status().ToString());
    return 2;
  }
  admin.SetServing(true);
  (*server)->SetServing(true);
  spdlog::info("ready: serving ckptd.v1.Coordinator and ckptd.v1.Admin on {}",
               (*server)->bound_address());
  ckpt::NotifySystemd("READY=1\nSTATUS=serving on " + flags.listen);

  int signo = 0;
  sigwait(&stop, &signo);
  spdlog::info("signal {}: stopping", signo);
  ckpt::NotifySystemd("STOPPING=1\nSTATUS=stopping");
  admin.SetServing(false);
  (*server)->SetServing(false);
  admin.Close();  // ends watch streams now instead of at the shutdown deadline
  (*server)->Stop(std::chrono::seconds(5));
  core.Stop();
  spdlog::info("stopped");
  return 0;
}
