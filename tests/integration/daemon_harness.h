// Helpers for the multi-process tests of the daemon (tests/integration/daemon_*_test.cpp):
// real `ckptd` processes on a temporary storage root, real `ckpt_example_trainer` processes,
// in-process ranks that behave like the trainer (same tensors, same values), a raw socket client
// for malformed input, and checks of what landed on disk against trainer_data.h.
//
// Binaries come from $CKPT_BIN_DIR (set by ctest), else the directory of this test binary.
// Children are started with posix_spawn; their stdout and stderr go to a log file in the test's
// TempDir. When an assertion fails while a daemon started here is alive, the tail of its log is
// printed (a Catch listener below), so a failing test shows what the daemon saw.
//
// Nothing here sleeps to synchronise: readiness is a successful Client::Connect (which retries
// until the socket accepts), process exits are awaited on a pidfd, replies on the socket.
// Include this header first in a test file: it turns on Catch's listener interface.
#pragma once

#ifndef CATCH_CONFIG_EXTERNAL_INTERFACES
#define CATCH_CONFIG_EXTERNAL_INTERFACES
#endif
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ckpt/client.h"
#include "ckptd/v1/local.pb.h"
#include "client/examples/trainer_data.h"
#include "common/checkpoint_reader.h"
#include "common/dtype.h"
#include "common/file_system.h"
#include "common/frame_io.h"
#include "common/geometry.h"
#include "common/manifest_io.h"
#include "common/step_layout.h"
#include "tests/test_util.h"

extern char** environ;

namespace ckpt::itest {

using std::chrono::milliseconds;
using std::chrono::seconds;

// Bound on waits for things that should happen soon (a process exiting, a reply arriving):
// reached only when a test fails or hangs.
inline constexpr seconds kHang{60};

// ---------------------------------------------------------------------------- files, binaries

inline std::string BinDir() {
  const char* dir = std::getenv("CKPT_BIN_DIR");
  if (dir != nullptr && *dir != '\0') return dir;
  return std::filesystem::read_symlink("/proc/self/exe").parent_path().string();
}

// Path of a built binary; empty when it does not exist.
inline std::string FindBinary(const std::string& name) {
  const std::string path = BinDir() + "/" + name;
  return std::filesystem::exists(path) ? path : std::string();
}

inline std::string RequireBinary(const std::string& name) {
  const std::string path = FindBinary(name);
  INFO("binary " << name << " not found in " << BinDir() << " (build its target first)");
  REQUIRE(!path.empty());
  return path;
}

inline std::string ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The last `lines` lines of a text file ("" when it is absent).
inline std::string FileTail(const std::string& path, size_t lines = 40) {
  std::istringstream in(ReadWholeFile(path));
  std::deque<std::string> last;
  for (std::string line; std::getline(in, line);) {
    last.push_back(std::move(line));
    if (last.size() > lines) last.pop_front();
  }
  std::string out;
  for (const auto& l : last) out += l + "\n";
  return out;
}

inline std::string DescribeWaitStatus(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return "killed by signal " + std::to_string(WTERMSIG(status)) + " (" +
           strsignal(WTERMSIG(status)) + ")";
  }
  return "wait status " + std::to_string(status);
}

inline bool ExitedWith(int status, int code) {
  return WIFEXITED(status) && WEXITSTATUS(status) == code;
}

inline bool KilledBy(int status, int signo) {
  return WIFSIGNALED(status) && WTERMSIG(status) == signo;
}

// Polls `condition` until it holds or `timeout` passes (for conditions no event announces,
// e.g. a directory removed by the daemon's storage thread). Returns the last evaluation.
template <typename F>
bool PollUntil(F condition, milliseconds timeout = kHang) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    if (condition()) return true;
    if (std::chrono::steady_clock::now() >= deadline) return condition();
    std::this_thread::sleep_for(milliseconds(5));  // polling interval, not synchronisation
  }
}

// ---------------------------------------------------------------------------- child processes

