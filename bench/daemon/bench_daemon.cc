// bench_daemon: a real ckptd, driven through the C++ client, against baselines measured in the
// same run on the same machine and directory (docs/design.md §8; bench/daemon/run.sh
// runs it with sizes for a CI machine, bench/daemon/RESULTS.md holds method and numbers).
//
// Each section starts its own ckptd from the directory of this binary (--bin), with its storage
// root under --dir (default: a fresh directory under /tmp, which must be a disk, not tmpfs), and
// stops it with SIGTERM at the end of the section. Trainer state is a memfd filled with
// incompressible bytes and touched before any clock starts.
//
//   a. save latency   Register once, then per iteration Save(step) → WaitSnapshot →
//                     Wait(committed), timing only Save. States of 64 MiB, 256 MiB, 1 GiB
//                     (4 GiB with --large) in 8 tensors, and 256 MiB in 10, 1,000, 10,000
//                     tensors (one memfd, many offsets). Baseline: an empty request (Wait on the
//                     step just committed), timed right before each Save — the socket round
//                     trip Save cannot beat, under the same load. Goal: p99 < 1 ms, flat in size.
//   b. capture        bytes / (Save → WaitSnapshot) of a 1 GiB state, pool larger than the state
//                     (no backpressure), vs one single-thread memcpy of the same bytes from the
//                     same mapping into touched memory, alternated round by round. Goal ≥ 0.8.
//   c. flush          bytes / (Save → Wait(persisted)) of a 2 GiB state vs fio writing the same
//                     size into the same directory: O_DIRECT, bs=16M, libaio, iodepth 8,
//                     end_fsync=1 (bench/storage's invocation; fio preallocates its file, as
//                     ckptd's writer does), and for information with --fallocate=none; the
//                     order alternates round by round. Goal ≥ 0.9.
//   d. training loop  ≥ 1 GiB of state in one memfd; per step a "forward/backward" of a fixed
//                     number of FMA passes over a separate buffer (--compute-buffer; 64 MiB,
//                     memory-bound, by default) calibrated to --compute-ms, the WaitSnapshot
//                     fence, an "optimizer step" (8 bytes written in every 4 KiB page of
//                     the state) and, on checkpoint steps, Save. The same
//                     loop without checkpoints and with a synchronous checkpoint (buffered pwrite
//                     of the whole state to a new file + fdatasync) are the baselines; overhead
//                     = step time / step time without checkpoints − 1. Run with a checkpoint
//                     every step and every --train-every steps.
//
// The machine is shared (CI builds run beside it), so every section also records the load
// average and how much CPU other processes used while it ran (/proc/stat minus this process and
// its children). One table at the end; --json PATH writes everything.
#include <fcntl.h>
#include <linux/magic.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "bench/common/bench_support.h"
#include "ckpt/client.h"
#include "common/checksum.h"
#include "common/units.h"

namespace ckpt::bench {
namespace {

constexpr uint64_t kPage = 4096;

std::string Millis(double s) { return Fixed(s * 1e3, s < 0.01 ? 3 : 1) + " ms"; }

// Nearest-rank percentile (p in (0, 100]): with fewer than 100 samples p99 is the maximum.
double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const auto rank = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(v.size())));
  return v[std::clamp<size_t>(rank, 1, v.size()) - 1];
}

// ---------------------------------------------------------------------------- memory

// Trainer state: a memfd mapped MAP_SHARED (what trainers hand the daemon), filled with
// incompressible bytes, so every page exists before a clock starts.
class SharedState {
 public:
  explicit SharedState(uint64_t bytes) : size_(bytes) {
    fd_ = ::memfd_create("bench_daemon_state", MFD_CLOEXEC);
    if (fd_ < 0) ThrowErrno("memfd_create");
    if (::ftruncate(fd_, static_cast<off_t>(bytes)) != 0) {
      ThrowErrno("ftruncate of the state memfd to " + FormatBytes(bytes));
    }
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    if (p == MAP_FAILED) ThrowErrno("mmap of the state memfd");
    base_ = static_cast<std::byte*>(p);
    uint64_t x = 0x9e3779b97f4a7c15ull ^ bytes;
    auto* words = reinterpret_cast<uint64_t*>(base_);
    for (uint64_t i = 0; i < bytes / 8; ++i) {  // xorshift64: cheap and incompressible
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      words[i] = x;
    }
  }
  ~SharedState() {
    ::munmap(base_, size_);
    ::close(fd_);
  }
  SharedState(const SharedState&) = delete;
  SharedState& operator=(const SharedState&) = delete;

  int fd() const { return fd_; }
  std::byte* data() const { return base_; }
  uint64_t size() const { return size_; }

  // `count` float32 tensors of equal size laid end to end from offset 0 (the remainder of the
  // state, less than one tensor plus 3 bytes, is left out).
  std::vector<HostTensor> Tensors(uint32_t count) const {
    const uint64_t numel = size_ / count / 4;
    std::vector<HostTensor> out;
    out.reserve(count);
    for (uint32_t i = 0; i < count; ++i) {
      HostTensor t;
      t.name = "layers." + std::to_string(i) + ".weight";
      t.dtype = "float32";
      t.global_shape = {numel};
      t.fd = fd_;
      t.fd_offset = uint64_t{i} * numel * 4;
      t.nbytes = numel * 4;
      out.push_back(std::move(t));
    }
    return out;
  }
  static uint64_t Bytes(const std::vector<HostTensor>& tensors) {
    uint64_t sum = 0;
    for (const auto& t : tensors) sum += t.nbytes;
    return sum;
  }

