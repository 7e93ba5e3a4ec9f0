// ckptd: the node checkpoint daemon. Builds its components in dependency order, serves until
// SIGTERM/SIGINT, then drains: stops accepting, lets in-flight steps persist and commit within
// --shutdown-timeout, stops components in reverse order, exits 0.
#include <sys/resource.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <iostream>

#include <sstream>

#include "common/fault_file_system.h"
#include "common/file_system.h"
#include "common/logging.h"
#include "common/units.h"
#include "daemon/capture_engine.h"
#include "daemon/coordinator/commit_engine.h"
#include "daemon/daemon_config.h"
#include "daemon/flush_engine.h"
#include "daemon/host_pool.h"
#include "daemon/hot_cache.h"
#include "daemon/load_service.h"
#include "daemon/local_server.h"
#include "daemon/node_state.h"
#include "daemon/systemd_notify.h"
#include "daemon/task_pool.h"
#include "daemon/version.h"

namespace ckpt {
namespace {

// CKPTD_FAULT_INJECTION="enospc-after=64MiB,eio-write=3,eio-sync,short-writes,path=rank-00001"
// (all keys in common/fault_file_system.h: stalled writes, a control file read while running)
// wraps the storage in the fault-injecting filesystem: how the failure tests make a real daemon
// meet a full or failing PFS. Never set in production; the daemon logs loudly when it is.
Result<std::unique_ptr<FaultInjectingFileSystem>> FaultsFromEnv() {
  const char* spec = std::getenv("CKPTD_FAULT_INJECTION");
  if (spec == nullptr || *spec == '\0') return std::unique_ptr<FaultInjectingFileSystem>();
  auto faults = std::make_unique<FaultInjectingFileSystem>(PosixFileSystem());
  RETURN_IF_ERROR(faults->ApplySpec(spec), "CKPTD_FAULT_INJECTION");
  spdlog::warn("CKPTD_FAULT_INJECTION='{}': storage faults are being injected", spec);
  return faults;
}

void RaiseFileLimit() {
  rlimit lim;
  if (::getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = lim.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &lim);
  }
}

int RunDaemon(const DaemonConfig& config) {
  spdlog::info("ckptd {} starting: node '{}', storage root {}, host pool {}", kVersion,
               config.node_id, config.storage_root, FormatBytes(config.host_pool));
  if (!config.coordinator.empty()) {
    spdlog::error("--coordinator {}: this version of ckptd runs the embedded coordinator only; "
                  "omit --coordinator",
                  config.coordinator);
    return 2;
  }
  if (!config.admin.empty()) {
    spdlog::warn("--admin {}: the gRPC admin endpoint is not served by this version of ckptd",
                 config.admin);
  }
  RaiseFileLimit();
  auto faults = FaultsFromEnv();
  if (!faults.ok()) {
    spdlog::error("{}", faults.status().ToString());
    return 2;
  }
  FileSystem* fs = *faults ? static_cast<FileSystem*>(faults->get()) : PosixFileSystem();
  if (Status st = fs->CreateDirs(config.storage_root); !st.ok()) {
    spdlog::error("storage root: {}", st.ToString());
    return 1;
  }

  CommitEngine commit({config.storage_root, config.keep, std::string("ckptd ") + kVersion}, fs);
  // Single node, embedded coordinator: this daemon is the only writer of the root, so whatever
  // has no MANIFEST is a leftover of a crash.
  auto removed = commit.RemoveUncommitted();
  if (!removed.ok()) {
    spdlog::error("recovery scan of {}: {}", config.storage_root, removed.status().ToString());
    return 1;
  }
  for (const auto& path : *removed) spdlog::warn("recovery: removed uncommitted {}", path);

  auto pool = HostPool::Create({config.host_pool, config.slot_size, true});
  if (!pool.ok()) {
    spdlog::error("host pool: {}", pool.status().ToString());
    return 1;
  }
  spdlog::info("host pool: {} in {} slots of {} ({})", FormatBytes((*pool)->size_bytes()),
               (*pool)->slot_count(), FormatBytes(config.slot_size),
               (*pool)->locked() ? "pinned" : "not pinned");

  boost::asio::io_context io;
  TaskPool storage;
  HotCache hot(pool->get());
  (*pool)->SetReclaimer([&hot] { return hot.ReclaimOne(); });
  FlushEngine flush({config.flush_threads}, pool->get(), &hot);
  CaptureEngine capture({config.capture_threads}, pool->get(), &flush);
  NodeState::Config node_config;
  node_config.node_id = config.node_id;
  node_config.storage_root = config.storage_root;
  node_config.step_timeout = config.step_timeout;
  node_config.capture_throttle_bytes_per_second = config.capture_throttle;
  NodeState node(io, node_config, fs, pool->get(), &hot, &capture, &commit, &storage);

  LoadService::Config load_config;
  load_config.storage_root = config.storage_root;
  LoadService loads(io, load_config, fs, &commit, &hot);

  SessionServices services;
  services.node = &node;
  services.loads = &loads;
  services.layout = LayoutOptions{config.checksum_chunk, config.slot_size};
  services.node_id = config.node_id;
  services.version = kVersion;

  LocalServer::Config server_config;
  server_config.path = config.socket;
  server_config.mode = static_cast<uint32_t>(std::stoul(config.socket_mode, nullptr, 8));
  server_config.allowed_uids.insert(config.allowed_uids.begin(), config.allowed_uids.end());
  LocalServer server(io, server_config, &services);

  storage.Start();
  loads.Start();
  flush.Start();
  capture.Start();
  if (Status st = server.Start(); !st.ok()) {
    spdlog::error("{}", st.ToString());
    capture.Stop();
    flush.Stop();
    loads.Stop();
    storage.Stop();
    return 1;
  }
  spdlog::info("ready");
  NotifySystemd("READY=1\nSTATUS=serving on " + config.socket);

  boost::asio::signal_set signals(io, SIGTERM, SIGINT);
  boost::asio::steady_timer deadline(io);
  bool stopping = false;
  signals.async_wait([&](const boost::system::error_code& ec, int signo) {
    if (ec) return;
    stopping = true;
    spdlog::info("signal {}: draining (stop accepting, finish in-flight steps within {} ms)",
                 signo, config.shutdown_timeout.count());
    NotifySystemd("STOPPING=1\nSTATUS=draining in-flight steps");
    server.Stop(false);
    node.Drain([&] {
      spdlog::info("drained: no step in flight");
      deadline.cancel();
      io.stop();
    });
    deadline.expires_after(config.shutdown_timeout);
    deadline.async_wait([&](const boost::system::error_code& e) {
      if (e) return;
      spdlog::warn("shutdown deadline passed: aborting the steps still in flight");
      node.CancelAll("the daemon shut down before the step was persisted");
      io.stop();
    });
    // A second signal stops at once.
    signals.async_wait([&](const boost::system::error_code& e2, int) {
      if (!e2) io.stop();
    });
  });
  io.run();

  // Reverse order: no new work, then the engines drain what they hold.
  server.Stop(true);
  node.CancelAll("the daemon is stopping");
  capture.Stop();
  flush.Stop();
  loads.Stop();
  storage.Stop();
  spdlog::info("stopped{}", stopping ? "" : " (loop ended)");
  return 0;
}

}  // namespace
}  // namespace ckpt

int main(int argc, char** argv) {
  auto config = ckpt::LoadDaemonConfig(argc, argv);
  if (!config.ok()) {
    std::cerr << "ckptd: " << config.status().message() << "\n";
    return 2;
  }
  if (!config->has_value()) return 0;  // --help
  if ((*config)->print_config) {
    std::cout << (*config)->ToYaml();
    return 0;
  }
  ckpt::InitLogging("ckptd", (*config)->log_level);
  return ckpt::RunDaemon(**config);
}