// A process started with posix_spawn, stdin from /dev/null, stdout and stderr appended to
// `log_path`. The environment is this process's minus every CKPTD_* variable (so a stray
// setting cannot change a daemon under test), plus `extra_env` ("NAME=value").
// The destructor kills (SIGKILL) and reaps a child that is still running.
class ChildProcess {
 public:
  ChildProcess() = default;
  ChildProcess(const std::string& binary, const std::vector<std::string>& args,
               std::string log_path, const std::vector<std::string>& extra_env = {})
      : log_path_(std::move(log_path)) {
    std::vector<std::string> argv_store;
    argv_store.push_back(binary);
    argv_store.insert(argv_store.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : argv_store) argv.push_back(a.data());
    argv.push_back(nullptr);

    std::vector<std::string> env_store;
    for (char** e = environ; *e != nullptr; ++e) {
      if (std::strncmp(*e, "CKPTD_", 6) != 0) env_store.emplace_back(*e);
    }
    env_store.insert(env_store.end(), extra_env.begin(), extra_env.end());
    std::vector<char*> envp;
    for (auto& e : env_store) envp.push_back(e.data());
    envp.push_back(nullptr);

    posix_spawn_file_actions_t actions;
    REQUIRE(::posix_spawn_file_actions_init(&actions) == 0);
    REQUIRE(::posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0) == 0);
    REQUIRE(::posix_spawn_file_actions_addopen(&actions, 1, log_path_.c_str(),
                                               O_WRONLY | O_CREAT | O_APPEND, 0644) == 0);
    REQUIRE(::posix_spawn_file_actions_adddup2(&actions, 1, 2) == 0);
    const int rc =
        ::posix_spawn(&pid_, binary.c_str(), &actions, nullptr, argv.data(), envp.data());
    ::posix_spawn_file_actions_destroy(&actions);
    INFO("posix_spawn " << binary << ": " << std::strerror(rc));
    REQUIRE(rc == 0);
  }
  // Takes over a child this process forked itself (reaped and, if need be, killed like others).
  static ChildProcess Adopt(pid_t pid, std::string log_path) {
    ChildProcess p;
    p.pid_ = pid;
    p.log_path_ = std::move(log_path);
    return p;
  }
  ChildProcess(ChildProcess&& o) noexcept
      : pid_(std::exchange(o.pid_, -1)), log_path_(std::move(o.log_path_)) {}
  ChildProcess& operator=(ChildProcess&& o) noexcept {
    if (this != &o) {
      Reap();
      pid_ = std::exchange(o.pid_, -1);
      log_path_ = std::move(o.log_path_);
    }
    return *this;
  }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  ~ChildProcess() { Reap(); }

  pid_t pid() const { return pid_; }
  const std::string& log_path() const { return log_path_; }
  std::string Log() const { return ReadWholeFile(log_path_); }

  // True while the child has not exited (does not reap it).
  bool Alive() const {
    if (pid_ <= 0) return false;
    siginfo_t info = {};
    if (::waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT) != 0) {
      return false;
    }
    return info.si_pid == 0;
  }

  void Signal(int signo) const {
    if (pid_ > 0) ::kill(pid_, signo);
  }

  // SIGSTOP, returning once every thread of the child has stopped (kill() alone returns while
  // a running thread may still be finishing what it does). Thaw with Signal(SIGCONT).
  void Freeze() const {
    Signal(SIGSTOP);
    siginfo_t info = {};
    int rc;
    do {
      rc = ::waitid(P_PID, static_cast<id_t>(pid_), &info, WSTOPPED | WEXITED | WNOWAIT);
    } while (rc != 0 && errno == EINTR);
    REQUIRE(rc == 0);
    INFO("the child " << pid_ << " was to stop; waitid code " << info.si_code);
    REQUIRE(info.si_code == CLD_STOPPED);
  }

  // Waits until the child exits and reaps it: its wait status, or nullopt when it is still
  // running after `timeout`.
  std::optional<int> WaitFor(milliseconds timeout) {
    if (pid_ <= 0) return std::nullopt;
    const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0));
    if (pidfd >= 0) {
      struct pollfd p = {pidfd, POLLIN, 0};
      int ready;
      do {
        ready = ::poll(&p, 1, static_cast<int>(timeout.count()));
      } while (ready < 0 && errno == EINTR);
      ::close(pidfd);
      if (ready == 0) return std::nullopt;
    } else if (!PollUntil([this] { return !Alive(); }, timeout)) {
      return std::nullopt;  // no pidfd (old kernel): poll the process state
    }
    int status = 0;
    if (::waitpid(pid_, &status, 0) != pid_) return std::nullopt;
    pid_ = -1;
    return status;
  }

  // The wait status; fails the test when the child has not exited within `timeout`.
  int Wait(milliseconds timeout = kHang) {
    const pid_t pid = pid_;
    auto status = WaitFor(timeout);
    INFO("process " << pid << " did not exit within " << timeout.count() << " ms; its output:\n"
                    << FileTail(log_path_));
    REQUIRE(status.has_value());
    return *status;
  }

 private:
  void Reap() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
  }

  pid_t pid_ = -1;
  std::string log_path_;
};