 private:
  int fd_ = -1;
  std::byte* base_ = nullptr;
  uint64_t size_;
};

// Private anonymous memory, touched (the daemon's pool is populated at start too).
class TouchedBuffer {
 public:
  explicit TouchedBuffer(uint64_t bytes) : size_(bytes) {
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) ThrowErrno("mmap of " + FormatBytes(bytes));
    base_ = static_cast<std::byte*>(p);
    std::memset(base_, 1, bytes);
  }
  ~TouchedBuffer() { ::munmap(base_, size_); }
  TouchedBuffer(const TouchedBuffer&) = delete;
  TouchedBuffer& operator=(const TouchedBuffer&) = delete;
  std::byte* data() const { return base_; }

 private:
  std::byte* base_ = nullptr;
  uint64_t size_;
};

// ---------------------------------------------------------------------------- fio

// bench/storage/run.sh's fio write: sequential, O_DIRECT, bs=16M, libaio, fsync at the end.
// Returns fio's bw_bytes of the write (its own bytes / runtime); fio.dat is removed after.
double FioWriteBytesPerSecond(const std::string& dir, uint64_t bytes, int iodepth,
                              const std::string& extra) {
  return Fio(dir, "write", bytes, iodepth, "--end_fsync=1 " + extra, /*remove_file=*/true);
}

// ---------------------------------------------------------------------------- a. save latency

struct SaveConfig {
  uint64_t bytes;
  uint32_t tensors;
};

struct LatencyStats {
  int samples = 0;
  double p50 = 0, p90 = 0, p99 = 0, max = 0;
  int over_1ms = 0;
  explicit LatencyStats(const std::vector<double>& v = {})
      : samples(static_cast<int>(v.size())),
        p50(Percentile(v, 50)),
        p90(Percentile(v, 90)),
        p99(Percentile(v, 99)),
        max(Percentile(v, 100)),
        over_1ms(static_cast<int>(
            std::count_if(v.begin(), v.end(), [](double x) { return x > 1e-3; }))) {}
  std::string Line() const {
    char buf[160];
    std::snprintf(buf, sizeof buf, "n=%3d p50 %6.3f p90 %6.3f p99 %6.3f max %6.3f ms, >1ms: %d",
                  samples, p50 * 1e3, p90 * 1e3, p99 * 1e3, max * 1e3, over_1ms);
    return buf;
  }
  void Record(Report& report, const std::string& key) const {
    report.Set(key + ".samples", samples);
    report.Set(key + ".p50_s", p50);
    report.Set(key + ".p90_s", p90);
    report.Set(key + ".p99_s", p99);
    report.Set(key + ".max_s", max);
    report.Set(key + ".over_1ms", over_1ms);
  }
};

struct SaveLatency {
  std::string label;
  uint64_t bytes = 0;
  uint32_t tensors = 0;
  double register_s = 0;
  LatencyStats save, rpc;
};

// Per iteration, right before the timed Save, the same client times an empty request (Wait on
// the step just committed, answered from the daemon's memory): the baseline, taken under the
// same load at the same moment, so that the machine's scheduling noise shows in both.
// With `idle_ms` > 0 the loop pauses that long after each commit before the next timed
// request: an experiment separating the daemon's own work right after a commit (retention,
// releasing the step) from the machine's scheduling noise (bench/README.md, save() p99).
void SaveLatencySection(const DaemonOptions& options, const std::vector<SaveConfig>& configs,
                        int max_samples, int idle_ms, Report& report) {
  std::printf(
      "\n== a. save() latency: Register once, then Save → WaitSnapshot → "
      "Wait(committed); only Save is timed; baseline: an empty request just before it\n");
  LoadProbe probe;
  Daemon daemon(options, "save", "save-root", options.host_pool, /*remove_root=*/true);
  std::vector<SaveLatency> results;
  int config_index = 0;
  for (const SaveConfig& c : configs) {
    SharedState state(c.bytes);
    const std::vector<HostTensor> tensors = state.Tensors(c.tensors);
    auto client = daemon.Connect("save-" + std::to_string(config_index++));
    const auto r0 = Clock::now();
    Require(client->Register(tensors), "register", daemon);
    SaveLatency r;
    r.register_s = SecondsSince(r0);
    r.bytes = SharedState::Bytes(tensors);
    r.tensors = c.tensors;
    r.label = FormatBytes(c.bytes) + ", " + std::to_string(c.tensors) + " tensors";
    // About 8 GiB checkpointed per configuration, at least 10 and at most max_samples saves,
    // after 2 untimed ones (the first capture also maps the memfd into the daemon).
    const int samples = static_cast<int>(
        std::clamp<uint64_t>(8 * kGiB / c.bytes, 10, static_cast<uint64_t>(max_samples)));
    std::vector<double> saves, rpcs;
    for (int i = -2; i < samples; ++i) {
      const uint64_t step = static_cast<uint64_t>(i + 3);
      if (i >= 0) {
        if (idle_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(idle_ms));
        const auto w0 = Clock::now();
        Require(client->Wait(step - 1, WaitState::kCommitted), "wait on a committed step", daemon);
        rpcs.push_back(SecondsSince(w0));
      }
      const auto t0 = Clock::now();
      Require(client->Save(step), "save of step " + std::to_string(step), daemon);
      const double s = SecondsSince(t0);
      Require(client->WaitSnapshot(), "wait_snapshot", daemon);
      Require(client->Wait(step, WaitState::kCommitted), "wait committed", daemon);
      if (i >= 0) saves.push_back(s);
    }
    r.save = LatencyStats(saves);
    r.rpc = LatencyStats(rpcs);
    std::printf("  %-24s save %s  (register %.1f ms)\n  %-24s  rpc %s\n", r.label.c_str(),
                r.save.Line().c_str(), r.register_s * 1e3, "", r.rpc.Line().c_str());
    std::fflush(stdout);
    results.push_back(r);
    client->Close();
  }
  for (const SaveLatency& r : results) {
    const std::string key =
        "save." + std::to_string(r.bytes) + "B_" + std::to_string(r.tensors) + "t";
    r.save.Record(report, key + ".save");
    r.rpc.Record(report, key + ".rpc");
    report.Set(key + ".register_s", r.register_s);
    report.AddRow({"save p99, " + r.label + " (n=" + std::to_string(r.save.samples) + ")",
                   Millis(r.save.p99), Millis(r.rpc.p99) + " rpc", r.save.p99 / r.rpc.p99, "< 1 ms",
                   r.save.p99 < 1e-3});
  }
  // Flatness: the largest state (and the most tensors) against the smallest, at the median.
  auto flat_row = [&](const SaveLatency& big, const SaveLatency& small, const std::string& what) {
    const double ratio = big.save.p50 / small.save.p50;
    report.AddRow({"save p50, " + what, Millis(big.save.p50), Millis(small.save.p50), ratio,
                   "flat: <= 1.5", ratio <= 1.5});
  };
  const SaveLatency* smallest = nullptr;
  const SaveLatency* largest = nullptr;
  const SaveLatency* fewest = nullptr;
  const SaveLatency* most = nullptr;
  for (const SaveLatency& r : results) {
    if (r.tensors == 8 && (!smallest || r.bytes < smallest->bytes)) smallest = &r;
    if (r.tensors == 8 && (!largest || r.bytes > largest->bytes)) largest = &r;
    if (r.tensors != 8 && (!fewest || r.tensors < fewest->tensors)) fewest = &r;
    if (r.tensors != 8 && (!most || r.tensors > most->tensors)) most = &r;
  }
  if (smallest && largest && smallest != largest) {
    flat_row(*largest, *smallest,
             FormatBytes(largest->bytes) + " vs " + FormatBytes(smallest->bytes));
  }
  if (fewest && most && fewest != most) {
    flat_row(*most, *fewest,
             std::to_string(most->tensors) + " vs " + std::to_string(fewest->tensors) + " tensors");
  }
  RecordLoad(report, "save", probe);
}

