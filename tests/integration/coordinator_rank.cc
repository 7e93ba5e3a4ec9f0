// ckpt_coordinator_rank: one trainer rank of the coordinator tests (coordinator_*_test.cpp).
//
// Model: K int32 matrices "layers.<k>.weight" of (16·(k+1)) × 1024 elements, split by rows over
// `tp` tensor-parallel ranks and replicated over world/tp data-parallel ranks (rank r holds TP
// slice r % tp), plus "embed.weight" (64 × 1024) replicated whole on every rank. Element values
// depend only on (step, tensor, global element index), so replicas are identical and any layout
// can check what it loads. Every shard is a multiple of 4 KiB, so bytes on disk == shard bytes.
//
//   save --steps 1,2,3: per step fill, Save, WaitSnapshot, Wait(committed); prints
//        "step <s> committed" or "step <s> failed: <message>"; exit 0 (1: could not even start).
//        With --wait-replicated it also waits for persisted before committed, and for replicated
//        after, then prints "step <s> replicated persisted_ns <t> committed_ns <t> replicated_ns
//        <t>" (when each wait returned, on the monotonic clock) or "step <s> not replicated: ...".
//        With --resume-fifo PATH it opens PATH for reading after the first step, which blocks
//        until the test opens it for writing (the test's "go on": e.g. once the writer plan is
//        in force on every node).
//   load [--step N]: registers its layout, loads, checks every element; prints
//        "loaded step <s> bytes <n> ... load_ns <start> <end>" (the Load call, on the monotonic
//        clock that every process of the machine shares); exit 0 when every element matches, 3
//        otherwise. With --in-step it moves in step with the other ranks of a benchmark that
//        runs several "nodes" on one machine: it prints "ready" once registered and filled,
//        then waits for a line on stdin before it loads, and prints "loaded" and waits for
//        another before it checks. So no rank's own work (filling 245 MiB, checking it) takes
//        the cores from another rank's load while the job's load is timed: on real nodes it
//        runs on cores of its own.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "ckpt/client.h"
#include "common/status.h"
#include "tests/integration/coordinator_model.h"

