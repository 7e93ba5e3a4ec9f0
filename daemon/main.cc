// ckptd: the node checkpoint daemon. Builds its components in dependency order, serves until
// SIGTERM/SIGINT, then drains: stops accepting, lets in-flight steps persist and commit within
// --shutdown-timeout, stops components in reverse order, exits 0. The start order is written
// once, as the pushes onto two ComponentStacks (daemon/component_stack.h) in RunDaemon: the same
// list undoes a start that fails halfway and the shutdown, with a log line per stop.
#include <fcntl.h>
#include <grp.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <iostream>

#include <sstream>

#include "common/fault_file_system.h"
#include "common/file_system.h"
#include "common/logging.h"
#include "common/units.h"
#include "daemon/admin/admin_server.h"
#include "daemon/admin/daemon_metrics.h"
#include "daemon/admin/node_admin_provider.h"
#include "daemon/admin/systemd_notify.h"
#include "daemon/admin/systemd_status.h"
#include "daemon/admin/systemd_watchdog.h"
#include "daemon/capture_engine.h"
#include "daemon/component_stack.h"
#include "daemon/coordinator/commit_engine.h"
#include "daemon/coordinator/in_process_coordinator.h"
#include "daemon/daemon_config.h"
#include "daemon/device/cuda_devices.h"
#include "daemon/flush_engine.h"
#include "daemon/host_pool.h"
#include "daemon/hot_cache.h"
#include "daemon/load_service.h"
#include "daemon/local_server.h"
#include "daemon/node_state.h"
#include "daemon/peer/peer_client.h"
#include "daemon/peer/peer_server.h"
#include "daemon/peer/peer_source.h"
#include "daemon/peer/peer_store.h"
#include "daemon/peer/replicator.h"
#include "daemon/peer/token_bucket.h"
#include "daemon/rpc/coordinator_link.h"
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

// The address other daemons reach this node's data plane at: the bound one, with a wildcard host
// (0.0.0.0, ::) replaced by this host's name.
std::string AdvertisedPeerAddress(const std::string& bound) {
  const auto colon = bound.rfind(':');
  if (colon == std::string::npos) return bound;
  const std::string host = bound.substr(0, colon);
  if (host != "0.0.0.0" && host != "[::]" && host != "::" && !host.empty()) return bound;
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return bound;
  return std::string(name) + bound.substr(colon);
}

// A load's fetches from another daemon, over its data plane.
class PeerClientFetch final : public PeerFetch {
 public:
  PeerClientFetch(peer::PeerClient::Config config, peer::TokenBucket* bucket,
                  peer::PeerObserver* observer)
      : client_(std::move(config), bucket, observer) {}
  Status Fetch(const std::string& job, uint64_t step, const std::string& file, uint64_t offset,
               uint64_t length, std::byte* out) override {
    return client_.Fetch({job, step, file, offset, length}, out);
  }

 private:
  peer::PeerClient client_;
};

// ---- global coordinator (--coordinator ADDR and the coordinator-* keys) ----
// Null when the embedded coordinator applies. Errors name the flag.
Result<std::unique_ptr<CoordinatorLink>> MakeCoordinatorLink(const DaemonConfig& config,
                                                             boost::asio::io_context& io) {
  if (config.coordinator.empty()) return std::unique_ptr<CoordinatorLink>();
  CoordinatorLink::Config link;
  link.address = config.coordinator;
  link.node_id = config.node_id;
  link.admin_address = config.admin;
  link.version = kVersion;
  link.failure_domain = config.failure_domain;
  link.peer_pool_bytes = config.peer_pool;
  link.replicas = config.EffectiveReplicas();
  link.tls.ca = config.coordinator_ca;
  link.tls.cert = config.coordinator_cert;
  link.tls.key = config.coordinator_key;
  link.tls.server_name = config.coordinator_server_name;
  link.allow_plaintext = config.coordinator_plaintext;
  spdlog::info("global coordinator at {}: commits, aborts and writer plans come from it",
               config.coordinator);
  return std::make_unique<CoordinatorLink>(io, std::move(link));
}