// ---------------------------------------------------------------------------- b. capture

void CaptureSection(const DaemonOptions& options, uint64_t bytes, int rounds, Report& report) {
  std::printf("\n== b. capture throughput: bytes / (Save → WaitSnapshot), %s state, pool %s\n",
              FormatBytes(bytes).c_str(), FormatBytes(options.host_pool).c_str());
  if (options.host_pool < bytes + 16 * kMiB) {
    throw BenchError("capture needs a pool larger than the state (--pool > --capture-size)");
  }
  LoadProbe probe;
  SharedState state(bytes);
  TouchedBuffer dst(bytes);
  Daemon daemon(options, "capture", "capture-root", options.host_pool, /*remove_root=*/true);
  auto client = daemon.Connect("capture");
  const std::vector<HostTensor> tensors = state.Tensors(8);
  const uint64_t captured_bytes = SharedState::Bytes(tensors);
  Require(client->Register(tensors), "register", daemon);

  auto capture_once = [&](uint64_t step) {
    const auto t0 = Clock::now();
    Require(client->Save(step), "save", daemon);
    Require(client->WaitSnapshot(), "wait_snapshot", daemon);
    const double s = SecondsSince(t0);
    Require(client->Wait(step, WaitState::kCommitted), "wait committed", daemon);
    return static_cast<double>(captured_bytes) / s;
  };
  // The first capture after Register also faults the state into the daemon's page tables.
  const double cold = capture_once(1);

  std::vector<double> capture, memcpy_rate, copy_hash, copy_pieces, hash_only;
  for (int r = 0; r < rounds; ++r) {
    auto t0 = Clock::now();
    std::memcpy(dst.data(), state.data(), captured_bytes);
    memcpy_rate.push_back(static_cast<double>(captured_bytes) / SecondsSince(t0));
    capture.push_back(capture_once(static_cast<uint64_t>(r) + 2));
    // Diagnostics, in this process: what one capture thread does — copies of one checksum
    // chunk (1 MiB) each, each hashed right after — and its parts.
    const uint64_t chunk = kMiB;
    uint64_t sink = 0;
    t0 = Clock::now();
    for (uint64_t off = 0; off < captured_bytes; off += chunk) {
      const uint64_t n = std::min(chunk, captured_bytes - off);
      std::memcpy(dst.data() + off, state.data() + off, n);
      sink ^= Xxh3(dst.data() + off, n);
    }
    copy_hash.push_back(static_cast<double>(captured_bytes) / SecondsSince(t0));
    t0 = Clock::now();
    for (uint64_t off = 0; off < captured_bytes; off += chunk) {
      std::memcpy(dst.data() + off, state.data() + off, std::min(chunk, captured_bytes - off));
    }
    copy_pieces.push_back(static_cast<double>(captured_bytes) / SecondsSince(t0));
    t0 = Clock::now();
    for (uint64_t off = 0; off < captured_bytes; off += chunk) {
      sink ^= Xxh3(state.data() + off, std::min(chunk, captured_bytes - off));
    }
    hash_only.push_back(static_cast<double>(captured_bytes) / SecondsSince(t0));
    if (sink == 42) std::printf(" ");  // keeps the hashes live
  }
  const double cap = Median(capture), base = Median(memcpy_rate), ch = Median(copy_hash);
  std::printf(
      "  rounds %d, medians: capture %.0f MB/s, memcpy (one call, one thread) %.0f MB/s, "
      "ratio %.2f\n",
      rounds, cap / 1e6, base / 1e6, cap / base);
  std::printf("  capture per round (MB/s):");
  for (double v : capture) std::printf(" %.0f", v / 1e6);
  std::printf("\n  memcpy per round (MB/s): ");
  for (double v : memcpy_rate) std::printf(" %.0f", v / 1e6);
  const double pieces = Median(copy_pieces), hash = Median(hash_only);
  std::printf(
      "\n  diagnostics (medians, MB/s and ratio to memcpy): 1 MiB memcpys %.0f (%.2f); "
      "XXH3 alone %.0f; 1 MiB memcpy + XXH3 of each piece, as capture does %.0f (%.2f); "
      "first capture after Register %.0f (%.2f)\n",
      pieces / 1e6, pieces / base, hash / 1e6, ch / 1e6, ch / base, cold / 1e6, cold / base);
  report.Set("capture.bytes", static_cast<double>(captured_bytes));
  report.Set("capture.bytes_per_s", cap);
  report.Set("capture.memcpy_bytes_per_s", base);
  report.Set("capture.copy_xxh3_1MiB_bytes_per_s", ch);
  report.Set("capture.copy_1MiB_bytes_per_s", pieces);
  report.Set("capture.xxh3_bytes_per_s", hash);
  report.Set("capture.cold_bytes_per_s", cold);
  report.AddRow({"capture " + FormatBytes(captured_bytes) + " (Save->WaitSnapshot)", MBps(cap),
                 MBps(base) + " memcpy", cap / base, ">= 0.8", cap / base >= 0.8});
  RecordLoad(report, "capture", probe);
}