// ---------------------------------------------------------------------------- the daemon

class DaemonProcess;

namespace detail {
// Daemons alive in this test process, for the failure listener.
struct LiveDaemons {
  std::mutex mu;
  std::set<DaemonProcess*> daemons;
};
inline LiveDaemons& Live() {
  static LiveDaemons live;
  return live;
}
}  // namespace detail

// A real ckptd process. The constructor starts it and returns once it serves (a client could
// connect and say hello). Flags: --socket, --storage-root, --node-id, small pools, --log-level
// info, plus Options::flags (later flags win). The log file is appended to across restarts.
class DaemonProcess {
 public:
  struct Options {
    std::string socket;        // Unix socket path
    std::string storage_root;  // checkpoint root
    std::string log_path;      // stdout + stderr of the daemon
    std::string host_pool = "64MiB";
    std::string slot_size = "4MiB";
    std::string checksum_chunk = "1MiB";
    std::vector<std::string> flags;  // more flags, e.g. {"--keep", "2"}
    std::vector<std::string> env;    // "NAME=value", e.g. CKPTD_FAULT_INJECTION=...
    // A command that execs the daemon, e.g. {"/usr/bin/setpriv", "--regid", "60001",
    // "--clear-groups", "--"} (net_partition.h); empty: the daemon is started itself.
    std::vector<std::string> launcher;
  };

  // Socket, root and log inside `dir`.
  static Options InDir(const testing::TempDir& dir) {
    Options o;
    o.socket = dir / "ckptd.sock";
    o.storage_root = dir / "root";
    o.log_path = dir / "ckptd.log";
    return o;
  }

  explicit DaemonProcess(Options options) : options_(std::move(options)) { Start(); }
  ~DaemonProcess() {
    if (std::uncaught_exceptions() > 0) PrintLogTail("the test failed");
    Unlist();
  }
  DaemonProcess(const DaemonProcess&) = delete;
  DaemonProcess& operator=(const DaemonProcess&) = delete;

  const Options& options() const { return options_; }
  const std::string& socket() const { return options_.socket; }
  const std::string& root() const { return options_.storage_root; }
  // The admin gRPC endpoint's Unix socket (--admin unix:PATH), beside the trainer socket.
  std::string admin_socket() const { return options_.socket + ".admin"; }
  pid_t pid() const { return process_.pid(); }
  bool Alive() const { return process_.Alive(); }
  std::string Log() const { return ReadWholeFile(options_.log_path); }
  std::string LogTail(size_t lines = 40) const { return FileTail(options_.log_path, lines); }

  // Sends `signo`; for SIGKILL also reaps the process and returns its wait status.
  std::optional<int> Kill(int signo = SIGKILL) {
    process_.Signal(signo);
    if (signo != SIGKILL) return std::nullopt;
    return process_.Wait();
  }
  // SIGSTOP, returning once the daemon is stopped; Kill(SIGCONT) thaws it.
  void Freeze() const { process_.Freeze(); }

  // Waits for the exit (after a signal sent with Kill); its wait status.
  int Wait(milliseconds timeout = kHang) { return process_.Wait(timeout); }

  // SIGTERM, then waits for the exit (the daemon drains in-flight steps first); its wait status.
  int Terminate(milliseconds timeout = kHang) {
    process_.Signal(SIGTERM);
    return process_.Wait(timeout);
  }

