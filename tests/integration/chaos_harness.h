// Shared pieces of the chaos tests (chaos_*_test.cpp): a seeded random source whose seed is
// printed, the ckpt_chaos_trainer processes the tests drive step by step over pipes, and the
// invariants checked after every injected failure.
//
// The job is a multi-rank one: W ckpt_chaos_trainer processes (chaos_trainer.cc), each told
// "save N" on its stdin and answering "done N ok|err ..." on a pipe, so the test decides when
// each step starts and knows when every rank finished it. A kill lands at a random moment inside
// a cycle: the delay is drawn uniformly over the recent cycle length, so kills fall during
// Save, the capture, the flush, the commit and between steps alike.
//
// Extension point: the victims are an enum (ChaosVictim); the multi-node coordinator joins as
// one more victim once ckpt-coordinator exists (kill it, restart it, and check the same
// invariants, which are all stated on the storage root).
#pragma once

#include "tests/integration/daemon_harness.h"  // first: it configures Catch

#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace ckpt::itest::chaos {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

// A number from the environment, or `fallback`.
inline uint64_t EnvNumber(const char* name, uint64_t fallback) {
  const char* s = std::getenv(name);
  return s && *s ? std::strtoull(s, nullptr, 10) : fallback;
}

// The seed of a chaos test: CKPT_CHAOS_SEED, else CKPT_TEST_SEED, else `fallback`, else (0) a
// fresh one (chaos is meant to explore). Printed at the start of the test and flushed at once:
// under ctest stdout is a pipe, and a line still in the buffer would be lost with a test that
// hangs and is killed. Callers also INFO it, so a failed assertion names it too.
inline uint64_t ChaosSeed(uint64_t fallback = 0) {
  uint64_t seed = EnvNumber("CKPT_CHAOS_SEED", EnvNumber("CKPT_TEST_SEED", fallback));
  if (seed == 0) seed = std::random_device{}() ^ (uint64_t{std::random_device{}()} << 32);
  std::cout << "chaos seed " << seed << " (repeat with CKPT_CHAOS_SEED=" << seed << ")"
            << std::endl;
  return seed;
}

// ---------------------------------------------------------------------------- trainer process

// One ckpt_chaos_trainer: stdin is a pipe from the test, descriptor 3 a pipe back, stdout and
// stderr a log file. Reaped (and killed when still running) by its ChildProcess.
class ChaosTrainer {
 public:
  ChaosTrainer(const std::vector<std::string>& args, const std::string& log_path) {
    const std::string binary = RequireBinary("ckpt_chaos_trainer");
    int to_child[2], from_child[2];
    REQUIRE(::pipe2(to_child, O_CLOEXEC) == 0);
    REQUIRE(::pipe2(from_child, O_CLOEXEC) == 0);
    std::vector<std::string> argv_store = {binary};
    argv_store.insert(argv_store.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : argv_store) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    REQUIRE(::posix_spawn_file_actions_init(&actions) == 0);
    REQUIRE(::posix_spawn_file_actions_adddup2(&actions, to_child[0], 0) == 0);
    REQUIRE(::posix_spawn_file_actions_adddup2(&actions, from_child[1], 3) == 0);
    REQUIRE(::posix_spawn_file_actions_addopen(&actions, 1, log_path.c_str(),
                                               O_WRONLY | O_CREAT | O_APPEND, 0644) == 0);
    REQUIRE(::posix_spawn_file_actions_adddup2(&actions, 1, 2) == 0);
    pid_t pid = -1;
    const int rc = ::posix_spawn(&pid, binary.c_str(), &actions, nullptr, argv.data(), environ);
    ::posix_spawn_file_actions_destroy(&actions);
    ::close(to_child[0]);
    ::close(from_child[1]);
    commands_ = UniqueFd(to_child[1]);
    replies_ = UniqueFd(from_child[0]);
    INFO("posix_spawn " << binary << ": " << std::strerror(rc));
    REQUIRE(rc == 0);
    process_ = ChildProcess::Adopt(pid, log_path);
  }

  pid_t pid() const { return process_.pid(); }
  int reply_fd() const { return replies_.get(); }
  std::string LogTail() const { return FileTail(process_.log_path(), 20); }

  void Send(const std::string& line) {
    const std::string out = line + "\n";
    INFO("writing to trainer " << pid());
    REQUIRE(::write(commands_.get(), out.data(), out.size()) == static_cast<ssize_t>(out.size()));
  }

  // Reads what is available (the fd polled readable); a complete line if one is now buffered.
  // nullopt also when the trainer closed its end (it died): see closed().
  std::optional<std::string> ReadAvailable() {
    if (auto line = TakeLine()) return line;
    char buf[4096];
    const ssize_t n = ::read(replies_.get(), buf, sizeof buf);
    if (n <= 0) {
      if (n == 0 || errno != EINTR) closed_ = true;
      return std::nullopt;
    }
    buffer_.append(buf, static_cast<size_t>(n));
    return TakeLine();
  }
  bool closed() const { return closed_; }

  // Blocks (up to kHang) for the next line; fails the test with the trainer's log otherwise.
  std::string NextLine() {
    const auto deadline = Clock::now() + kHang;
    while (true) {
      if (auto line = TakeLine()) return *line;
      INFO("trainer " << pid() << " sent no reply; its log:\n" << LogTail());
      REQUIRE(!closed_);
      const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
      REQUIRE(left.count() > 0);
      struct pollfd p = {replies_.get(), POLLIN, 0};
      const int ready = ::poll(&p, 1, static_cast<int>(left.count()));
      if (ready < 0 && errno == EINTR) continue;
      REQUIRE(ready >= 0);
      if (ready == 1) {
        if (auto line = ReadAvailable()) return *line;
      }
    }
  }

