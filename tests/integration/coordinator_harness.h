// Helpers for the coordinator tests (coordinator_*_test.cpp): a real ckpt-coordinator process,
// daemons pointed at it (distinct node ids, sockets, admin addresses; one shared storage root —
// the loopback stand-in for a PFS), in-process ranks of the model in coordinator_model.h, and
// what the tests read back from the storage root (node manifests, data file sizes).
//
// Readiness is an event, never a sleep: the coordinator is ready when its Unix socket accepts a
// connection (retried while absent, failing at once if the process exits); daemons are ready as
// in daemon_harness.h. Test files include this header alone and first.
#pragma once

#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <map>

#include "tests/integration/coordinator_model.h"
#include "tests/integration/daemon_harness.h"  // configures Catch; nothing above includes it

namespace ckpt::itest {

// A real ckpt-coordinator serving on unix:<socket> — or, with `tcp`, on an ephemeral loopback
// port (kept across restarts), for tests that cut the network (net_partition.h).
class CoordinatorProcess {
 public:
  struct Options {
    std::string socket;
    std::string storage_root;
    std::string log_path;
    std::vector<std::string> flags;  // e.g. {"--step-timeout", "5s"}
    std::vector<std::string> env;    // e.g. CKPT_COORDINATOR_CRASH_AT=after-manifest
    bool tcp = false;
  };
  explicit CoordinatorProcess(Options o) : options_(std::move(o)) { Start(); }
  ~CoordinatorProcess() {
    if (std::uncaught_exceptions() > 0) {
      std::cerr << "---- tail of the coordinator log " << options_.log_path << " ----\n"
                << FileTail(options_.log_path, 60) << "---- end ----\n";
    }
  }
  std::string address() const { return options_.tcp ? tcp_address_ : "unix:" + options_.socket; }
  ChildProcess& process() { return process_; }
  std::string Log() const { return ReadWholeFile(options_.log_path); }
  int Kill() {
    process_.Signal(SIGKILL);
    return process_.Wait();
  }
  void Restart(std::vector<std::string> env = {}) {
    if (process_.Alive()) Kill();
    options_.env = std::move(env);
    Start();
  }

 private:
  void Start() {
    const std::string binary = RequireBinary("ckpt-coordinator");
    ::unlink(options_.socket.c_str());
    {
      std::ofstream log(options_.log_path, std::ios::app);
      log << "==== harness: starting ckpt-coordinator ====\n";
    }
    const std::string listen =
        !options_.tcp ? address() : (tcp_address_.empty() ? "127.0.0.1:0" : tcp_address_);
    std::vector<std::string> args = {"--listen",    listen, "--storage-root", options_.storage_root,
                                     "--log-level", "info"};
    args.insert(args.end(), options_.flags.begin(), options_.flags.end());
    const size_t log_before = ReadWholeFile(options_.log_path).size();
    process_ = ChildProcess(binary, args, options_.log_path, options_.env);
    if (options_.tcp) {
      // Ready when this start's log says where it serves (polled: the log is a file).
      const std::string ready = "ready: serving ckptd.v1.Coordinator and ckptd.v1.Admin on ";
      std::string log;
      REQUIRE(PollUntil([&] {
        log = ReadWholeFile(options_.log_path).substr(log_before);
        return log.find(ready) != std::string::npos || !process_.Alive();
      }));
      INFO("coordinator log:\n" << log);
      const size_t at = log.find(ready);
      REQUIRE(at != std::string::npos);
      const size_t begin = at + ready.size();
      tcp_address_ = log.substr(begin, log.find('\n', begin) - begin);
      return;
    }
    // Ready when the socket accepts; the retry interval grows, the deadline bounds it.
    const auto deadline = std::chrono::steady_clock::now() + kHang;
    auto pause = milliseconds(1);
    while (true) {
      const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_un addr{};
      addr.sun_family = AF_UNIX;
      std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", options_.socket.c_str());
      const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
      ::close(fd);
      if (ok) return;
      INFO("coordinator log:\n" << FileTail(options_.log_path));
      REQUIRE(process_.Alive());
      REQUIRE(std::chrono::steady_clock::now() < deadline);
      std::this_thread::sleep_for(pause);  // retry backoff while the socket is absent
      pause = std::min(pause * 2, milliseconds(50));
    }
  }