// ---------------------------------------------------------------------------- c. flush

void FlushSection(const DaemonOptions& options, uint64_t bytes, int rounds, Report& report) {
  std::printf(
      "\n== c. end-to-end flush: bytes / (Save → Wait(persisted)), %s state, vs fio "
      "O_DIRECT bs=16M iodepth 8 in the same directory\n",
      FormatBytes(bytes).c_str());
  LoadProbe probe;
  SharedState state(bytes);
  Daemon daemon(options, "flush", "flush-root", options.host_pool, /*remove_root=*/true);
  auto client = daemon.Connect("flush");
  const std::vector<HostTensor> tensors = state.Tensors(8);
  const uint64_t total = SharedState::Bytes(tensors);
  Require(client->Register(tensors), "register", daemon);
  const std::string fio_dir = options.work_dir + "/fio";
  std::filesystem::create_directories(fio_dir);

  uint64_t step = 1;
  auto persist_once = [&] {
    const auto t0 = Clock::now();
    Require(client->Save(step), "save", daemon);
    Require(client->Wait(step, WaitState::kPersisted), "wait persisted", daemon);
    const double s = SecondsSince(t0);
    Require(client->Wait(step, WaitState::kCommitted), "wait committed", daemon);
    ++step;
    return static_cast<double>(total) / s;
  };
  persist_once();  // untimed: maps the state into the daemon

  // The order alternates round by round (the disk is virtual and shared, deletes are discarded
  // on this mount, so whoever runs first in a round may see a different disk).
  std::vector<double> ck, fio, fio_noalloc;
  for (int r = 0; r < rounds; ++r) {
    if (r % 2 == 1) ck.push_back(persist_once());
    fio.push_back(FioWriteBytesPerSecond(fio_dir, total, 8, ""));
    fio_noalloc.push_back(FioWriteBytesPerSecond(fio_dir, total, 8, "--fallocate=none"));
    if (r % 2 == 0) ck.push_back(persist_once());
    std::printf("  round %d: fio %.0f MB/s, fio --fallocate=none %.0f MB/s, ckptd %.0f MB/s\n",
                r + 1, fio.back() / 1e6, fio_noalloc.back() / 1e6, ck.back() / 1e6);
    std::fflush(stdout);
  }
  std::filesystem::remove_all(fio_dir);
  const double c = Median(ck), f = Median(fio), fn = Median(fio_noalloc);
  std::printf(
      "  medians: ckptd %.0f MB/s, fio %.0f MB/s (ratio %.2f), fio --fallocate=none "
      "%.0f MB/s (ratio %.2f)\n",
      c / 1e6, f / 1e6, c / f, fn / 1e6, c / fn);
  report.Set("flush.bytes", static_cast<double>(total));
  report.Set("flush.bytes_per_s", c);
  report.Set("flush.fio_bytes_per_s", f);
  report.Set("flush.fio_fallocate_none_bytes_per_s", fn);
  report.AddRow({"flush " + FormatBytes(total) + " (Save->persisted)", MBps(c), MBps(f) + " fio",
                 c / f, ">= 0.9", c / f >= 0.9});
  report.AddRow({"flush, vs fio --fallocate=none", MBps(c), MBps(fn) + " fio", c / fn, "(info)",
                 std::nullopt});
  RecordLoad(report, "flush", probe);
}

// ---------------------------------------------------------------------------- d. training loop