  ClientOptions ClientOptionsFor(const std::string& job, uint32_t rank = 0,
                                 uint32_t world_size = 1) const {
    ClientOptions o;
    o.socket = options_.socket;
    o.job = job;
    o.rank = rank;
    o.world_size = world_size;
    o.local_rank = rank;
    o.connect_timeout = milliseconds(20000);
    return o;
  }
  std::unique_ptr<Client> Connect(const std::string& job, uint32_t rank = 0,
                                  uint32_t world_size = 1) const {
    auto client = Client::Connect(ClientOptionsFor(job, rank, world_size));
    REQUIRE_OK(client);
    return std::move(client).value();
  }

  // Prints the tail of the log once per failure (listener and destructor both call this).
  void PrintLogTail(const std::string& why) {
    std::lock_guard lock(print_mu_);
    if (printed_) return;
    printed_ = true;
    std::cerr << "---- " << why << "; tail of the daemon log " << options_.log_path << " ----\n"
              << LogTail(60) << "---- end of the daemon log ----\n";
  }

 private:
  void Start() {
    const std::string binary = RequireBinary("ckptd");
    {
      std::ofstream log(options_.log_path, std::ios::app);
      log << "==== harness: starting ckptd (socket " << options_.socket << ", root "
          << options_.storage_root << ") ====\n";
    }
    std::vector<std::string> args = {
        "--socket", options_.socket, "--storage-root", options_.storage_root, "--node-id",
        "itest-node", "--host-pool", options_.host_pool, "--slot-size", options_.slot_size,
        "--checksum-chunk", options_.checksum_chunk, "--log-level", "info",
        // Tests run in parallel: no fixed TCP ports.
        "--admin", "unix:" + admin_socket(), "--metrics", "127.0.0.1:0"};
    args.insert(args.end(), options_.flags.begin(), options_.flags.end());
    if (options_.launcher.empty()) {
      process_ = ChildProcess(binary, args, options_.log_path, options_.env);
    } else {
      std::vector<std::string> launched(options_.launcher.begin() + 1, options_.launcher.end());
      launched.push_back(binary);
      launched.insert(launched.end(), args.begin(), args.end());
      process_ = ChildProcess(options_.launcher.front(), launched, options_.log_path, options_.env);
    }
    {
      std::lock_guard lock(detail::Live().mu);
      detail::Live().daemons.insert(this);
    }
    // Ready = a hello round trip works (Connect retries while the socket is absent or refuses).
    // The probe stays connected for the daemon's life: closing it right after the hello reply
    // races with the reply's write in the daemon (see daemon_failure_test.cpp, "disconnect
    // right after a reply"), and the harness must not be what brings a daemon down.
    auto ready = Client::Connect(ClientOptionsFor("itest-ready"));
    if (!ready.ok()) {
      const bool alive = Alive();
      INFO("ckptd did not become ready: " << ready.status().ToString() << "; the process "
                                          << (alive ? "is still running" : "exited")
                                          << "; its log:\n"
                                          << LogTail());
      FAIL("ckptd did not become ready");
    }
    ready_probe_ = std::move(ready).value();
  }

  void Unlist() {
    std::lock_guard lock(detail::Live().mu);
    detail::Live().daemons.erase(this);
  }

  Options options_;
  ChildProcess process_;
  std::unique_ptr<Client> ready_probe_;  // destroyed (disconnects) before process_ is killed
  std::mutex print_mu_;
  bool printed_ = false;
};

namespace detail {
// On a failed assertion, prints the log tail of every daemon still alive in this process.
// Registered from each test file that includes this header; PrintLogTail prints once.
class DaemonLogOnFailure : public Catch::TestEventListenerBase {
 public:
  using TestEventListenerBase::TestEventListenerBase;
  bool assertionEnded(const Catch::AssertionStats& stats) override {
    if (!stats.assertionResult.succeeded()) {
      std::lock_guard lock(Live().mu);
      for (DaemonProcess* d : Live().daemons) d->PrintLogTail("an assertion failed");
    }
    return true;
  }
};
}  // namespace detail

// ---------------------------------------------------------------------------- trainers

// Flags of one ckpt_example_trainer run; also describes what it saves (for the checks).
struct TrainerRun {
  std::string socket;
  std::string job = "job";
  uint32_t rank = 0;
  uint32_t world_size = 1;
  uint64_t start_step = 1;
  uint64_t steps = 1;
  uint32_t tensors = 4;
  uint64_t bytes_per_rank = 4ull << 20;
  uint64_t seed = 1;
  std::string wait = "committed";
  std::optional<uint64_t> kill_self_after_save;