  Options options_;
  ChildProcess process_;
  std::string tcp_address_;  // with Options::tcp: host:port, once it served
};

// `n` daemons under `dir`, nodes "n0".."n<n-1>", pointed at `coordinator`, one shared root.
inline std::vector<std::unique_ptr<DaemonProcess>> StartNodes(
    const testing::TempDir& dir, const std::string& root, const std::string& coordinator, int n,
    std::vector<std::string> extra_flags = {}) {
  std::vector<std::unique_ptr<DaemonProcess>> out;
  for (int i = 0; i < n; ++i) out.push_back(nullptr);
  for (int i = 0; i < n; ++i) {
    DaemonProcess::Options o;
    o.socket = dir / ("n" + std::to_string(i) + ".sock");
    o.storage_root = root;
    o.log_path = dir / ("n" + std::to_string(i) + ".log");
    // Admin and metrics addresses come from DaemonProcess: a Unix socket beside the trainer
    // socket and an ephemeral port, so parallel tests never compete for a fixed port.
    o.flags = {"--node-id", "n" + std::to_string(i), "--coordinator", coordinator};
    o.flags.insert(o.flags.end(), extra_flags.begin(), extra_flags.end());
    out[i] = std::make_unique<DaemonProcess>(o);
  }
  return out;
}

// How many writer plans naming ranks of its own `daemon` has applied for `job`. The daemon logs
// each on its event loop as it applies it (writer_plan_filter.cc), so a save made after the
// count grew is cut by that plan. The plan is computed on the coordinator's plan thread and
// may reach a node after a commit the same registrations allowed: a test about the step after
// the plan waits for it, so as not to depend on which thread ran first.
inline size_t WriterPlansApplied(const DaemonProcess& daemon, const std::string& job) {
  const std::string log = daemon.Log();
  const std::string prefix = "job '" + job + "': writer plan v";
  size_t applied = 0;
  for (size_t at = log.find(prefix); at != std::string::npos; at = log.find(prefix, at + 1)) {
    const size_t open = log.find(" (", at);
    if (open != std::string::npos && log.compare(open, 4, " (0 ") != 0) ++applied;
  }
  return applied;
}

// Waits until every node in `nodes` applied more writer plans for `job` than `before` says
// (one count per node, from WriterPlansApplied).
inline void WaitForWriterPlans(const std::vector<const DaemonProcess*>& nodes,
                               const std::string& job, const std::vector<size_t>& before) {
  for (size_t i = 0; i < nodes.size(); ++i) {
    INFO("node " << i << " never applied a new writer plan of job '" << job << "'; log:\n"
                 << nodes[i]->LogTail());
    REQUIRE(PollUntil([&] { return WriterPlansApplied(*nodes[i], job) > before[i]; }));
  }
}

// One rank of the coordinator model living in this test process (its memory in a memfd).
class ModelRank {
 public:
  ModelRank(const std::string& socket, const std::string& job, uint32_t rank, uint32_t world,
            uint32_t tp, uint32_t tensors,
            testing::CoordinatorModel::Split split = testing::CoordinatorModel::Split::kRows)
      : model_(tensors, tp, rank, split) {
    fd_ = ::memfd_create("model-rank", MFD_CLOEXEC);
    REQUIRE(fd_ >= 0);
    REQUIRE(::ftruncate(fd_, static_cast<off_t>(model_.total_bytes())) == 0);
    base_ = static_cast<std::byte*>(
        ::mmap(nullptr, model_.total_bytes(), PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0));
    REQUIRE(base_ != MAP_FAILED);
    ClientOptions o;
    o.socket = socket;
    o.job = job;
    o.rank = rank;
    o.world_size = world;
    o.local_rank = rank;
    o.connect_timeout = milliseconds(20000);
    auto c = Client::Connect(o);
    REQUIRE_OK(c);
    client_ = std::move(c).value();
    REQUIRE_OK(client_->Register(model_.Specs(fd_)));
  }
  ~ModelRank() {
    client_.reset();
    ::munmap(base_, model_.total_bytes());
    ::close(fd_);
  }
  Client& client() { return *client_; }
  // Fill, Save, WaitSnapshot (`persist` false: a memory-only step).
  Status SaveStep(uint64_t step, bool persist = true) {
    model_.Fill(base_, step);
    SaveOptions options;
    options.persist = persist;
    Status s = client_->Save(step, options);
    return s.ok() ? client_->WaitSnapshot(std::chrono::seconds(60)) : s;
  }
  Status WaitCommitted(uint64_t step) {
    return client_->Wait(step, WaitState::kCommitted, std::chrono::seconds(60));
  }
  struct Restored {
    uint64_t step = 0;
    uint64_t mismatches = 0;
  };
  // Loads the job's restore point (Load without a step) and checks it against the values of
  // the step the daemon says it loaded.
  Result<Restored> LoadRestorePointAndCheck() {
    std::memset(base_, 0xEE, model_.total_bytes());
    auto r = client_->Load(std::nullopt);
    if (!r.ok()) return r.status();
    return Restored{r->step, model_.CountMismatches(base_, r->step)};
  }
  // Loads `step` and returns the number of wrong elements.
  Result<uint64_t> LoadAndCheck(uint64_t step) {
    std::memset(base_, 0xEE, model_.total_bytes());
    auto r = client_->Load(step);
    if (!r.ok()) return r.status();
    return model_.CountMismatches(base_, step);
  }

 private:
  testing::CoordinatorModel model_;
  int fd_ = -1;
  std::byte* base_ = nullptr;
  std::unique_ptr<Client> client_;
};

// Bytes each node wrote for a step, from its node manifest (node id → sum of shard lengths).
inline std::map<std::string, uint64_t> NodeBytes(const std::string& root, const std::string& job,
                                                 uint64_t step) {
  std::map<std::string, uint64_t> out;
  const std::string dir = StepDir(root, job, step);
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (!name.starts_with("node-") || !name.ends_with(".nmf")) continue;
    auto m = ReadNodeManifest(PosixFileSystem(), e.path().string());
    REQUIRE_OK(m);
    uint64_t sum = 0;
    for (const auto& t : m->tensors()) {
      for (const auto& s : t.shards()) sum += s.length();
    }
    out[m->node_id()] = sum;
  }
  return out;
}

// Total size of the data files of a step.
inline uint64_t DataFileBytes(const std::string& root, const std::string& job, uint64_t step) {
  uint64_t sum = 0;
  for (const auto& e : std::filesystem::directory_iterator(StepDir(root, job, step))) {
    if (e.path().filename().string().ends_with(".data")) sum += e.file_size();
  }
  return sum;
}

}  // namespace ckpt::itest