  // SIGKILL and reap; the wait status.
  int Kill() {
    process_.Signal(SIGKILL);
    return process_.Wait();
  }
  void Signal(int signo) { process_.Signal(signo); }

  // Closes stdin (the trainer exits 0) and waits.
  int Finish() {
    commands_ = UniqueFd();
    return process_.Wait();
  }

 private:
  std::optional<std::string> TakeLine() {
    const auto nl = buffer_.find('\n');
    if (nl == std::string::npos) return std::nullopt;
    std::string line = buffer_.substr(0, nl);
    buffer_.erase(0, nl + 1);
    return line;
  }

  ChildProcess process_;
  UniqueFd commands_, replies_;
  std::string buffer_;
  bool closed_ = false;
};

// The flags of rank `rank` of the chaos job.
struct ChaosJob {
  std::string job = "chaos";
  uint32_t world_size = 4;
  uint64_t bytes_per_rank = 256 << 10;
  uint32_t tensors = 3;
  uint64_t seed = 1;

  std::vector<std::string> TrainerArgs(const std::string& socket, uint32_t rank) const {
    return {"--socket",
            socket,
            "--job",
            job,
            "--rank",
            std::to_string(rank),
            "--world-size",
            std::to_string(world_size),
            "--bytes-per-rank",
            std::to_string(bytes_per_rank),
            "--tensors",
            std::to_string(tensors),
            "--seed",
            std::to_string(seed),
            "--timeout-ms",
            "60000"};
  }
};

// "ready loaded=<step|none> ok": the restored step (nullopt for none); fails on an error.
inline std::optional<uint64_t> RequireRestored(const std::string& ready_line) {
  INFO("restarted trainer said: " << ready_line);
  REQUIRE(ready_line.rfind("ready loaded=", 0) == 0);
  REQUIRE(ready_line.size() >= 3);
  REQUIRE(ready_line.substr(ready_line.size() - 3) == " ok");
  const std::string what = ready_line.substr(13, ready_line.find(' ', 13) - 13);
  if (what == "none") return std::nullopt;
  return std::stoull(what);
}

// ---------------------------------------------------------------------------- invariants

// Every step directory of `job` on the root is committed (has its MANIFEST); waits a while for
// the daemon's storage thread to remove the directories of steps that just failed.
inline void RequireNoUncommittedSteps(const std::string& root, const std::string& job) {
  std::vector<uint64_t> all, committed;
  const bool clean = PollUntil([&] {
    all = AllStepDirs(root, job);
    committed = CommittedSteps(root, job);
    return all == committed;
  });
  std::ostringstream s;
  for (uint64_t x : all) s << x << " ";
  INFO("step directories: " << s.str() << "(" << committed.size() << " committed)");
  std::ostringstream left;
  for (uint64_t x : all) {
    if (std::find(committed.begin(), committed.end(), x) != committed.end()) continue;
    left << "step " << x << ":";
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(ckpt::StepDir(root, job, x), ec)) {
      left << " " << e.path().filename().string();
    }
    left << "; ";
  }
  INFO("uncommitted leftovers: " << left.str());
  REQUIRE(clean);
}

// LATEST names a committed step (the newest one, in the file too, when `newest` is set), every
// committed step passes `ckptctl verify` and holds exactly what the ranks saved, and retention kept
// at most `keep` steps. Returns the committed steps.
inline std::vector<uint64_t> RequireCommittedStepsIntact(const std::string& root,
                                                         const ChaosJob& job, uint32_t keep,
                                                         bool newest) {
  const std::vector<uint64_t> committed = CommittedSteps(root, job.job);
  const std::optional<uint64_t> latest_file = ReadLatest(root, job.job);
  auto resolved = ResolveLatest(PosixFileSystem(), JobDir(root, job.job));
  REQUIRE_OK(resolved);
  const std::optional<uint64_t> latest = *resolved;
  std::ostringstream s;
  for (uint64_t x : committed) s << x << " ";
  INFO("committed steps: " << s.str() << "; LATEST file "
                           << (latest_file ? std::to_string(*latest_file) : std::string("absent"))
                           << ", resolved "
                           << (latest ? std::to_string(*latest) : std::string("none")));
  auto is_committed = [&](uint64_t step) {
    return std::find(committed.begin(), committed.end(), step) != committed.end();
  };
  // The LATEST file, when present, never names anything but a committed step. It may lag (or
  // be absent) after a daemon killed between a MANIFEST and LATEST: readers then resolve the
  // newest MANIFEST (commit_engine.h), and that resolved step is what must be committed.
  if (latest_file) REQUIRE(is_committed(*latest_file));
  if (committed.empty()) {
    REQUIRE(!latest.has_value());
    return committed;
  }
  REQUIRE(latest.has_value());
  REQUIRE(is_committed(*latest));
  if (newest) {
    REQUIRE(*latest == committed.back());
    REQUIRE(latest_file == committed.back());
  }
  if (keep > 0) REQUIRE(committed.size() <= keep);
  const std::string ckptctl = RequireBinary("ckptctl");
  for (uint64_t step : committed) {
    const std::string dir = StepDir(root, job.job, step);
    const std::string log = root + "/../verify.log";
    ChildProcess verify(ckptctl, {"verify", dir}, log);
    const int status = verify.Wait();
    INFO("ckptctl verify " << dir << " " << DescribeWaitStatus(status) << ":\n" << FileTail(log));
    REQUIRE(ExitedWith(status, 0));
    RequireTrainerStep(root, job.job, step, job.bytes_per_rank, job.tensors, job.world_size,
                       job.seed);
  }
  return committed;
}

}  // namespace ckpt::itest::chaos