  std::vector<std::string> Args() const {
    std::vector<std::string> a = {"--socket",
                                  socket,
                                  "--job",
                                  job,
                                  "--rank",
                                  std::to_string(rank),
                                  "--world-size",
                                  std::to_string(world_size),
                                  "--steps",
                                  std::to_string(steps),
                                  "--start-step",
                                  std::to_string(start_step),
                                  "--tensors",
                                  std::to_string(tensors),
                                  "--bytes-per-rank",
                                  std::to_string(bytes_per_rank),
                                  "--seed",
                                  std::to_string(seed),
                                  "--wait",
                                  wait,
                                  "--connect-timeout",
                                  "20s"};
    if (kill_self_after_save) {
      a.push_back("--kill-self-after-save");
      a.push_back(std::to_string(*kill_self_after_save));
    }
    return a;
  }
};

// Starts ckpt_example_trainer with `args`; output to `log_path`. Wait on the returned process.
inline ChildProcess StartTrainer(const std::vector<std::string>& args,
                                 const std::string& log_path) {
  return ChildProcess(RequireBinary("ckpt_example_trainer"), args, log_path);
}

// Runs ckpt_example_trainer to its end; its wait status (see ExitedWith / DescribeWaitStatus).
inline int RunTrainer(const std::vector<std::string>& args, const std::string& log_path) {
  ChildProcess p = StartTrainer(args, log_path);
  return p.Wait();
}

// Runs a trainer and requires it to exit 0, showing its output otherwise.
inline void RequireTrainerSucceeds(const TrainerRun& run, const std::string& log_path) {
  const int status = RunTrainer(run.Args(), log_path);
  INFO("trainer rank " << run.rank << " " << DescribeWaitStatus(status) << "; its output:\n"
                       << FileTail(log_path));
  REQUIRE(ExitedWith(status, 0));
}

// ---------------------------------------------------------------------------- in-process ranks

// A rank living in the test process that holds exactly what ckpt_example_trainer would (same
// layout, names, dtype, values from trainer_data.h) in a memfd, so one check covers both.
class InProcessRank {
 public:
  InProcessRank(uint64_t bytes_per_rank, uint32_t tensors, uint32_t rank, uint32_t world_size,
                uint64_t seed)
      : layout_(example::MakeTrainerLayout(bytes_per_rank, tensors, world_size)),
        rank_(rank),
        seed_(seed) {
    fd_ = UniqueFd(::memfd_create("daemon_itest", MFD_CLOEXEC));
    REQUIRE(fd_);
    REQUIRE(::ftruncate(fd_.get(), static_cast<off_t>(layout_.memfd_bytes)) == 0);
    void* p =
        ::mmap(nullptr, layout_.memfd_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_.get(), 0);
    REQUIRE(p != MAP_FAILED);
    base_ = static_cast<char*>(p);
  }
  ~InProcessRank() {
    if (base_ != nullptr) ::munmap(base_, layout_.memfd_bytes);
  }
  InProcessRank(const InProcessRank&) = delete;
  InProcessRank& operator=(const InProcessRank&) = delete;

  const example::TrainerLayout& layout() const { return layout_; }
  int fd() const { return fd_.get(); }
  uint64_t bytes() const { return layout_.memfd_bytes; }
  const char* Data() const { return base_; }

  // The "optimizer step": the values of `step`.
  void Fill(uint64_t step) {
    for (uint32_t t = 0; t < layout_.tensors.size(); ++t) {
      const auto& tensor = layout_.tensors[t];
      example::FillShard(reinterpret_cast<uint32_t*>(base_ + tensor.fd_offset),
                         tensor.rows * tensor.cols, seed_, rank_, step, t);
    }
  }

  std::vector<HostTensor> Specs() const {
    std::vector<HostTensor> specs;
    for (const auto& t : layout_.tensors) {
      HostTensor h;
      h.name = t.name;
      h.dtype = "int32";
      h.global_shape = layout_.GlobalShape(t);
      h.offsets = {uint64_t{rank_} * t.rows, 0};
      h.lengths = {t.rows, t.cols};
      h.fd = fd_.get();
      h.fd_offset = t.fd_offset;
      h.nbytes = t.nbytes;
      specs.push_back(std::move(h));
    }
    return specs;
  }