// The stand-in for forward/backward: `passes` fused multiply-adds over every float of a buffer
// (64 MiB by default), 4 per element per pass (vectorised). With the default buffer it is
// memory-bound on most machines, as real training is not, which makes it more sensitive to the
// capture's memory traffic, not less; --compute-buffer 256KiB keeps it in cache (compute-bound,
// closer to a trainer whose forward/backward runs on a GPU or in cache-blocked kernels).
class Compute {
 public:
  explicit Compute(uint64_t buffer_bytes)
      : data_(std::max<uint64_t>(buffer_bytes / 4, 1024), 1.0f) {}
  void Pass() {
    float* x = data_.data();
    const size_t n = data_.size();
    for (size_t i = 0; i < n; ++i) {
      float v = x[i];
      v = v * 0.999f + 0.001f;
      v = v * 0.999f + 0.001f;
      v = v * 0.999f + 0.001f;
      v = v * 0.999f + 0.001f;
      x[i] = v;
    }
  }
  void Run(int passes) {
    for (int i = 0; i < passes; ++i) Pass();
  }
  // The number of passes that takes about `target` seconds here, now.
  int Calibrate(double target) {
    Pass();
    const auto t0 = Clock::now();
    int passes = 0;
    while (SecondsSince(t0) < 0.3) {
      Pass();
      ++passes;
    }
    const double per_pass = SecondsSince(t0) / passes;
    return std::max(1, static_cast<int>(std::lround(target / per_pass)));
  }
  float checksum() const { return data_[12345]; }

 private:
  std::vector<float> data_;
};

// CPU time of the calling thread: unlike the wall clock, it does not grow while other processes
// hold the core, so compute wall time minus this is time spent waiting for a CPU.
double ThreadCpuSeconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

// 8 bytes written in every 4 KiB page of the state: the optimizer step's footprint.
void OptimizerStep(SharedState& state, uint64_t step) {
  std::byte* base = state.data();
  for (uint64_t off = (step % 8) * 8; off + 8 <= state.size(); off += kPage) {
    uint64_t v;
    std::memcpy(&v, base + off, 8);
    v += step;
    std::memcpy(base + off, &v, 8);
  }
}

// The synchronous baseline: the whole state into a new file with buffered pwrites of 16 MiB,
// fdatasync, close, and the previous checkpoint file removed (keep = 1, as the daemon runs).
void SyncCheckpoint(const SharedState& state, const std::string& dir, uint64_t step) {
  const std::string path = dir + "/state-" + std::to_string(step) + ".bin";
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) ThrowErrno("open " + path);
  for (uint64_t off = 0; off < state.size();) {
    const size_t n = std::min<uint64_t>(16 * kMiB, state.size() - off);
    const ssize_t w = ::pwrite(fd, state.data() + off, n, static_cast<off_t>(off));
    if (w <= 0) ThrowErrno("pwrite " + path);
    off += static_cast<uint64_t>(w);
  }
  if (::fdatasync(fd) != 0) ThrowErrno("fdatasync " + path);
  ::close(fd);
  if (step > 0) std::filesystem::remove(dir + "/state-" + std::to_string(step - 1) + ".bin");
}

enum class Checkpointer { kNone, kCkptd, kSync };

struct LoopResult {
  double step_s = 0;         // mean step time over the timed steps
  double compute_s = 0;      // mean time of the compute pass per step
  double compute_cpu_s = 0;  // its CPU time (this thread's): compute_s minus time off the CPU
  double optimizer_s = 0;    // mean time of the optimizer step per step
  double stall_s = 0;        // ckptd: total time in WaitSnapshot; sync: total time writing
  double save_s = 0;         // ckptd: total time in Save
  double save_max_s = 0;     // ckptd: the longest Save
  double daemon_cpu_s = 0;   // CPU the daemon used during the run
  int checkpoints = 0;
};