namespace {

int Fail(const std::string& what, const ckpt::Status& s) {
  std::fprintf(stderr, "ckpt_coordinator_rank: %s: %s\n", what.c_str(), s.ToString().c_str());
  return 1;
}

// With --in-step: says `what` on stdout and waits for a line on stdin (the benchmark's "go").
bool InStep(bool in_step, const char* what) {
  if (!in_step) return true;
  std::printf("%s\n", what);
  std::fflush(stdout);
  for (char c = 0; std::fread(&c, 1, 1, stdin) == 1;) {
    if (c == '\n') return true;
  }
  return false;  // the benchmark went away
}

// Now on the monotonic clock that every process of the machine shares, in nanoseconds.
long long NowNs() {
  return static_cast<long long>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                    std::chrono::steady_clock::now().time_since_epoch())
                                    .count());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"a trainer rank of the coordinator tests"};
  std::string mode, socket, job, steps_text;
  uint32_t rank = 0, world = 1, tp = 1, tensors = 4;
  std::optional<uint64_t> load_step;
  bool wait_replicated = false;
  app.add_option("mode", mode)->required();
  app.add_option("--socket", socket)->required();
  app.add_option("--job", job)->required();
  app.add_option("--rank", rank)->required();
  app.add_option("--world-size", world)->required();
  app.add_option("--tp", tp)->required();
  app.add_option("--tensors", tensors);
  app.add_option("--steps", steps_text);
  app.add_option("--step", load_step);
  app.add_flag("--wait-replicated", wait_replicated);
  bool in_step = false;
  app.add_flag("--in-step", in_step, "load: wait on stdin before the load and before the check");
  std::string resume_fifo;
  app.add_option("--resume-fifo", resume_fifo);
  CLI11_PARSE(app, argc, argv);

  ckpt::testing::CoordinatorModel model(tensors, tp, rank);
  const int fd = ::memfd_create("ckpt_coordinator_rank", MFD_CLOEXEC);
  if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(model.total_bytes())) != 0) {
    return Fail("memfd", ckpt::ErrnoStatus(errno, "memfd"));
  }
  auto* base = static_cast<std::byte*>(
      ::mmap(nullptr, model.total_bytes(), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  if (base == MAP_FAILED) return Fail("mmap", ckpt::ErrnoStatus(errno, "mmap"));

  ckpt::ClientOptions options;
  options.socket = socket;
  options.job = job;
  options.rank = rank;
  options.world_size = world;
  options.local_rank = rank;
  options.connect_timeout = std::chrono::seconds(30);
  auto client = ckpt::Client::Connect(options);
  if (!client.ok()) return Fail("connect to " + socket, client.status());
  if (auto s = (*client)->Register(model.Specs(fd)); !s.ok()) return Fail("register", s);

  if (mode == "save") {
    std::stringstream ss(steps_text);
    for (std::string item; std::getline(ss, item, ',');) {
      const uint64_t step = std::stoull(item);
      model.Fill(base, step);
      ckpt::Status s = (*client)->Save(step, "rank " + std::to_string(rank));
      if (s.ok()) s = (*client)->WaitSnapshot();
      long long persisted_ns = 0;
      if (s.ok() && wait_replicated) {
        s = (*client)->Wait(step, ckpt::WaitState::kPersisted, std::chrono::seconds(120));
        persisted_ns = NowNs();
      }
      if (s.ok()) s = (*client)->Wait(step, ckpt::WaitState::kCommitted, std::chrono::seconds(120));
      const long long committed_ns = NowNs();
      if (s.ok()) {
        std::printf("step %llu committed\n", static_cast<unsigned long long>(step));
      } else {
        std::printf("step %llu failed: %s\n", static_cast<unsigned long long>(step),
                    s.ToString().c_str());
      }
      if (s.ok() && wait_replicated) {
        s = (*client)->Wait(step, ckpt::WaitState::kReplicated, std::chrono::seconds(120));
        if (s.ok()) {
          std::printf(
              "step %llu replicated persisted_ns %lld committed_ns %lld "
              "replicated_ns %lld\n",
              static_cast<unsigned long long>(step), persisted_ns, committed_ns, NowNs());
        } else {
          std::printf("step %llu not replicated: %s\n", static_cast<unsigned long long>(step),
                      s.ToString().c_str());
        }
      }
      std::fflush(stdout);
      if (!resume_fifo.empty()) {
        const int fd = ::open(resume_fifo.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0) return Fail("open", ckpt::ErrnoStatus(errno, resume_fifo));
        ::close(fd);
        resume_fifo.clear();
      }
    }
    return 0;
  }
  if (mode == "load") {
    std::memset(base, 0xEE, model.total_bytes());
    const ckpt::Status no_go = ckpt::Aborted("stdin closed before the benchmark's go");
    if (!InStep(in_step, "ready")) return Fail("in step", no_go);
    const auto started = std::chrono::steady_clock::now();
    auto loaded = (*client)->Load(load_step);
    const auto ended = std::chrono::steady_clock::now();
    if (!loaded.ok()) return Fail("load", loaded.status());
    if (!InStep(in_step, "loaded")) return Fail("in step", no_go);
    const uint64_t bad = model.CountMismatches(base, loaded->step);
    const auto ns = [](std::chrono::steady_clock::time_point t) {
      return static_cast<long long>(
          std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count());
    };
    std::printf(
        "loaded step %llu bytes %llu mismatches %llu extra '%s' load_ns %lld %lld\n",
        static_cast<unsigned long long>(loaded->step),
        static_cast<unsigned long long>(loaded->bytes_from_storage + loaded->bytes_from_memory +
                                        loaded->bytes_from_peers),
        static_cast<unsigned long long>(bad), loaded->extra.c_str(), ns(started), ns(ended));
    return bad == 0 ? 0 : 3;
  }
  std::fprintf(stderr, "ckpt_coordinator_rank: unknown mode '%s'\n", mode.c_str());
  return 2;
}