// CKPTD_HOLD_BEFORE_PIN=<fifo>: waits, before pinning the host pool, until a writer opens the
// FIFO — how a test observes the daemon while it is still starting (health NOT_SERVING, no
// trainer socket yet). Never set in production.
void HoldBeforePinForTests() {
  const char* fifo = std::getenv("CKPTD_HOLD_BEFORE_PIN");
  if (fifo == nullptr || *fifo == 0) return;
  spdlog::warn("CKPTD_HOLD_BEFORE_PIN={}: holding until it is opened for writing", fifo);
  const int fd = ::open(fifo, O_RDONLY | O_CLOEXEC);  // blocks until the writer comes
  if (fd >= 0) ::close(fd);
}

// ---- operations helpers (daemon/admin) ----
// --socket-group: a group name or a numeric gid; -1 when not set.
Result<int64_t> ResolveSocketGroup(const std::string& group) {
  if (group.empty()) return int64_t{-1};
  if (std::all_of(group.begin(), group.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return static_cast<int64_t>(std::stoull(group));
  }
  std::vector<char> buf(16384);
  struct group entry;
  struct group* found = nullptr;
  const int rc = ::getgrnam_r(group.c_str(), &entry, buf.data(), buf.size(), &found);
  if (rc != 0) return ErrnoStatus(rc, "socket-group: looking up group '" + group + "'");
  if (found == nullptr) return NotFound("socket-group: no group named '" + group + "'");
  return static_cast<int64_t>(found->gr_gid);
}

int RunDaemon(const DaemonConfig& config) {
  spdlog::info("ckptd {} starting: node '{}', storage root {}, host pool {}", kVersion,
               config.node_id, config.storage_root, FormatBytes(config.host_pool));
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

  CommitEngine::Config commit_config;
  commit_config.storage_root = config.storage_root;
  commit_config.keep = config.keep;
  commit_config.keep_every = config.keep_every;
  commit_config.writer = std::string("ckptd ") + kVersion;
  CommitEngine commit(std::move(commit_config), fs);
  boost::asio::io_context io;
  // Single node: the coordinator runs in process. This daemon is then the only writer of the
  // root, and its recovery scan commits what every rank persisted and removes every other
  // leftover of a crash. (With a global coordinator the root is shared: other nodes' steps are
  // in flight, and the coordinator's scan decides.)
  std::unique_ptr<InProcessCoordinator> embedded;
  if (config.coordinator.empty()) {
    CoordinatorCore::Config core;
    core.storage_root = config.storage_root;
    core.keep = config.keep;
    core.step_timeout = config.step_timeout;
    core.writer = std::string("ckptd ") + kVersion;
    core.refuse_recovered_steps = false;
    core.nice = config.worker_nice;
    embedded =
        std::make_unique<InProcessCoordinator>(io, config.node_id, std::move(core), fs, &commit);
    auto recovered = embedded->Recover();
    if (!recovered.ok()) {
      spdlog::error("recovery scan of {}: {}", config.storage_root, recovered.status().ToString());
      return 1;
    }
    for (const auto& line : *recovered) spdlog::warn("recovery: {}", line);
  }

  // Mapped now, populated and pinned once the admin endpoint is up (it says NOT_SERVING
  // meanwhile: pinning a large pool takes seconds).
  auto pool = HostPool::Create({config.host_pool, config.slot_size, true, /*defer_pin=*/true});
  if (!pool.ok()) {
    spdlog::error("host pool: {}", pool.status().ToString());
    return 1;
  }

  // ---- CUDA backend (daemon/device/). Enumerates GPUs only: contexts, copy streams and the
  // host pool's cudaHostRegister come with the first client of a GPU. No driver or no GPU: runs
  // host memory only. Declared before the io_context: sessions and plans refer to it.
  auto cuda = device::CudaDevices::Create(device::CreateCudaRuntimeApi(), pool->get());
  if (!cuda.ok()) {
    spdlog::warn("CUDA backend disabled: {}", cuda.status().ToString());
    cuda = std::unique_ptr<device::CudaDevices>();
  }
  if (*cuda != nullptr) {
    std::string uuids;
    for (const auto& u : (*cuda)->uuids()) uuids += (uuids.empty() ? "" : ", ") + u;
    spdlog::info("CUDA backend: {} GPU(s): {}", (*cuda)->device_count(), uuids);
  } else {
    spdlog::info("CUDA backend: {}", device::CudaBackendCompiledIn()
                                         ? "no GPU or driver on this machine; host memory only"
                                         : "not built; host memory only");
  }
  // ---- end CUDA backend

  TaskPool storage(1, config.worker_nice, "storage");
  // Registrations are built here, off the loop: mapping with MAP_POPULATE costs ~0.7 s per GiB
  // and must not hold up every other trainer's saves (session.h). Two threads: one large
  // registration does not queue a second trainer's behind it.
  TaskPool registrations(2, config.worker_nice, "register");
  HotCache hot(pool->get());
  (*pool)->SetReclaimer([&hot] { return hot.ReclaimOne(); });
  // Writers one step below the copy threads: a capture is what wait_snapshot (the trainer)
  // waits for, a write only what wait(persisted) waits for, and the CPU they share is finite.
  const int flush_nice = config.worker_nice == 0 ? 0 : std::min(19, config.worker_nice + 5);
  FlushEngine flush({config.flush_threads, flush_nice}, pool->get(), &hot);
  CaptureEngine capture({config.capture_threads, config.worker_nice, config.storage_stall_timeout},
                        pool->get(), &flush);
  NodeState::Config node_config;
  node_config.node_id = config.node_id;
  node_config.storage_root = config.storage_root;
  node_config.capture_throttle_bytes_per_second = config.capture_throttle;
  node_config.layout = LayoutOptions{config.checksum_chunk, config.slot_size};
  NodeState node(io, node_config, fs, pool->get(), &hot, &capture, &commit, &storage);
  auto coordinator_link = MakeCoordinatorLink(config, io);
  if (!coordinator_link.ok()) {
    spdlog::error("{}", coordinator_link.status().ToString());
    return 2;
  }
  if (*coordinator_link) {
    node.AttachCoordinator(coordinator_link->get());
  } else {
    node.AttachCoordinator(embedded.get());
  }

  // Observers first: the load service and the data plane count into the metrics.
  peer::TokenBucket peer_bandwidth(config.peer_bandwidth);
  // What this node holds for other nodes (PUT over the data plane), within --peer-pool.
  peer::PeerStore peer_store(config.peer_pool);
  ObserverList observers;
  DaemonMetrics metrics(kVersion, config.node_id, pool->get(), &hot, [&flush] {
    const FlushEngine::Activity a = flush.activity();
    return std::make_pair(a.in_flight, a.oldest_seconds);
  });
  LoadService::Config load_config;
  load_config.storage_root = config.storage_root;
  // A memory-only step's manifest is in the coordinator's memory only.
  load_config.step_manifest =
      [port = *coordinator_link ? static_cast<CoordinatorPort*>(coordinator_link->get())
                                : embedded.get()](const std::string& job, uint64_t step,
                                                  CoordinatorPort::StepManifestDone done) {
        port->StepManifest(job, step, std::move(done));
      };
  // With a global coordinator, cold loads are planned across nodes: what several nodes need is
  // read from storage by one and fetched from it by the others (daemon/load_service.h). The
  // address peers reach this node at is known once the data plane is bound (below).
  std::string peer_advertised;
  if (*coordinator_link) {
    load_config.plan_load = [link = coordinator_link->get()](ckptd::v1::LoadPlanRequest request,
                                                             CoordinatorPort::PlanLoadDone done) {
      link->PlanLoad(std::move(request), std::move(done));
    };
    load_config.node_id = config.node_id;
    load_config.peer_address = [&peer_advertised] { return peer_advertised; };
    load_config.staging_wait = config.peer_timeout;  // no FETCH waits longer than its asker
    load_config.connect_peer = [&config, &peer_bandwidth, &metrics](
                                   const std::string& address) -> std::unique_ptr<PeerFetch> {
      return std::make_unique<PeerClientFetch>(
          peer::PeerClient::Config{address, config.peer_timeout, 16ull << 20}, &peer_bandwidth,
          &metrics);
    };
  }
  load_config.read_held_copy = [&peer_store](const std::string& job, uint64_t step,
                                             const std::string& file, uint64_t offset,
                                             uint64_t length, std::byte* out) {
    return peer_store.Read(peer::Region{job, step, file, offset, length}, out);
  };
  LoadService loads(io, load_config, fs, &commit, &hot);

  SessionServices services;
  services.node = &node;
  services.loads = &loads;
  services.cuda = cuda->get();  // CUDA backend (null: none)
  services.layout = LayoutOptions{config.checksum_chunk, config.slot_size};
  services.node_id = config.node_id;
  services.version = kVersion;
  services.registrations = &registrations;

  LocalServer::Config server_config;
  server_config.path = config.socket;
  server_config.mode = static_cast<uint32_t>(std::stoul(config.socket_mode, nullptr, 8));
  server_config.allowed_uids.insert(config.allowed_uids.begin(), config.allowed_uids.end());

  // ---- operations: observers, metrics, admin gRPC (health NOT_SERVING until ready) ----
  auto socket_group = ResolveSocketGroup(config.socket_group);
  if (!socket_group.ok()) {
    spdlog::error("{}", socket_group.status().ToString());
    return 2;
  }
  server_config.group = *socket_group;
  NodeAdminProvider::Sources admin_sources;
  admin_sources.node = &node;
  admin_sources.pool = pool->get();
  admin_sources.hot = &hot;
  admin_sources.fs = fs;
  admin_sources.storage = &storage;
  admin_sources.storage_root = config.storage_root;
  admin_sources.storage_activity = [&flush] {
    const FlushEngine::Activity a = flush.activity();
    return std::make_pair(a.in_flight, a.oldest_seconds);
  };
  admin_sources.storage_stall_timeout_seconds =
      std::chrono::duration<double>(config.storage_stall_timeout).count();
  admin_sources.node_id = config.node_id;
  admin_sources.version = kVersion;
  admin_sources.config = config.Summary();
  admin_sources.peer_store = &peer_store;
  admin_sources.replicas = config.EffectiveReplicas();
  admin_sources.failure_domain = config.failure_domain;
  // Pin / unpin / delete belong to the engine that commits: ours only when embedded.
  if (config.coordinator.empty()) admin_sources.commit = &commit;
  admin_sources.coordinator = config.coordinator;
  NodeAdminProvider admin_provider(io, std::move(admin_sources));
  SystemdStatus systemd_status;
  observers.Add(&metrics);
  observers.Add(&admin_provider);
  observers.Add(&systemd_status);
  node.SetObserver(&observers);
  services.observer = &observers;
  services.shared_jobs.insert(config.shared_jobs.begin(), config.shared_jobs.end());
  if (!config.metrics.empty()) {
    if (Status st = metrics.Serve(config.metrics); !st.ok()) {
      spdlog::error("{}", st.ToString());
      return 1;
    }
    admin_provider.AddConfig("metrics-bound", metrics.bound_address());
  }
  AdminServer admin(
      {config.admin, config.admin_tls_cert, config.admin_tls_key, config.admin_tls_client_ca,
       config.admin_allow_plaintext, config.admin_read_only},
      &admin_provider);
  SystemdWatchdog watchdog(io);
  LocalServer server(io, server_config, &services);  // binds nothing until started
  // ---- end of operations setup ----

  // ---- daemon-to-daemon data plane (daemon/peer/; --peer-listen, off by default): serves
  // FETCH from what this node holds for others, its hot cache or committed storage, and keeps
  // what other nodes PUT within --peer-pool. Its own loop thread and pool.
  peer::DaemonPeerSource peer_source(&peer_store, &hot, config.slot_size, fs, config.storage_root);
  peer_source.SetLoadHooks(
      [&loads](const peer::Region& r) {
        loads.WaitStaged(r.job, r.step, r.file, r.offset, r.length);
      },
      [&observers](const std::string& job, uint64_t bytes) {
        observers.OnStorageRead(job, bytes);
      });
  // The peer-memory tier's sender: each persisted rank to the holders the coordinator assigned.
  const uint32_t replicas = config.EffectiveReplicas();
  peer::Replicator replicator({config.peer_timeout, config.worker_nice}, &hot, &peer_bandwidth,
                              &metrics);
  node.SetReplication(
      replicas,
      [&replicator](ReplicationRequest request, peer::Replicator::Done done) {
        replicator.Replicate(std::move(request), std::move(done));
      },
      /*remote_coordinator=*/!config.coordinator.empty());
  // A job the coordinator released (its trainers ended): what this node holds of it for others
  // goes, and so does its record of what it sent to its own holders, who drop theirs.
  node.SetJobReleased([&peer_store, &replicator](const std::string& job, uint64_t through) {
    const uint64_t freed = peer_store.DropJob(job, through);
    replicator.ForgetJob(job, through);
    if (freed > 0) {
      spdlog::info("job '{}' released: {} bytes held for other nodes dropped from the peer pool",
                   job, freed);
    }
  });
  // Each registration names the jobs this node holds copies of, so that a release it missed
  // reaches it.
  if (*coordinator_link) {
    (*coordinator_link)->SetHeldJobs([&peer_store] { return peer_store.Jobs(); });
  }
  if (replicas > 0 && config.coordinator.empty()) {
    spdlog::warn(
        "--replicas {}: without a coordinator there is no other node to hold copies; "
        "steps are reported not replicated",
        replicas);
  }
  std::unique_ptr<peer::PeerServer> peer_server;
  if (!config.peer_listen.empty()) {
    peer::PeerServer::Config peer_config;
    peer_config.listen = config.peer_listen;
    peer_config.nice = config.worker_nice;  // serving peers yields to capture, like flush
    // A bucket of rate 0 never makes a sender wait.
    peer_server = std::make_unique<peer::PeerServer>(std::move(peer_config), &peer_source,
                                                     &peer_store, &peer_bandwidth, &metrics);
  }

  // ---- start and stop order ----
  // Two stacks, because the admin endpoint is not nested inside what it reports on: it comes up
  // first (probes see NOT_SERVING while the pool pins) and goes down first (once the loop has
  // stopped, its calls are answered and its streams ended before the engines go away). Each
  // stack stops newest first; `operations` is declared last, so on an early return its
  // destructor runs first too, the order the shutdown below spells out.
  ComponentStack service("service");
  ComponentStack operations("operations");

  if (Status st = operations.Start(
          "admin endpoint",
          [&] {
            if (config.admin.empty()) return Status::Ok();
            RETURN_IF_ERROR(admin.Start());
            admin_provider.AddConfig("admin-bound", admin.bound_address());
            return Status::Ok();
          },
          [&] {
            admin_provider.Close();  // answer status calls the loop will never run
            admin.Stop();
          });
      !st.ok()) {
    spdlog::error("{}", st.ToString());
    return 1;
  }

  HoldBeforePinForTests();
  if (Status st = (*pool)->Pin(); !st.ok()) {
    spdlog::error("host pool: {}", st.ToString());
    return 1;
  }
  spdlog::info("host pool: {} in {} slots of {} ({})", FormatBytes((*pool)->size_bytes()),
               (*pool)->slot_count(), FormatBytes(config.slot_size),
               (*pool)->locked() ? "pinned" : "not pinned");

  // Bottom to top: the storage thread, loads and writers, the coordinator that commits what they
  // write, the copy threads that feed the writers, the register pool that builds the sessions'
  // plans, and last the socket that feeds it all. The engines' threads idle until the socket
  // brings work.
  service.StartInfallible(
      "storage thread", [&] { storage.Start(); }, [&] { storage.Stop(); });
  service.StartInfallible(
      "load service", [&] { loads.Start(); }, [&] { loads.Stop(); });
  service.StartInfallible(
      "flush engine", [&] { flush.Start(); }, [&] { flush.Stop(); });
  if (peer_server != nullptr) {
    if (Status st = service.Start(
            "peer data plane",
            [&] {
              RETURN_IF_ERROR(peer_server->Start());
              admin_provider.AddConfig("peer-bound", peer_server->bound_address());
              peer_advertised = AdvertisedPeerAddress(peer_server->bound_address());
              spdlog::info("peer data plane: bound {}, peer pool {}, bandwidth cap {}",
                           peer_server->bound_address(), FormatBytes(config.peer_pool),
                           config.peer_bandwidth == 0 ? std::string("none")
                                                      : FormatBytes(config.peer_bandwidth) + "/s");
              return Status::Ok();
            },
            [&] { peer_server->Stop(); });
        !st.ok()) {
      spdlog::error("{}", st.ToString());
      return 1;
    }
  }
  service.StartInfallible(
      "replicator", [&] { replicator.Start(); }, [&] { replicator.Stop(); });
  if (Status st = *coordinator_link
                      ? service.Start(
                            "coordinator link",
                            [&] {
                              (*coordinator_link)->SetPeerAddress(peer_advertised);
                              return (*coordinator_link)->Start(&node);
                            },
                            [&] { (*coordinator_link)->Stop(); })
                      : service.Start(
                            "embedded coordinator", [&] { return embedded->Start(&node); },
                            [&] { embedded->Stop(); });
      !st.ok()) {
    spdlog::error("{}", st.ToString());
    return 2;
  }
  service.StartInfallible(
      "capture engine", [&] { capture.Start(); }, [&] { capture.Stop(); });
  // Stopped right after the sessions closed: a registration still running finishes, and the
  // session it belonged to being closed, releases what it mapped (session.h).
  service.StartInfallible(
      "register pool", [&] { registrations.Start(); }, [&] { registrations.Stop(); });
  if (Status st = service.Start(
          "trainer socket and sessions", [&] { return server.Start(); },
          [&] {
            server.Stop(true);
            node.CancelAll("the daemon is stopping");
          });
      !st.ok()) {
    spdlog::error("{}", st.ToString());
    return 1;
  }
  spdlog::info("ready");
  admin.SetServing(true);  // ops: pool pinned, socket bound
  admin_provider.SetServing(true);
  admin_provider.Start();
  operations.StartInfallible(
      "systemd watchdog", [&] { watchdog.Start(); }, [&] { watchdog.Stop(); });
  NotifySystemd("READY=1\nSTATUS=serving on " + config.socket);

  boost::asio::signal_set signals(io, SIGTERM, SIGINT);
  boost::asio::steady_timer deadline(io);
  bool stopping = false;
  signals.async_wait([&](const boost::system::error_code& ec, int signo) {
    if (ec) return;
    stopping = true;
    spdlog::info("signal {}: draining (stop accepting, finish in-flight steps within {} ms)", signo,
                 config.shutdown_timeout.count());
    NotifySystemd("STOPPING=1\nSTATUS=draining in-flight steps");
    admin.SetServing(false);  // ops: probes see NOT_SERVING while draining
    admin_provider.SetServing(false);
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

  // The loop no longer runs. Operations first (watchdog, then the admin endpoint), then the
  // service from the top: no new work, sessions closed, then the engines drain what they hold.
  operations.StopAll();
  service.StopAll();
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