  // The extra blob the trainer sends with a step.
  std::string Extra(uint64_t step) const { return TrainerExtra(seed_, step, rank_); }
  static std::string TrainerExtra(uint64_t seed, uint64_t step, uint32_t rank) {
    return "seed=" + std::to_string(seed) + " step=" + std::to_string(step) +
           " rank=" + std::to_string(rank);
  }

 private:
  example::TrainerLayout layout_;
  uint32_t rank_;
  uint64_t seed_;
  UniqueFd fd_;
  char* base_ = nullptr;
};

// ---------------------------------------------------------------------------- on-disk checks

inline bool PathExists(const std::string& path) {
  std::error_code ec;
  return std::filesystem::exists(path, ec);
}

inline std::optional<uint64_t> ReadLatest(const std::string& root, const std::string& job) {
  const std::string path = JobDir(root, job) + "/" + std::string(kLatestFileName);
  if (!PathExists(path)) return std::nullopt;
  std::string text = ReadWholeFile(path);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
  if (text.empty()) return std::nullopt;
  return std::stoull(text);
}

inline std::vector<uint64_t> CommittedSteps(const std::string& root, const std::string& job) {
  auto steps = ListCommittedSteps(PosixFileSystem(), JobDir(root, job));
  REQUIRE_OK(steps);
  return *steps;
}