void TrainingSection(const DaemonOptions& options, uint64_t bytes, uint32_t tensors,
                     uint64_t compute_buffer, double compute_s, int steps, int every,
                     Report& report) {
  std::printf(
      "\n== d. synthetic training loop: %s state in %u tensors, compute ~%.0f ms/step; "
      "checkpoint every step and every %d steps, vs no checkpoint and a synchronous "
      "save\n",
      FormatBytes(bytes).c_str(), tensors, compute_s * 1e3, every);
  LoadProbe probe;
  SharedState state(bytes);
  Compute compute(compute_buffer);
  const int passes = compute.Calibrate(compute_s);
  Daemon daemon(options, "train", "train-root", options.host_pool, /*remove_root=*/true);
  auto client = daemon.Connect("train");
  Require(client->Register(state.Tensors(tensors)), "register", daemon);
  const std::string sync_dir = options.work_dir + "/sync";
  std::filesystem::create_directories(sync_dir);
  uint64_t ckpt_step = 0;
  {  // untimed: the first capture maps the state into the daemon
    Require(client->Save(++ckpt_step), "save", daemon);
    Require(client->WaitSnapshot(), "wait_snapshot", daemon);
    Require(client->Wait(ckpt_step, WaitState::kCommitted), "wait committed", daemon);
  }
  uint64_t sync_step = 0;

  auto run = [&](Checkpointer kind, int interval, int count) {
    LoopResult r;
    bool pending = false;
    const double cpu0 = daemon.CpuSeconds();
    // One untimed step warms caches; then `count` timed ones. Checkpoints are taken after the
    // optimizer step of steps 0, interval, 2·interval, ... so that each has `interval` steps of
    // compute to hide behind; the fence after the loop (the next optimizer step's) is timed.
    compute.Run(passes);
    OptimizerStep(state, 0);
    const auto t0 = Clock::now();
    for (int i = 0; i < count; ++i) {
      const auto c0 = Clock::now();
      const double cpu_c0 = ThreadCpuSeconds();
      compute.Run(passes);  // forward/backward: reads parameters, may overlap the capture
      r.compute_s += SecondsSince(c0);
      r.compute_cpu_s += ThreadCpuSeconds() - cpu_c0;
      if (pending) {
        const auto w0 = Clock::now();
        Require(client->WaitSnapshot(), "wait_snapshot", daemon);
        r.stall_s += SecondsSince(w0);
        pending = false;
      }
      const auto o0 = Clock::now();
      OptimizerStep(state, static_cast<uint64_t>(i) + 1);
      r.optimizer_s += SecondsSince(o0);
      if (kind != Checkpointer::kNone && i % interval == 0) {
        ++r.checkpoints;
        const auto s0 = Clock::now();
        if (kind == Checkpointer::kCkptd) {
          Require(client->Save(++ckpt_step), "save", daemon);
          r.save_s += SecondsSince(s0);
          r.save_max_s = std::max(r.save_max_s, SecondsSince(s0));
          pending = true;
        } else {
          SyncCheckpoint(state, sync_dir, ++sync_step);
          r.stall_s += SecondsSince(s0);
        }
      }
    }
    if (pending) {
      const auto w0 = Clock::now();
      Require(client->WaitSnapshot(), "wait_snapshot", daemon);
      r.stall_s += SecondsSince(w0);
    }
    r.step_s = SecondsSince(t0) / count;
    r.compute_s /= count;
    r.compute_cpu_s /= count;
    r.optimizer_s /= count;
    r.daemon_cpu_s = daemon.CpuSeconds() - cpu0;  // before the drain below: what overlapped
    if (kind == Checkpointer::kCkptd) {
      Require(client->Wait(ckpt_step, WaitState::kCommitted), "wait committed", daemon);
    }
    return r;
  };

  // Every step checkpointed: `steps` steps; every `every` steps: at least 3 checkpoints.
  const int paced_steps = std::max(steps, 3 * every);
  const LoopResult none1 = run(Checkpointer::kNone, 1, paced_steps);
  std::printf(
      "  no checkpoint: %.1f ms/step (compute: %d passes over %s, %.1f ms, of which on "
      "the CPU %.1f; optimizer step %.1f ms)\n",
      none1.step_s * 1e3, passes, FormatBytes(compute_buffer).c_str(), none1.compute_s * 1e3,
      none1.compute_cpu_s * 1e3, none1.optimizer_s * 1e3);
  std::fflush(stdout);
  struct Variant {
    int interval;
    LoopResult ckptd, sync;
  };
  std::vector<Variant> variants;
  for (int interval : {1, every}) {
    if (!variants.empty() && interval == variants.back().interval) continue;
    const int n = interval == 1 ? steps : paced_steps;
    Variant v{interval, run(Checkpointer::kCkptd, interval, n),
              run(Checkpointer::kSync, interval, n)};
    std::printf(
        "  every %d, %d steps, %d checkpoints:\n"
        "    ckptd %.1f ms/step (compute %.1f ms of which on the CPU %.1f, optimizer %.1f ms; per "
        "checkpoint: Save "
        "%.2f ms (max %.2f), WaitSnapshot %.1f ms, daemon CPU %.0f ms)\n"
        "    sync  %.1f ms/step (compute %.1f ms, optimizer %.1f ms; per checkpoint: "
        "writing %.0f ms)\n",
        interval, n, v.ckptd.checkpoints, v.ckptd.step_s * 1e3, v.ckptd.compute_s * 1e3,
        v.ckptd.compute_cpu_s * 1e3, v.ckptd.optimizer_s * 1e3,
        v.ckptd.save_s * 1e3 / v.ckptd.checkpoints, v.ckptd.save_max_s * 1e3,
        v.ckptd.stall_s * 1e3 / v.ckptd.checkpoints,
        v.ckptd.daemon_cpu_s * 1e3 / v.ckptd.checkpoints, v.sync.step_s * 1e3,
        v.sync.compute_s * 1e3, v.sync.optimizer_s * 1e3,
        v.sync.stall_s * 1e3 / v.sync.checkpoints);
    std::fflush(stdout);
    variants.push_back(v);
  }
  const LoopResult none2 = run(Checkpointer::kNone, 1, paced_steps);
  std::filesystem::remove_all(sync_dir);
  const double none = (none1.step_s + none2.step_s) / 2;
  std::printf(
      "  no checkpoint again: %.1f ms/step (compute %.1f ms); baseline = mean %.1f "
      "ms/step (the two differ by %.1f%%: the machine's noise)\n",
      none2.step_s * 1e3, none2.compute_s * 1e3, none * 1e3,
      100 * std::abs(none1.step_s - none2.step_s) / none);
  report.Set("train.bytes", static_cast<double>(bytes));
  report.Set("train.compute_passes", passes);
  report.Set("train.compute_buffer_bytes", static_cast<double>(compute_buffer));
  report.Set("train.none_step_s", none);
  report.Set("train.none_step_s_first", none1.step_s);
  report.Set("train.none_step_s_last", none2.step_s);
  report.Set("train.none_compute_s", (none1.compute_s + none2.compute_s) / 2);
  report.Set("train.none_compute_cpu_s", (none1.compute_cpu_s + none2.compute_cpu_s) / 2);
  for (const Variant& v : variants) {
    const std::string key = "train.every" + std::to_string(v.interval);
    const double ck_over = v.ckptd.step_s / none - 1, sync_over = v.sync.step_s / none - 1;
    std::printf("  every %d: overhead ckptd %+.1f%%, sync %+.1f%%\n", v.interval, ck_over * 100,
                sync_over * 100);
    report.Set(key + ".ckptd_step_s", v.ckptd.step_s);
    report.Set(key + ".ckptd_wait_snapshot_s", v.ckptd.stall_s);
    report.Set(key + ".ckptd_save_s", v.ckptd.save_s);
    report.Set(key + ".ckptd_save_max_s", v.ckptd.save_max_s);
    report.Set(key + ".ckptd_compute_s", v.ckptd.compute_s);
    report.Set(key + ".ckptd_compute_cpu_s", v.ckptd.compute_cpu_s);
    report.Set(key + ".ckptd_daemon_cpu_s", v.ckptd.daemon_cpu_s);
    report.Set(key + ".checkpoints", v.ckptd.checkpoints);
    report.Set(key + ".sync_step_s", v.sync.step_s);
    report.Set(key + ".ckptd_overhead", ck_over);
    report.Set(key + ".sync_overhead", sync_over);
    const std::string label =
        "train step overhead, ckpt every " +
        (v.interval == 1 ? std::string("step") : std::to_string(v.interval) + " steps");
    // Ratio: the checkpoint's cost to the step under ckptd vs under the synchronous save.
    const double ratio = sync_over > 0 ? std::max(0.0, ck_over) / sync_over : 0;
    if (v.interval == 1) {
      report.AddRow({label, Fixed(ck_over * 100, 1) + " %", Fixed(sync_over * 100, 1) + " % sync",
                     ratio, "< sync", ck_over < sync_over});
    } else {
      report.AddRow({label, Fixed(ck_over * 100, 1) + " %", Fixed(sync_over * 100, 1) + " % sync",
                     ratio, "<= 10 %", ck_over <= 0.10});
    }
  }
  if (compute.checksum() == 42.0f) std::printf(" ");  // keeps the compute live
  RecordLoad(report, "train", probe);
}

