// ckpt-coordinator: the global coordinator of multi-node jobs (docs/design.md §6). Scans the
// storage root (commits every fully persisted step, removes the rest), then serves
// ckptd.v1.Coordinator until SIGTERM/SIGINT. See coordinator_core.h for the protocol.
// The same endpoint serves ckptd.v1.Admin (role "coordinator", coordinator_admin_provider.h),
// grpc.health.v1.Health and reflection, so `ckptctl --admin HOST:7470 status` works as against a
// daemon. Under systemd (NOTIFY_SOCKET) it sends READY=1 once serving and STOPPING=1 on a signal.
//
//   ckpt-coordinator --listen ADDR --storage-root DIR [--keep N] [--step-timeout 10m]
//                    [--lease 10s] [--tls-cert PEM --tls-key PEM [--tls-client-ca PEM]]
//                    [--allow-plaintext] [--log-level info]
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <csignal>
#include <iostream>
#include <random>

#include "common/file_system.h"
#include "common/logging.h"
#include "common/units.h"
#include "daemon/admin/admin_service.h"
#include "daemon/admin/systemd_notify.h"
#include "daemon/coordinator/coordinator_admin_provider.h"
#include "daemon/coordinator/coordinator_core.h"
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
  CLI::App app{"ckpt-coordinator: global commit of multi-node checkpoints for ckptd daemons"};
  std::string listen = "127.0.0.1:7470";
  std::string root;
  uint32_t keep = 0;
  std::string step_timeout = "10m";
  std::string lease = "10s";
  ckpt::TlsFiles tls;
  bool allow_plaintext = false;
  std::string log_level = "info";
  app.add_option("--listen", listen, "gRPC address to serve on (host:port or unix:PATH)");
  app.add_option("--storage-root", root, "the storage root every daemon writes under")->required();
  app.add_option("--keep", keep, "committed checkpoints kept per job (0 = all)");
  app.add_option("--step-timeout", step_timeout,
                 "abort a step not persisted by every rank within this of its first report");
  app.add_option("--lease", lease, "a node whose event stream stays closed this long is lost");
  app.add_option("--tls-cert", tls.cert, "PEM certificate chain (enables TLS)");
  app.add_option("--tls-key", tls.key, "PEM private key of --tls-cert");
  app.add_option("--tls-client-ca", tls.ca, "PEM CA; daemons must present a certificate it signed");
  app.add_flag("--allow-plaintext", allow_plaintext, "serve without TLS on a non-loopback address");
  app.add_option("--log-level", log_level, "trace, debug, info, warn or error");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  ckpt::InitLogging("ckpt-coordinator", log_level);
  auto timeout = ckpt::ParseDuration(step_timeout);
  auto lease_ms = ckpt::ParseDuration(lease);
  if (!timeout.ok() || !lease_ms.ok() || timeout->count() <= 0 || lease_ms->count() <= 0) {
    spdlog::error("--step-timeout '{}' / --lease '{}': not a positive duration", step_timeout,
                  lease);
    return 2;
  }
  ckpt::CoordinatorCore::Config config;
  config.storage_root = root;
  config.keep = keep;
  config.step_timeout = *timeout;
  config.lease = *lease_ms;
  config.writer = std::string("ckpt-coordinator ") + ckpt::kVersion;
  ckpt::CoordinatorAdminProvider::Sources admin_sources;
  admin_sources.fs = ckpt::PosixFileSystem();
  admin_sources.storage_root = root;
  admin_sources.version = ckpt::kVersion;
  admin_sources.config = {{"listen", listen},
                          {"storage-root", root},
                          {"keep", std::to_string(keep)},
                          {"step-timeout", step_timeout},
                          {"lease", lease},
                          {"tls", tls.enabled() ? (tls.ca.empty() ? "server" : "mutual") : "off"}};
  ckpt::CoordinatorAdminProvider admin(std::move(admin_sources));
  config.on_step_state = [&admin](const std::string& job, uint64_t step, ckptd::v1::StepState state,
                                  const std::string& reason) {
    admin.OnStepState(job, step, state, reason);
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
  ckpt::CoordinatorCore core(config, ckpt::PosixFileSystem());
  spdlog::info(
      "ckpt-coordinator {} starting: storage root {}, keep {}, step timeout {} ms, "
      "lease {} ms",
      ckpt::kVersion, root, keep, timeout->count(), lease_ms->count());
  auto recovered = core.Start();
  if (!recovered.ok()) {
    spdlog::error("recovery scan of {}: {}", root, recovered.status().ToString());
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
  ckpt::AdminService admin_service(&admin);
  ckpt::GrpcServer::Options endpoint;
  endpoint.what = "coordinator";
  endpoint.address = listen;
  endpoint.tls = tls;
  endpoint.allow_plaintext = allow_plaintext;
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
  ckpt::NotifySystemd("READY=1\nSTATUS=serving on " + listen);

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