// Every step directory of the job, committed or not.
inline std::vector<uint64_t> AllStepDirs(const std::string& root, const std::string& job) {
  std::vector<uint64_t> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(JobDir(root, job), ec)) {
    if (auto n = ParseStepDirName(e.path().filename().string())) out.push_back(*n);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Reads every tensor of a step saved by trainers (or InProcessRanks) with this shape of data —
// whole global tensors through CheckpointReader — and requires every byte to equal
// trainer_data.h's value for that step; also checks the manifest's job, step, world size and
// each rank's extra blob.
inline void RequireTrainerStep(const std::string& root, const std::string& job, uint64_t step,
                               uint64_t bytes_per_rank, uint32_t tensors, uint32_t world_size,
                               uint64_t seed) {
  const std::string dir = StepDir(root, job, step);
  INFO("checking " << dir);
  auto reader = CheckpointReader::Open(PosixFileSystem(), dir);
  REQUIRE_OK(reader);
  const ckptd::v1::Manifest& m = (*reader)->manifest();
  REQUIRE(m.job() == job);
  REQUIRE(m.step() == step);
  REQUIRE(m.world_size() == world_size);
  REQUIRE(m.ranks_size() == static_cast<int>(world_size));
  for (const auto& r : m.ranks()) {
    INFO("rank " << r.rank());
    REQUIRE(r.rank() < world_size);
    REQUIRE(r.extra() == InProcessRank::TrainerExtra(seed, step, r.rank()));
  }
  const example::TrainerLayout layout =
      example::MakeTrainerLayout(bytes_per_rank, tensors, world_size);
  REQUIRE(m.tensors_size() == static_cast<int>(layout.tensors.size()));
  for (uint32_t t = 0; t < layout.tensors.size(); ++t) {
    const example::TrainerTensor& tensor = layout.tensors[t];
    INFO("tensor " << tensor.name);
    const ckptd::v1::TensorEntry* entry = (*reader)->FindTensor(tensor.name);
    REQUIRE(entry != nullptr);
    REQUIRE(entry->dtype() == "int32");
    const Shape shape = layout.GlobalShape(tensor);
    REQUIRE(Shape(entry->global_shape().begin(), entry->global_shape().end()) == shape);

    const uint64_t shard_elements = tensor.rows * tensor.cols;
    std::vector<uint32_t> actual(shard_elements * world_size, 0xDEADBEEF);
    auto full = ShardGeometry::Full(shape);
    REQUIRE_OK(full);
    CheckpointReader::Request req{tensor.name, *full, "int32",
                                  std::as_writable_bytes(std::span(actual))};
    REQUIRE_OK((*reader)->Read(std::span(&req, 1)));

    std::vector<uint32_t> expected(shard_elements);
    for (uint32_t r = 0; r < world_size; ++r) {
      example::FillShard(expected.data(), shard_elements, seed, r, step, t);
      const uint32_t* got = actual.data() + uint64_t{r} * shard_elements;
      if (std::memcmp(got, expected.data(), shard_elements * 4) != 0) {
        uint64_t i = 0;
        while (got[i] == expected[i]) ++i;
        FAIL("rank " << r << "'s rows differ at shard element " << i << ": read " << got[i]
                     << ", expected " << expected[i]);
      }
    }
  }
}

// The whole tensor `name` of a committed step, as raw bytes (its global shape from the manifest).
inline std::vector<std::byte> ReadWholeTensor(const std::string& step_dir, const std::string& name,
                                              Shape* shape_out = nullptr) {
  INFO("reading tensor " << name << " of " << step_dir);
  auto reader = CheckpointReader::Open(PosixFileSystem(), step_dir);
  REQUIRE_OK(reader);
  const ckptd::v1::TensorEntry* entry = (*reader)->FindTensor(name);
  REQUIRE(entry != nullptr);
  const Shape shape(entry->global_shape().begin(), entry->global_shape().end());
  if (shape_out != nullptr) *shape_out = shape;
  auto dtype = LookupDType(entry->dtype());
  REQUIRE_OK(dtype);
  uint64_t numel = 1;
  for (uint64_t d : shape) numel *= d;
  std::vector<std::byte> out(numel * dtype->element_size);
  auto full = ShardGeometry::Full(shape);
  REQUIRE_OK(full);
  CheckpointReader::Request req{name, *full, entry->dtype(), std::span(out)};
  REQUIRE_OK((*reader)->Read(std::span(&req, 1)));
  return out;
}

// ---------------------------------------------------------------------------- raw protocol

// A client speaking the local protocol by hand (for malformed input and for checking replies
// the C++ client hides, such as RegisterReply.unchanged).
class RawConnection {
 public:
  explicit RawConnection(const std::string& socket_path) {
    fd_ = UniqueFd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    REQUIRE(fd_);
    struct sockaddr_un addr = {};
    addr.sun_family = AF_UNIX;
    REQUIRE(socket_path.size() < sizeof addr.sun_path);
    std::memcpy(addr.sun_path, socket_path.data(), socket_path.size());
    const int rc = ::connect(fd_.get(), reinterpret_cast<struct sockaddr*>(&addr), sizeof addr);
    const int err = errno;
    INFO("connect " << socket_path << ": " << std::strerror(err));
    REQUIRE(rc == 0);
  }

  int fd() const { return fd_.get(); }

  void SendBytes(std::string_view bytes) {
    size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = ::send(fd_.get(), bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return;  // the daemon may already have closed: the reply tells
      done += static_cast<size_t>(n);
    }
  }
  void Send(ckptd::v1::ClientMessage m, std::span<const int> fds = {}) {
    if (m.request_id() == 0) m.set_request_id(++next_id_);
    REQUIRE_OK(SendFrame(fd_.get(), m.SerializeAsString(), fds));
  }
  void ShutdownWrite() { ::shutdown(fd_.get(), SHUT_WR); }

  // The next message other than an event; nullopt when the daemon closed the connection.
  // Fails the test when nothing arrives within `timeout`.
  std::optional<ckptd::v1::DaemonMessage> Next(milliseconds timeout = kHang) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (true) {
      while (!pending_.empty()) {
        ckptd::v1::DaemonMessage m = std::move(pending_.front());
        pending_.pop_front();
        if (m.has_event() && m.request_id() == 0) {
          events_.push_back(m.event());
          continue;
        }
        return m;
      }
      if (closed_) return std::nullopt;
      const auto left =
          std::chrono::duration_cast<milliseconds>(deadline - std::chrono::steady_clock::now());
      struct pollfd p = {fd_.get(), POLLIN, 0};
      const int ready = ::poll(&p, 1, static_cast<int>(std::max<int64_t>(left.count(), 0)));
      if (ready < 0 && errno == EINTR) continue;
      REQUIRE(ready >= 0);
      INFO("no message from the daemon within " << timeout.count() << " ms");
      REQUIRE(ready == 1);
      // Readable: read one frame (or learn the connection ended).
      const int flags = ::fcntl(fd_.get(), F_GETFL);
      ::fcntl(fd_.get(), F_SETFL, flags | O_NONBLOCK);
      auto frame = reader_.ReadSome(fd_.get());
      ::fcntl(fd_.get(), F_SETFL, flags);
      if (!frame.ok()) {
        closed_ = true;  // EOF or a reset
        continue;
      }
      if (!frame->has_value()) continue;
      ckptd::v1::DaemonMessage m;
      REQUIRE(m.ParseFromString((*frame)->payload));
      pending_.push_back(std::move(m));
    }
  }

  // Sends `m` and returns the reply to it (requires one).
  ckptd::v1::DaemonMessage Call(ckptd::v1::ClientMessage m, std::span<const int> fds = {}) {
    m.set_request_id(++next_id_);
    const uint64_t id = m.request_id();
    Send(std::move(m), fds);
    auto reply = Next();
    INFO("the daemon closed the connection instead of answering request " << id);
    REQUIRE(reply.has_value());
    REQUIRE(reply->request_id() == id);
    return *reply;
  }

  ckptd::v1::DaemonMessage Hello(const std::string& job, uint32_t rank = 0,
                                 uint32_t world_size = 1) {
    ckptd::v1::ClientMessage m;
    auto* h = m.mutable_hello();
    h->set_protocol_version(1);
    h->set_job(job);
    h->set_rank(rank);
    h->set_world_size(world_size);
    h->set_local_rank(rank);
    h->set_client_version("daemon_itest raw");
    return Call(std::move(m));
  }

  const std::vector<ckptd::v1::Event>& events() const { return events_; }

 private:
  UniqueFd fd_;
  FrameReader reader_;
  std::deque<ckptd::v1::DaemonMessage> pending_;
  std::vector<ckptd::v1::Event> events_;
  bool closed_ = false;
  uint64_t next_id_ = 0;
};