// ---------------------------------------------------------------------------- main

struct Args {
  std::string dir = "/tmp";
  std::string bin;
  std::string json;
  std::string pool = "2GiB";
  std::string capture_size = "1GiB";
  std::string flush_size = "2GiB";
  std::string train_size = "1GiB";
  int save_samples = 100;
  int save_idle_ms = 0;
  int rounds = 5;
  int flush_rounds = 4;
  double compute_ms = 200;
  std::string compute_buffer = "64MiB";
  int train_steps = 8;
  int train_every = 4;
  uint32_t train_tensors = 8;
  bool large = false;
  std::vector<std::string> save_configs;
  bool keep = false;
  std::vector<std::string> sections = {"save", "capture", "flush", "train"};
  DaemonOptions daemon;
};

int Run(Args& args) {
  auto bytes = [](const std::string& flag, const std::string& text) {
    auto v = ParseByteSize(text);
    if (!v.ok() || *v == 0) throw BenchError(flag + ": cannot parse '" + text + "'");
    return *v;
  };
  args.daemon.host_pool = bytes("--pool", args.pool);
  const uint64_t capture_size = bytes("--capture-size", args.capture_size);
  const uint64_t flush_size = bytes("--flush-size", args.flush_size);
  const uint64_t train_size = bytes("--train-size", args.train_size);
  args.daemon.bin_dir = args.bin.empty()
                            ? std::filesystem::read_symlink("/proc/self/exe").parent_path().string()
                            : args.bin;
  if (!std::filesystem::exists(args.daemon.bin_dir + "/ckptd")) {
    throw BenchError("no ckptd in " + args.daemon.bin_dir + " (build the ckptd target, or --bin)");
  }
  std::string tmpl = args.dir + "/ckpt-bench-daemon.XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) ThrowErrno("mkdtemp in " + args.dir);
  args.daemon.work_dir = tmpl;
  struct Cleanup {
    std::string dir;
    bool keep;
    ~Cleanup() {
      std::error_code ec;
      if (!keep) std::filesystem::remove_all(dir, ec);
    }
  } cleanup{tmpl, args.keep};

  Report report(/*large_ratio_digits=*/0);
  const std::string fs = FilesystemOf(args.daemon.work_dir);
  const unsigned cores = std::thread::hardware_concurrency();
  std::printf("bench_daemon: %s, %u cores, work dir %s (%s), ckptd from %s\n", Today().c_str(),
              cores, args.daemon.work_dir.c_str(), fs.c_str(), args.daemon.bin_dir.c_str());
  std::printf(
      "ckptd: --host-pool %s --slot-size %s --checksum-chunk %s --capture-threads %d "
      "--flush-threads %d; load average at start %s\n",
      FormatBytes(args.daemon.host_pool).c_str(), args.daemon.slot_size.c_str(),
      args.daemon.checksum_chunk.c_str(), args.daemon.capture_threads, args.daemon.flush_threads,
      LoadProbe::LoadAverage().c_str());
  if (fs == "tmpfs") {
    std::printf("WARNING: %s is tmpfs: no O_DIRECT, no disk; flush numbers mean nothing\n",
                args.dir.c_str());
  }
  report.SetText("date", Today());
  report.SetText("work_dir_filesystem", fs);
  report.Set("cores", cores);
  report.Set("host_pool_bytes", static_cast<double>(args.daemon.host_pool));
  report.SetText("slot_size", args.daemon.slot_size);
  report.Set("capture_threads", args.daemon.capture_threads);
  report.Set("flush_threads", args.daemon.flush_threads);
  report.SetText("loadavg_start", LoadProbe::LoadAverage());
  std::fflush(stdout);

  LoadProbe whole;
  const auto t0 = Clock::now();
  auto wanted = [&](const std::string& s) {
    return std::find(args.sections.begin(), args.sections.end(), s) != args.sections.end();
  };
  if (wanted("save")) {
    std::vector<SaveConfig> configs = {{64 * kMiB, 8}, {256 * kMiB, 8}, {1 * kGiB, 8}};
    if (args.large) configs.push_back({4 * kGiB, 8});
    for (uint32_t n : {10u, 1000u, 10000u}) configs.push_back({256 * kMiB, n});
    if (!args.save_configs.empty()) {
      configs.clear();
      for (const std::string& c : args.save_configs) {  // SIZE:TENSORS
        const size_t colon = c.find(':');
        const uint64_t n =
            colon == std::string::npos ? 0 : std::strtoull(c.c_str() + colon + 1, nullptr, 10);
        if (n == 0 || n > 1'000'000) throw BenchError("--save-configs: '" + c + "' is not SIZE:N");
        configs.push_back({bytes("--save-configs", c.substr(0, colon)), static_cast<uint32_t>(n)});
      }
    }
    SaveLatencySection(args.daemon, configs, args.save_samples, args.save_idle_ms, report);
  }
  if (wanted("capture")) CaptureSection(args.daemon, capture_size, args.rounds, report);
  if (wanted("flush")) FlushSection(args.daemon, flush_size, args.flush_rounds, report);
  if (wanted("train")) {
    TrainingSection(args.daemon, train_size, args.train_tensors,
                    bytes("--compute-buffer", args.compute_buffer), args.compute_ms / 1e3,
                    args.train_steps, args.train_every, report);
  }
  const double total_s = SecondsSince(t0);
  const double others = whole.OthersCores();
  report.Set("total_seconds", total_s);
  report.Set("others_cpu_cores", others);
  report.SetText("loadavg_end", LoadProbe::LoadAverage());

  std::printf(
      "\n== summary (%.0f s; other processes used %.2f of %u cores on average; load "
      "average at end %s)\n\n",
      total_s, others, cores, LoadProbe::LoadAverage().c_str());
  report.PrintTable();
  report.WriteJson(args.json);
  return 0;
}

}  // namespace
}  // namespace ckpt::bench

