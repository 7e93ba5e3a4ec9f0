// ckpt_example_trainer: a small but real trainer rank that checkpoints through ckptd.
//
// It keeps K int32 tensors (row-block shards of global tensors, client/examples/trainer_data.h)
// in one memfd, registers them once, and runs the lazy-snapshot loop of docs/design.md §2.3:
//
//   for step in start .. start+steps-1:
//     "optimizer step"    fill the tensors with the step's values (only after the previous
//                         WaitSnapshot returned: the daemon may still be copying until then)
//     Save(step)          returns as soon as the daemon accepted it
//     "forward/backward"  a checksum pass over the tensors (reads only)
//     WaitSnapshot()      the fence before the next optimizer step
//
// and finally waits until the last step reaches --wait. One line per step on stdout:
//   step <s> save_us <µs in Save> wait_snapshot_us <µs stalled in WaitSnapshot> checksum <hex>
// Exit status: 0 on success, 1 on any error (the message goes to stderr).
// --kill-self-after-save STEP raises SIGKILL right after Save(STEP) returns, to simulate a
// trainer that crashes while its snapshot is being captured.
#include <sys/mman.h>
#include <unistd.h>

#include <CLI/CLI.hpp>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "ckpt/client.h"
#include "client/examples/trainer_data.h"
#include "common/logging.h"
#include "common/units.h"

namespace {

using Clock = std::chrono::steady_clock;

int64_t MicrosSince(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - start).count();
}

int Fail(const std::string& what, const ckpt::Status& status) {
  std::fprintf(stderr, "ckpt_example_trainer: %s: %s\n", what.c_str(), status.ToString().c_str());
  return 1;
}

// The shared memory of the rank's shards: a memfd mapped MAP_SHARED (what the daemon maps too).
class SharedTensors {
 public:
  ~SharedTensors() {
    if (base_ != nullptr) ::munmap(base_, size_);
    if (fd_ >= 0) ::close(fd_);
  }
  ckpt::Status Create(uint64_t bytes) {
    fd_ = ::memfd_create("ckpt_example_trainer", MFD_CLOEXEC);
    if (fd_ < 0) return ckpt::ErrnoStatus(errno, "memfd_create");
    if (::ftruncate(fd_, static_cast<off_t>(bytes)) != 0) {
      return ckpt::ErrnoStatus(
          errno, "ftruncate of the tensors' memfd to " + std::to_string(bytes) + " bytes");
    }
    size_ = bytes;
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    if (p == MAP_FAILED) return ckpt::ErrnoStatus(errno, "mmap of the tensors' memfd");
    base_ = static_cast<char*>(p);
    return ckpt::Status::Ok();
  }
  int fd() const { return fd_; }
  uint32_t* At(uint64_t offset) { return reinterpret_cast<uint32_t*>(base_ + offset); }