// A TensorSpec of host memory: a whole 1-D-or-more tensor as one box shard.
inline ckptd::v1::TensorSpec HostSpec(const std::string& name, const std::string& dtype,
                                      const std::vector<uint64_t>& shape, uint64_t offset,
                                      uint64_t length, uint32_t fd_index = 0) {
  ckptd::v1::TensorSpec spec;
  spec.set_name(name);
  spec.set_dtype(dtype);
  auto* box = spec.mutable_geometry()->mutable_box();
  for (uint64_t d : shape) {
    spec.add_global_shape(d);
    box->add_offsets(0);
    box->add_lengths(d);
  }
  auto* host = spec.mutable_host();
  host->set_fd_index(fd_index);
  host->set_offset(offset);
  host->set_length(length);
  return spec;
}

// Runs ckptctl with `args` to its end; its exit status and output.
inline std::pair<int, std::string> RunCkptctl(const testing::TempDir& dir,
                                              const std::vector<std::string>& args) {
  const std::string log = dir / "ckptctl.out";
  std::filesystem::remove(log);
  ChildProcess p(RequireBinary("ckptctl"), args, log);
  const int status = p.Wait();
  REQUIRE(WIFEXITED(status));
  return {WEXITSTATUS(status), ReadWholeFile(log)};
}

// A stand-in for systemd's NOTIFY_SOCKET: a bound datagram socket at `path`.
inline UniqueFd BindDatagramSocket(const std::string& path) {
  UniqueFd fd(::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  REQUIRE(fd);
  sockaddr_un addr = {};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path.c_str());
  REQUIRE(::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  return fd;
}

// Receives one datagram, waiting at most `timeout_ms`; "" on timeout.
inline std::string ReceiveDatagram(int fd, int timeout_ms) {
  pollfd p = {fd, POLLIN, 0};
  if (::poll(&p, 1, timeout_ms) != 1) return "";
  char buf[4096];
  const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
}

}  // namespace ckpt::itest

// Every test file including this header registers the listener (each registration prints a
// daemon's log at most once per failure, see DaemonProcess::PrintLogTail).
using DaemonLogListener = ckpt::itest::detail::DaemonLogOnFailure;
CATCH_REGISTER_LISTENER(DaemonLogListener)