int main(int argc, char** argv) {
  ckpt::bench::Args args;
  CLI::App app{
      "bench_daemon: a real ckptd against same-run baselines (memcpy, fio, a loop "
      "without checkpoints, a synchronous save)"};
  app.add_option("--dir", args.dir, "a fresh work directory is made here (a disk, not tmpfs)")
      ->capture_default_str();
  app.add_option("--bin", args.bin, "directory holding ckptd (default: this binary's)");
  app.add_option("--json", args.json, "write the results as JSON here");
  app.add_option("--sections", args.sections, "which of save, capture, flush, train to run")
      ->capture_default_str()
      ->check(CLI::IsMember({"save", "capture", "flush", "train"}));
  app.add_option("--pool", args.pool, "ckptd --host-pool for every section")->capture_default_str();
  app.add_option("--slot-size", args.daemon.slot_size, "ckptd --slot-size")->capture_default_str();
  app.add_option("--checksum-chunk", args.daemon.checksum_chunk, "ckptd --checksum-chunk")
      ->capture_default_str();
  app.add_option("--capture-threads", args.daemon.capture_threads, "ckptd --capture-threads")
      ->capture_default_str();
  app.add_option("--flush-threads", args.daemon.flush_threads, "ckptd --flush-threads")
      ->capture_default_str();
  app.add_option("--save-samples", args.save_samples,
                 "a: most timed saves per configuration (about 8 GiB worth, at least 10)")
      ->capture_default_str()
      ->check(CLI::Range(10, 100000));
  app.add_option("--save-idle-ms", args.save_idle_ms,
                 "a: experiment: idle this long after each commit before the next timed request")
      ->capture_default_str()
      ->check(CLI::Range(0, 10000));
  app.add_flag("--large", args.large, "a: also a 4 GiB state");
  app.add_option("--save-configs", args.save_configs,
                 "a: instead of the default states, these SIZE:TENSORS (e.g. 256MiB:10000)");
  app.add_option("--capture-size", args.capture_size, "b: state size")->capture_default_str();
  app.add_option("--rounds", args.rounds, "b: rounds (median)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  app.add_option("--flush-size", args.flush_size, "c: state size")->capture_default_str();
  app.add_option("--flush-rounds", args.flush_rounds, "c: rounds (median)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  app.add_option("--train-size", args.train_size, "d: state size")->capture_default_str();
  app.add_option("--train-tensors", args.train_tensors, "d: tensors the state is cut into")
      ->capture_default_str()
      ->check(CLI::Range(1u, 1'000'000u));
  app.add_option("--compute-buffer", args.compute_buffer,
                 "d: the compute stand-in's buffer (64MiB: memory-bound; 256KiB: in cache)")
      ->capture_default_str();
  app.add_option("--compute-ms", args.compute_ms, "d: target compute time per step")
      ->capture_default_str()
      ->check(CLI::Range(1.0, 100000.0));
  app.add_option("--train-steps", args.train_steps, "d: timed steps per run")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  app.add_option("--train-every", args.train_every, "d: the second run's checkpoint interval")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  app.add_option("--ckptd-arg", args.daemon.extra_args,
                 "extra ckptd argument, repeatable (e.g. --ckptd-arg=--capture-throttle=1GiB)");
  app.add_flag("--keep", args.keep, "keep the work directory (daemon logs)");
  // A repeated scalar flag takes its last value, so run.sh's defaults can be overridden.
  for (CLI::Option* option : app.get_options()) {
    if (option->get_items_expected_max() == 1) {
      option->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    }
  }
  CLI11_PARSE(app, argc, argv);
  try {
    return ckpt::bench::Run(args);
  } catch (const ckpt::bench::BenchError& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "bench_daemon: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "bench_daemon: %s\n", e.what());
    return 1;
  }
}