 private:
  int fd_ = -1;
  char* base_ = nullptr;
  uint64_t size_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"A small trainer rank that checkpoints its tensors through ckptd."};
  std::string socket = "/run/ckptd/ckptd.sock";
  std::string job = "example";
  uint32_t rank = 0;
  uint32_t world_size = 1;
  uint64_t steps = 10;
  uint64_t start_step = 1;
  uint32_t tensor_count = 8;
  std::string bytes_text = "64MiB";
  uint64_t seed = 0;
  std::string wait_text = "committed";
  uint64_t kill_after = 0;
  bool quiet = false;
  std::string log_level = "warn";
  std::string connect_timeout_text = "10s";
  app.add_option("--socket", socket, "ckptd's Unix socket")->capture_default_str();
  app.add_option("--job", job, "job id")->capture_default_str();
  app.add_option("--rank", rank, "this process's rank")->capture_default_str();
  app.add_option("--world-size", world_size, "ranks in the job")->capture_default_str();
  app.add_option("--steps", steps, "steps to run")->capture_default_str();
  app.add_option("--start-step", start_step, "first step")->capture_default_str();
  app.add_option("--tensors", tensor_count, "tensors per rank")
      ->capture_default_str()
      ->check(CLI::Range(1u, 100000u));
  app.add_option("--bytes-per-rank", bytes_text, "checkpoint bytes per rank (e.g. 64MiB)")
      ->capture_default_str();
  app.add_option("--seed", seed, "seed of the tensors' contents")->capture_default_str();
  app.add_option("--wait", wait_text, "state to wait for after the last step")
      ->capture_default_str()
      ->check(CLI::IsMember({"none", "captured", "persisted", "committed"}));
  CLI::Option* kill_option = app.add_option("--kill-self-after-save", kill_after,
                                            "raise SIGKILL right after Save of this step returns");
  app.add_flag("--quiet", quiet, "no per-step lines");
  app.add_option("--log-level", log_level, "client log level (stderr)")->capture_default_str();
  app.add_option("--connect-timeout", connect_timeout_text, "how long to wait for ckptd")
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 1;
  }
  ckpt::InitLogging("ckpt_example_trainer", log_level);

  auto bytes = ckpt::ParseByteSize(bytes_text);
  if (!bytes.ok()) return Fail("--bytes-per-rank", bytes.status());
  auto connect_timeout = ckpt::ParseDuration(connect_timeout_text);
  if (!connect_timeout.ok()) return Fail("--connect-timeout", connect_timeout.status());
  const ckpt::example::TrainerLayout layout =
      ckpt::example::MakeTrainerLayout(*bytes, tensor_count, world_size);

  SharedTensors memory;
  if (ckpt::Status s = memory.Create(layout.memfd_bytes); !s.ok()) {
    return Fail("allocating the tensors", s);
  }

  ckpt::ClientOptions options;
  options.socket = socket;
  options.job = job;
  options.rank = rank;
  options.world_size = world_size;
  options.local_rank = rank;
  options.connect_timeout = *connect_timeout;
  auto connected = ckpt::Client::Connect(options);
  if (!connected.ok()) return Fail("connecting to ckptd", connected.status());
  std::unique_ptr<ckpt::Client> client = std::move(connected).value();

  std::vector<ckpt::HostTensor> specs;
  for (const ckpt::example::TrainerTensor& t : layout.tensors) {
    ckpt::HostTensor h;
    h.name = t.name;
    h.dtype = "int32";
    h.global_shape = layout.GlobalShape(t);
    h.offsets = {uint64_t{rank} * t.rows, 0};
    h.lengths = {t.rows, t.cols};
    h.fd = memory.fd();
    h.fd_offset = t.fd_offset;
    h.nbytes = t.nbytes;
    specs.push_back(std::move(h));
  }
  if (ckpt::Status s = client->Register(specs); !s.ok()) return Fail("registering tensors", s);
  if (!quiet) {
    std::printf("rank %u of %u: %u tensors, %s per rank, node %s\n", rank, world_size, tensor_count,
                ckpt::FormatBytes(layout.tensors.size() * layout.tensors[0].nbytes).c_str(),
                client->node_id().c_str());
    std::fflush(stdout);
  }

  for (uint64_t step = start_step; step < start_step + steps; ++step) {
    // Optimizer step: safe now, the previous snapshot is captured.
    for (uint32_t t = 0; t < layout.tensors.size(); ++t) {
      const auto& tensor = layout.tensors[t];
      ckpt::example::FillShard(memory.At(tensor.fd_offset), tensor.rows * tensor.cols, seed, rank,
                               step, t);
    }
    const std::string extra = "seed=" + std::to_string(seed) + " step=" + std::to_string(step) +
                              " rank=" + std::to_string(rank);
    const auto save_start = Clock::now();
    if (ckpt::Status s = client->Save(step, extra); !s.ok()) {
      return Fail("save of step " + std::to_string(step), s);
    }
    const int64_t save_us = MicrosSince(save_start);
    if (kill_option->count() > 0 && step == kill_after) {
      std::printf("step %llu saved; killing myself\n", static_cast<unsigned long long>(step));
      std::fflush(stdout);
      std::raise(SIGKILL);
    }
    // Forward/backward: reads the parameters while the daemon copies them.
    uint32_t checksum = 0;
    for (const auto& tensor : layout.tensors) {
      const uint32_t* data = memory.At(tensor.fd_offset);
      for (uint64_t i = 0; i < tensor.rows * tensor.cols; ++i) checksum = checksum * 31 + data[i];
    }
    const auto wait_start = Clock::now();
    if (ckpt::Status s = client->WaitSnapshot(); !s.ok()) {
      return Fail("wait_snapshot of step " + std::to_string(step), s);
    }
    const int64_t wait_us = MicrosSince(wait_start);
    if (!quiet) {
      std::printf("step %llu save_us %lld wait_snapshot_us %lld checksum %08x\n",
                  static_cast<unsigned long long>(step), static_cast<long long>(save_us),
                  static_cast<long long>(wait_us), checksum);
      std::fflush(stdout);
    }
  }

  if (steps > 0 && wait_text != "none") {
    const uint64_t last = start_step + steps - 1;
    const ckpt::WaitState state = wait_text == "captured"    ? ckpt::WaitState::kCaptured
                                  : wait_text == "persisted" ? ckpt::WaitState::kPersisted
                                                             : ckpt::WaitState::kCommitted;
    const auto wait_start = Clock::now();
    if (ckpt::Status s = client->Wait(last, state); !s.ok()) {
      return Fail("waiting for step " + std::to_string(last) + " to be " + wait_text, s);
    }
    if (!quiet) {
      std::printf("step %llu %s after %lld us\n", static_cast<unsigned long long>(last),
                  wait_text.c_str(), static_cast<long long>(MicrosSince(wait_start)));
      std::fflush(stdout);
    }
  }
  client->Close();
  return 0;
}
