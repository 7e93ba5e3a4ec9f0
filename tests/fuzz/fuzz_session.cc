// libFuzzer harness: a daemon session (daemon/session.h) behind the frame decoder, i.e. what a
// hostile local client can reach. One in-process daemon core is built on first use (host pool,
// capture and flush engines, embedded commit on a temporary root with --keep 2, load service),
// as daemon/main.cc assembles it. Each input becomes one client connection over a socket pair:
// first a valid Hello (job "fuzz", rank 0 of 1) so that every request type is reachable, then
// the input cut into frames, each as [flags u8][length u16 LE][payload]; flags bit 0 attaches a
// 1 MiB memfd to the frame (SCM_RIGHTS), so Register's descriptors can be valid or not. Then
// the client shuts down its side and the daemon's loop runs until the session has closed.
// Any crash or sanitizer report is a bug; Error replies are the expected answer.
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include <google/protobuf/stubs/logging.h>

#include "ckptd/v1/local.pb.h"
#include "common/file_system.h"
#include "common/frame_io.h"
#include "common/logging.h"
#include "daemon/capture_engine.h"
#include "daemon/coordinator/commit_engine.h"
#include "daemon/coordinator/in_process_coordinator.h"
#include "daemon/flush_engine.h"
#include "daemon/host_pool.h"
#include "daemon/hot_cache.h"
#include "daemon/load_service.h"
#include "daemon/node_state.h"
#include "daemon/session.h"
#include "daemon/task_pool.h"

namespace {

// The daemon core, built once and kept for the life of the process (reachable, so never
// reported as a leak).
struct FuzzDaemon {
  boost::asio::io_context io;
  // Keeps the loop from stopping when a session's last handler ran (a stopped io_context would
  // run nothing for the next input).
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work =
      boost::asio::make_work_guard(io);
  std::string root;
  std::unique_ptr<ckpt::HostPool> pool;
  std::unique_ptr<ckpt::CommitEngine> commit;
  std::unique_ptr<ckpt::TaskPool> storage;
  std::unique_ptr<ckpt::HotCache> hot;
  std::unique_ptr<ckpt::FlushEngine> flush;
  std::unique_ptr<ckpt::CaptureEngine> capture;
  std::unique_ptr<ckpt::InProcessCoordinator> coordinator;
  std::unique_ptr<ckpt::NodeState> node;
  std::unique_ptr<ckpt::LoadService> loads;
  ckpt::SessionServices services;
  uint64_t next_session = 1;
  int memfd = -1;

  FuzzDaemon() {
    ckpt::InitLogging("fuzz_session", "off");
    char tmpl[] = "/tmp/ckpt-fuzz-session-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) std::abort();
    root = tmpl;
    ckpt::FileSystem* fs = ckpt::PosixFileSystem();
    auto p = ckpt::HostPool::Create({16ull << 20, 1ull << 20, false});
    if (!p.ok()) std::abort();
    pool = std::move(p).value();
    commit = std::make_unique<ckpt::CommitEngine>(
        ckpt::CommitEngine::Config{root, 2, "fuzz_session"}, fs);
    storage = std::make_unique<ckpt::TaskPool>();
    hot = std::make_unique<ckpt::HotCache>(pool.get());
    pool->SetReclaimer([this] { return hot->ReclaimOne(); });
    flush =
        std::make_unique<ckpt::FlushEngine>(ckpt::FlushEngine::Config{2}, pool.get(), hot.get());
    capture = std::make_unique<ckpt::CaptureEngine>(ckpt::CaptureEngine::Config{1}, pool.get(),
                                                    flush.get());
    ckpt::NodeState::Config node_config;
    node_config.node_id = "fuzz-node";
    node_config.storage_root = root;
    ckpt::CoordinatorCore::Config core;
    core.storage_root = root;
    core.step_timeout = std::chrono::seconds(5);
    core.refuse_recovered_steps = false;
    coordinator =
        std::make_unique<ckpt::InProcessCoordinator>(io, "fuzz-node", core, fs, commit.get());
    if (!coordinator->Recover().ok()) std::abort();
    node = std::make_unique<ckpt::NodeState>(io, node_config, fs, pool.get(), hot.get(),
                                             capture.get(), commit.get(), storage.get());
    node->AttachCoordinator(coordinator.get());
    if (!coordinator->Start(node.get()).ok()) std::abort();
    ckpt::LoadService::Config load_config;
    load_config.storage_root = root;
    loads = std::make_unique<ckpt::LoadService>(io, load_config, fs, commit.get(), hot.get());
    services.node = node.get();
    services.loads = loads.get();
    services.layout = ckpt::LayoutOptions{64 << 10, 1 << 20};
    services.node_id = "fuzz-node";
    services.version = "fuzz";
    storage->Start();
    loads->Start();
    flush->Start();
    capture->Start();
    memfd = ::memfd_create("fuzz_session", MFD_CLOEXEC);
    if (memfd < 0 || ::ftruncate(memfd, 1 << 20) != 0) std::abort();
  }
};

FuzzDaemon& Daemon() {
  static FuzzDaemon* daemon = new FuzzDaemon();
  return *daemon;
}

std::string HelloFrame() {
  ckptd::v1::ClientMessage m;
  m.set_request_id(1);
  auto* h = m.mutable_hello();
  h->set_protocol_version(1);
  h->set_job("fuzz");
  h->set_rank(0);
  h->set_world_size(1);
  h->set_client_version("fuzz_session");
  return m.SerializeAsString();
}

// Reads and drops what the session wrote, so its writes never wait on a full socket.
void Drain(int fd) {
  char buf[65536];
  while (::recv(fd, buf, sizeof buf, MSG_DONTWAIT) > 0) {
  }
}

}  // namespace

// Protobuf logs every string field with invalid UTF-8 to stderr; a fuzzer makes millions.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzDaemon& d = Daemon();
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) std::abort();
  ckpt::UniqueFd client(sv[0]);
  boost::asio::local::stream_protocol::socket server(d.io, boost::asio::local::stream_protocol(),
                                                     sv[1]);
  auto session = std::make_shared<ckpt::Session>(std::move(server), d.next_session++, ::getpid(),
                                                 ::getuid(), &d.services);
  session->Start();

  // The client's side: Hello, then the input's frames. Sends stop at the first failure (the
  // session may have closed the connection already).
  ckpt::Status sent = ckpt::SendFrame(client.get(), HelloFrame());
  size_t pos = 0;
  while (sent.ok() && pos + 3 <= size) {
    const uint8_t flags = data[pos];
    const size_t length =
        std::min<size_t>(data[pos + 1] | (size_t{data[pos + 2]} << 8), size - pos - 3);
    const std::string payload(reinterpret_cast<const char*>(data + pos + 3), length);
    pos += 3 + length;
    const int fds[] = {d.memfd};
    sent = ckpt::SendFrame(client.get(), payload,
                           (flags & 1) ? std::span<const int>(fds) : std::span<const int>());
    Drain(client.get());
    d.io.poll();
  }
  ::shutdown(client.get(), SHUT_WR);

  // Run the daemon's loop until the session has seen the end of the stream and closed.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!session->closed() && std::chrono::steady_clock::now() < deadline) {
    d.io.run_one_for(std::chrono::milliseconds(5));
    Drain(client.get());
  }
  if (!session->closed()) session->Close("fuzz input done");
  d.io.poll();
  return 0;
}
