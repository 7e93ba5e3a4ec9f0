// bench_load: loads through a real ckptd, driven by the C++ client, against baselines measured in
// the same run on the same machine and directory (docs/design.md §8; bench/load/run.sh
// runs it with sizes for a CI machine, bench/load/RESULTS.md holds method and numbers).
//
// The state: --tensors float32 global tensors of shape [rows, --cols] (--size bytes in all),
// row-sharded over --ranks ranks (4 × 512 MiB by default), each rank's shards laid end to end in
// one memfd of incompressible bytes. A ckptd started from this binary's directory (--bin) with its
// storage root under a fresh work directory in --dir (a disk, not tmpfs) saves it as step 1 (all
// ranks Save → WaitSnapshot, then Wait(committed)). Then:
//
//   b. hot restore  right after the save, the daemon still up: the same ranks load step 1 (the
//                   same layout) — served from the daemon's memory. Baseline: the cold load (a).
//                   Goal: speed-up ≥ 5×. Also, for information, the resharded layouts hot.
//   a. cold load    per round: ckptd stopped (SIGTERM) and started again on the same root, the
//                   page cache dropped (echo 3 > /proc/sys/vm/drop_caches; said when refused —
//                   ckptd reads with O_DIRECT anyway), then the same layout loaded: bytes / time.
//                   Baseline: fio O_DIRECT sequential read of a file of the same size in the same
//                   work directory (bench/storage's invocation: bs=16M, libaio, iodepth 4 and 8,
//                   the better of the two), run in the same round. Goal ≥ 0.9.
//   c. resharded    in the same rounds, each after its own restart and cache drop: step 1 loaded
//                   by 3 ranks each holding a column slice of every tensor, and by 1 rank holding
//                   every tensor whole. Baseline: the same-layout cold load. Goal ≥ 0.8.
//
// Every load is timed as the trainers see it: all ranks' Load calls start together (one thread
// per rank, each its own Client connection), the clock stops when the last returns. Each load
// goes into fresh memory (a new memfd per rank, touched, registered by new connections, as a
// restarted trainer's would be); registration is timed apart and printed. After every load the
// destination is compared with the saved bytes (outside the clock), and bytes_from_memory /
// bytes_from_storage are checked: a hot load must read nothing from storage, a cold one must start
// with nothing in memory. Medians over --rounds rounds. One table at the end; --json PATH writes
// everything.
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
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "bench/common/bench_support.h"
#include "ckpt/client.h"
#include "common/units.h"

namespace ckpt::bench {
namespace {

constexpr uint64_t kElement = 4;  // float32
constexpr uint64_t kStep = 1;
constexpr const char* kJob = "bench-load";

// "median (min-max) MB/s" of byte rates.
std::string Spread(const std::vector<double>& v) {
  if (v.empty()) return "-";
  const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
  return Fixed(Median(v) / 1e6, 0) + " (" + Fixed(*lo / 1e6, 0) + "-" + Fixed(*hi / 1e6, 0) +
         ") MB/s";
}

// ---------------------------------------------------------------------------- memory

// A memfd mapped MAP_SHARED (what trainers hand the daemon), every page touched.
class SharedMemory {
 public:
  explicit SharedMemory(uint64_t bytes, const char* name) : size_(bytes) {
    fd_ = ::memfd_create(name, MFD_CLOEXEC);
    if (fd_ < 0) ThrowErrno("memfd_create");
    if (::ftruncate(fd_, static_cast<off_t>(bytes)) != 0) {
      ThrowErrno("ftruncate of a memfd to " + FormatBytes(bytes));
    }
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    if (p == MAP_FAILED) ThrowErrno("mmap of a memfd of " + FormatBytes(bytes));
    base_ = static_cast<std::byte*>(p);
  }
  ~SharedMemory() {
    ::munmap(base_, size_);
    ::close(fd_);
  }
  SharedMemory(const SharedMemory&) = delete;
  SharedMemory& operator=(const SharedMemory&) = delete;

  // xorshift64: cheap and incompressible.
  void FillRandom(uint64_t seed) {
    uint64_t x = 0x9e3779b97f4a7c15ull ^ seed;
    auto* words = reinterpret_cast<uint64_t*>(base_);
    for (uint64_t i = 0; i < size_ / 8; ++i) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      words[i] = x;
    }
  }
  void Fill(int byte) { std::memset(base_, byte, size_); }

  int fd() const { return fd_; }
  std::byte* data() const { return base_; }
  uint64_t size() const { return size_; }

 private:
  int fd_ = -1;
  std::byte* base_ = nullptr;
  uint64_t size_;
};

// ---------------------------------------------------------------------------- the state

// Global tensors t = 0..count-1, float32 [rows, cols].
struct Model {
  uint32_t tensors = 4;
  uint64_t rows = 0;
  uint64_t cols = 0;
  uint32_t save_ranks = 4;

  uint64_t tensor_bytes() const { return rows * cols * kElement; }
  uint64_t total_bytes() const { return tensor_bytes() * tensors; }
  uint64_t rows_per_rank() const { return rows / save_ranks; }
  std::string name(uint32_t t) const { return "layers." + std::to_string(t) + ".mlp.weight"; }
};

// One rank's part of one tensor: rows [row0, row0 + nrows) × cols [col0, col0 + ncols), stored
// row-major at byte `offset` of that rank's memory.
struct Box {
  uint32_t tensor;
  uint64_t row0, nrows, col0, ncols;
  uint64_t offset;
  uint64_t bytes() const { return nrows * ncols * kElement; }
};

// A parallel layout: per rank, its boxes of every tensor, laid end to end in the rank's own
// memory (one memfd per rank, as separate trainer processes have).
struct Layout {
  std::string name;
  std::vector<std::vector<Box>> ranks;
  std::vector<uint64_t> rank_bytes;
  uint64_t bytes = 0;  // all ranks
};

using RankMemory = std::vector<std::unique_ptr<SharedMemory>>;

// Fresh memory for every rank of `l`, every page touched.
RankMemory Allocate(const Layout& l, const char* name) {
  RankMemory out;
  for (uint64_t bytes : l.rank_bytes) out.push_back(std::make_unique<SharedMemory>(bytes, name));
  return out;
}

Layout MakeLayout(const Model& m, const std::string& name, uint32_t ranks, bool by_rows) {
  Layout l;
  l.name = name;
  l.ranks.resize(ranks);
  l.rank_bytes.assign(ranks, 0);
  const uint64_t along = by_rows ? m.rows : m.cols;
  for (uint32_t r = 0; r < ranks; ++r) {
    // Near-equal splits: the first (along % ranks) ranks get one more.
    const uint64_t base = along / ranks, extra = along % ranks;
    const uint64_t begin = r * base + std::min<uint64_t>(r, extra);
    const uint64_t n = base + (r < extra ? 1 : 0);
    for (uint32_t t = 0; t < m.tensors; ++t) {
      const uint64_t at = l.rank_bytes[r];
      Box b = by_rows ? Box{t, begin, n, 0, m.cols, at} : Box{t, 0, m.rows, begin, n, at};
      l.rank_bytes[r] += b.bytes();
      l.bytes += b.bytes();
      l.ranks[r].push_back(b);
    }
  }
  return l;
}

std::vector<HostTensor> TensorsOf(const Model& m, const Layout& l, uint32_t rank, int fd) {
  std::vector<HostTensor> out;
  for (const Box& b : l.ranks[rank]) {
    HostTensor t;
    t.name = m.name(b.tensor);
    t.dtype = "float32";
    t.global_shape = {m.rows, m.cols};
    if (b.nrows != m.rows || b.ncols != m.cols) {  // else: the whole tensor
      t.offsets = {b.row0, b.col0};
      t.lengths = {b.nrows, b.ncols};
    }
    t.fd = fd;
    t.fd_offset = b.offset;
    t.nbytes = b.bytes();
    out.push_back(std::move(t));
  }
  return out;
}

// Compares `dst` (holding layout `l`) with the saved bytes `src` (holding layout `saved`, rows).
void Verify(const Model& m, const Layout& saved, const RankMemory& src, const Layout& l,
            const RankMemory& dst) {
  auto source_row = [&](uint32_t t, uint64_t row) {
    const uint64_t rank = row / m.rows_per_rank();
    const Box& b = saved.ranks[rank][t];
    return src[rank]->data() + b.offset + (row - b.row0) * m.cols * kElement;
  };
  for (uint32_t r = 0; r < l.ranks.size(); ++r) {
    for (const Box& b : l.ranks[r]) {
      const uint64_t n = b.ncols * kElement;
      for (uint64_t row = b.row0; row < b.row0 + b.nrows; ++row) {
        const std::byte* got = dst[r]->data() + b.offset + (row - b.row0) * n;
        if (std::memcmp(got, source_row(b.tensor, row) + b.col0 * kElement, n) != 0) {
          throw BenchError("load '" + l.name + "': rank " + std::to_string(r) + " tensor " +
                           m.name(b.tensor) + " row " + std::to_string(row) +
                           " differs from the saved bytes");
        }
      }
    }
  }
}

// Drops the page cache (root only). Returns false when refused.
bool DropCaches() {
  ::sync();
  const int fd = ::open("/proc/sys/vm/drop_caches", O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = ::write(fd, "3\n", 2) == 2;
  ::close(fd);
  return ok;
}

// ---------------------------------------------------------------------------- loads

struct LoadRun {
  double seconds = 0;        // first Load sent → last Load returned
  double register_s = 0;     // registering all ranks, one after the other
  uint64_t bytes = 0;        // the layout's bytes (what the ranks asked for)
  uint64_t from_memory = 0;  // sums over ranks of LoadResult
  uint64_t from_storage = 0;
  double daemon_user_s = 0;  // daemon CPU during the load
  double daemon_system_s = 0;
  uint64_t daemon_minor_faults = 0;
  double rate() const { return static_cast<double>(bytes) / seconds; }
};

// Loads step 1 into fresh memory of layout `l`, all ranks at once, and checks the bytes.
LoadRun LoadOnce(Daemon& daemon, const Model& m, const Layout& saved, const RankMemory& src,
                 const Layout& l) {
  const RankMemory dst = Allocate(l, "bench_load_dst");
  for (const auto& d : dst) d->Fill(0xee);  // touched: a trainer's tensors exist already
  const auto nranks = static_cast<uint32_t>(l.ranks.size());
  LoadRun run;
  run.bytes = l.bytes;
  std::vector<std::unique_ptr<Client>> clients;
  for (uint32_t r = 0; r < nranks; ++r) clients.push_back(daemon.Connect(kJob, r, nranks));
  const auto r0 = Clock::now();
  for (uint32_t r = 0; r < nranks; ++r) {
    Require(clients[r]->Register(TensorsOf(m, l, r, dst[r]->fd())), "register", daemon);
  }
  run.register_s = SecondsSince(r0);

  std::mutex mu;
  std::condition_variable cv;
  bool go = false;
  std::vector<Result<LoadResult>> results(nranks, Status::Ok());
  std::vector<Clock::time_point> ends(nranks);
  std::vector<std::thread> threads;
  for (uint32_t r = 0; r < nranks; ++r) {
    threads.emplace_back([&, r] {
      {
        std::unique_lock lock(mu);
        cv.wait(lock, [&] { return go; });
      }
      results[r] = clients[r]->Load(kStep);
      ends[r] = Clock::now();
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // let the threads reach the wait
  const Daemon::Usage usage0 = daemon.CpuUsage();
  const auto t0 = Clock::now();
  {
    std::lock_guard lock(mu);
    go = true;
  }
  cv.notify_all();
  for (auto& t : threads) t.join();
  run.seconds = Seconds(*std::max_element(ends.begin(), ends.end()) - t0);
  const Daemon::Usage usage1 = daemon.CpuUsage();
  run.daemon_user_s = usage1.user_s - usage0.user_s;
  run.daemon_system_s = usage1.system_s - usage0.system_s;
  run.daemon_minor_faults = usage1.minor_faults - usage0.minor_faults;
  for (uint32_t r = 0; r < nranks; ++r) {
    Require(results[r].status(), "load of rank " + std::to_string(r) + " (" + l.name + ")", daemon);
    run.from_memory += results[r]->bytes_from_memory;
    run.from_storage += results[r]->bytes_from_storage;
  }
  for (auto& c : clients) c->Close();
  Verify(m, saved, src, l, dst);
  return run;
}

std::string Describe(const LoadRun& r) {
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "%6.0f MB/s (%.2f s; from memory %s, from storage %s; register %.0f ms; "
                "daemon CPU user %.2f + sys %.2f s, %.0fk minor faults)",
                r.rate() / 1e6, r.seconds, FormatBytes(r.from_memory).c_str(),
                FormatBytes(r.from_storage).c_str(), r.register_s * 1e3, r.daemon_user_s,
                r.daemon_system_s, static_cast<double>(r.daemon_minor_faults) / 1e3);
  return buf;
}

// ---------------------------------------------------------------------------- main

struct Args {
  std::string dir = "/tmp";
  std::string bin;
  std::string json;
  std::string size = "2GiB";
  std::string pool;  // default: size + 512 MiB
  uint32_t tensors = 4;
  uint64_t cols = 8192;
  uint32_t ranks = 4;
  uint32_t reshard_ranks = 3;
  int rounds = 3;
  int hot_rounds = 3;
  bool keep = false;
  DaemonOptions daemon;
};

int Run(Args& args) {
  auto bytes = [](const std::string& flag, const std::string& text) {
    auto v = ParseByteSize(text);
    if (!v.ok() || *v == 0) throw BenchError(flag + ": cannot parse '" + text + "'");
    return *v;
  };
  Model m;
  m.tensors = args.tensors;
  m.cols = args.cols;
  m.save_ranks = args.ranks;
  const uint64_t size = bytes("--size", args.size);
  // Rows: a multiple of the saving ranks, so that every rank holds the same number.
  m.rows = size / (uint64_t{m.tensors} * m.cols * kElement) / m.save_ranks * m.save_ranks;
  if (m.rows == 0) throw BenchError("--size too small for --tensors × --cols × --ranks");
  args.daemon.host_pool =
      args.pool.empty() ? m.total_bytes() + 512 * kMiB : bytes("--pool", args.pool);
  args.daemon.bin_dir = args.bin.empty()
                            ? std::filesystem::read_symlink("/proc/self/exe").parent_path().string()
                            : args.bin;
  if (!std::filesystem::exists(args.daemon.bin_dir + "/ckptd")) {
    throw BenchError("no ckptd in " + args.daemon.bin_dir + " (build the ckptd target, or --bin)");
  }
  std::string tmpl = args.dir + "/ckpt-bench-load.XXXXXX";
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

  const Layout saved = MakeLayout(m, "rows" + std::to_string(m.save_ranks), m.save_ranks, true);
  const Layout cols =
      MakeLayout(m, "cols" + std::to_string(args.reshard_ranks), args.reshard_ranks, false);
  const Layout whole = MakeLayout(m, "whole1", 1, true);
  const uint64_t total = m.total_bytes();

  Report report(/*large_ratio_digits=*/1);
  const std::string fs = FilesystemOf(args.daemon.work_dir);
  const unsigned cores = std::thread::hardware_concurrency();
  std::printf("bench_load: %s, %u cores, work dir %s (%s), ckptd from %s\n", Today().c_str(), cores,
              args.daemon.work_dir.c_str(), fs.c_str(), args.daemon.bin_dir.c_str());
  std::printf(
      "state: %u float32 tensors [%llu, %llu] = %s, saved by %u ranks row-sharded "
      "(%s each); ckptd --host-pool %s --slot-size %s --checksum-chunk %s; load average "
      "%s\n",
      m.tensors, static_cast<unsigned long long>(m.rows), static_cast<unsigned long long>(m.cols),
      FormatBytes(total).c_str(), m.save_ranks, FormatBytes(total / m.save_ranks).c_str(),
      FormatBytes(args.daemon.host_pool).c_str(), args.daemon.slot_size.c_str(),
      args.daemon.checksum_chunk.c_str(), LoadProbe::LoadAverage().c_str());
  if (fs == "tmpfs") {
    std::printf("WARNING: %s is tmpfs: no O_DIRECT, no disk; cold numbers mean nothing\n",
                args.dir.c_str());
  }
  report.SetText("date", Today());
  report.SetText("work_dir_filesystem", fs);
  report.Set("cores", cores);
  report.Set("state_bytes", static_cast<double>(total));
  report.Set("tensors", m.tensors);
  report.Set("rows", static_cast<double>(m.rows));
  report.Set("cols", static_cast<double>(m.cols));
  report.Set("host_pool_bytes", static_cast<double>(args.daemon.host_pool));
  report.SetText("loadavg_start", LoadProbe::LoadAverage());
  std::fflush(stdout);

  LoadProbe whole_run;
  const auto start = Clock::now();
  const RankMemory src = Allocate(saved, "bench_load_state");
  for (size_t r = 0; r < src.size(); ++r) src[r]->FillRandom(total + r);

  // ---- save, then hot restore from the same daemon
  // Every load, by "hot."/"cold." + layout name, in the order run.
  std::map<std::string, std::vector<LoadRun>> runs;
  auto rates = [&](const std::string& key) {
    std::vector<double> v;
    for (const LoadRun& r : runs[key]) v.push_back(r.rate());
    return v;
  };
  double save_s = 0;
  {
    Daemon daemon(args.daemon, "ckptd", "root", args.daemon.host_pool, /*remove_root=*/false);
    std::vector<std::unique_ptr<Client>> clients;
    for (uint32_t r = 0; r < m.save_ranks; ++r) {
      clients.push_back(daemon.Connect(kJob, r, m.save_ranks));
      Require(clients.back()->Register(TensorsOf(m, saved, r, src[r]->fd())), "register", daemon);
    }
    const auto s0 = Clock::now();
    for (auto& c : clients) Require(c->Save(kStep), "save", daemon);
    for (auto& c : clients) Require(c->WaitSnapshot(), "wait_snapshot", daemon);
    Require(clients[0]->Wait(kStep, WaitState::kCommitted), "wait committed", daemon);
    save_s = SecondsSince(s0);
    for (auto& c : clients) c->Close();
    std::printf("\n== save: %u ranks, %s, Save → committed in %.2f s (%s)\n", m.save_ranks,
                FormatBytes(total).c_str(), save_s,
                MBps(static_cast<double>(total) / save_s).c_str());
    std::printf("\n== b. hot restore: the same daemon, right after the save\n");
    for (int i = 0; i < args.hot_rounds; ++i) {
      for (const Layout* l : {&saved, &cols, &whole}) {
        const LoadRun r = LoadOnce(daemon, m, saved, src, *l);
        std::printf("  %-7s %s\n", l->name.c_str(), Describe(r).c_str());
        std::fflush(stdout);
        if (r.from_storage != 0) {
          throw BenchError("hot load '" + l->name + "' read " + FormatBytes(r.from_storage) +
                           " from storage: the step was not resident (pool too small?)");
        }
        runs["hot." + l->name].push_back(r);
      }
    }
  }
  report.Set("save_seconds", save_s);

  // ---- cold loads, resharded loads and fio, round by round
  std::printf(
      "\n== a/c. cold loads (ckptd restarted, page cache dropped before each) and fio "
      "O_DIRECT sequential read of %s in %s\n",
      FormatBytes(total).c_str(), args.daemon.work_dir.c_str());
  Fio(args.daemon.work_dir, "write", total, 8, "--end_fsync=1");  // the file fio reads
  std::vector<double> fio4, fio8, fio_best, cold_vs_fio;
  bool dropped_all = true;
  for (int round = 1; round <= args.rounds; ++round) {
    dropped_all &= DropCaches();
    fio4.push_back(Fio(args.daemon.work_dir, "read", total, 4));
    dropped_all &= DropCaches();
    fio8.push_back(Fio(args.daemon.work_dir, "read", total, 8));
    fio_best.push_back(std::max(fio4.back(), fio8.back()));
    std::printf("  round %d: fio read qd4 %.0f qd8 %.0f MB/s\n", round, fio4.back() / 1e6,
                fio8.back() / 1e6);
    for (const Layout* l : {&saved, &cols, &whole}) {
      dropped_all &= DropCaches();
      Daemon daemon(args.daemon, "ckptd", "root", args.daemon.host_pool, /*remove_root=*/false);
      const LoadRun r = LoadOnce(daemon, m, saved, src, *l);
      std::printf("    %-7s %s\n", l->name.c_str(), Describe(r).c_str());
      std::fflush(stdout);
      if (r.from_storage == 0) {
        throw BenchError("cold load '" + l->name + "' read nothing from storage");
      }
      runs["cold." + l->name].push_back(r);
    }
    const double ratio = runs["cold." + saved.name].back().rate() / fio_best.back();
    cold_vs_fio.push_back(ratio);
    std::printf("    this round: cold %s / best fio = %.2f\n", saved.name.c_str(), ratio);
  }
  std::filesystem::remove(args.daemon.work_dir + "/fio.dat");
  if (!dropped_all) {
    std::printf(
        "  NOTE: dropping the page cache was refused (not root?); ckptd and fio read "
        "with O_DIRECT, which bypasses it\n");
  }

  const std::vector<double> cold_same = rates("cold." + saved.name),
                            cold_cols = rates("cold." + cols.name),
                            cold_whole = rates("cold." + whole.name),
                            hot_same = rates("hot." + saved.name),
                            hot_cols = rates("hot." + cols.name),
                            hot_whole = rates("hot." + whole.name);
  const double fio_m = Median(fio_best), cold_m = Median(cold_same);
  const double hot_m = Median(hot_same);
  std::printf(
      "\n  medians (min-max): fio best-of-qd %s, cold %s, hot %s;\n"
      "  resharded cold: %s %s, %s %s; hot: %s %s, %s %s;\n"
      "  cold / fio round by round: median %.2f (%.2f-%.2f)\n",
      Spread(fio_best).c_str(), Spread(cold_same).c_str(), Spread(hot_same).c_str(),
      cols.name.c_str(), Spread(cold_cols).c_str(), whole.name.c_str(), Spread(cold_whole).c_str(),
      cols.name.c_str(), Spread(hot_cols).c_str(), whole.name.c_str(), Spread(hot_whole).c_str(),
      Median(cold_vs_fio), *std::min_element(cold_vs_fio.begin(), cold_vs_fio.end()),
      *std::max_element(cold_vs_fio.begin(), cold_vs_fio.end()));

  report.Set("page_cache_dropped", dropped_all ? 1 : 0);
  auto mb = [](const std::vector<double>& in) {
    std::vector<double> v;
    for (double x : in) v.push_back(x / 1e6);
    return v;
  };
  report.SetList("fio_read_qd4_MBps", mb(fio4));
  report.SetList("fio_read_qd8_MBps", mb(fio8));
  report.SetList("cold_vs_fio_per_round", cold_vs_fio);
  for (const auto& [key, list] : runs) {
    std::vector<double> seconds, user, sys, faults, memory, storage;
    for (const LoadRun& r : list) {
      seconds.push_back(r.seconds);
      user.push_back(r.daemon_user_s);
      sys.push_back(r.daemon_system_s);
      faults.push_back(static_cast<double>(r.daemon_minor_faults));
      memory.push_back(static_cast<double>(r.from_memory));
      storage.push_back(static_cast<double>(r.from_storage));
    }
    report.SetList(key + ".MBps", mb(rates(key)));
    report.SetList(key + ".seconds", seconds);
    report.SetList(key + ".daemon_user_s", user);
    report.SetList(key + ".daemon_system_s", sys);
    report.SetList(key + ".daemon_minor_faults", faults);
    report.SetList(key + ".bytes_from_memory", memory);
    report.SetList(key + ".bytes_from_storage", storage);
  }

  const std::string same_label = std::to_string(m.save_ranks) + " ranks rows, same layout";
  report.AddRow({"cold load, " + same_label, MBps(cold_m), MBps(fio_m) + " fio", cold_m / fio_m,
                 ">= 0.9", cold_m / fio_m >= 0.9});
  report.AddRow({"hot restore, " + same_label, MBps(hot_m), MBps(cold_m) + " cold", hot_m / cold_m,
                 ">= 5x", hot_m / cold_m >= 5});
  const double cc = Median(cold_cols), cw = Median(cold_whole);
  report.AddRow({"cold resharded load, " + std::to_string(m.save_ranks) + " rows -> " +
                     std::to_string(args.reshard_ranks) + " ranks cols",
                 MBps(cc), MBps(cold_m) + " cold", cc / cold_m, ">= 0.8", cc / cold_m >= 0.8});
  report.AddRow({"cold resharded load, " + std::to_string(m.save_ranks) + " rows -> 1 rank whole",
                 MBps(cw), MBps(cold_m) + " cold", cw / cold_m, ">= 0.8", cw / cold_m >= 0.8});
  const double hc = Median(hot_cols), hw = Median(hot_whole);
  report.AddRow({"hot resharded, -> " + std::to_string(args.reshard_ranks) + " ranks cols",
                 MBps(hc), MBps(hot_m) + " hot", hc / hot_m, "(info)", std::nullopt});
  report.AddRow({"hot resharded, -> 1 rank whole", MBps(hw), MBps(hot_m) + " hot", hw / hot_m,
                 "(info)", std::nullopt});

  const double total_s = SecondsSince(start);
  const double others = whole_run.OthersCores();
  report.Set("total_seconds", total_s);
  report.Set("others_cpu_cores", others);
  report.SetText("loadavg_end", LoadProbe::LoadAverage());
  std::printf(
      "\n== summary (%.0f s; other processes used %.2f of %u cores on average; load "
      "average at end %s; page cache %s)\n\n",
      total_s, others, cores, LoadProbe::LoadAverage().c_str(),
      dropped_all ? "dropped before every cold read" : "NOT dropped (refused)");
  report.PrintTable();
  report.WriteJson(args.json);
  return 0;
}

}  // namespace
}  // namespace ckpt::bench

int main(int argc, char** argv) {
  ckpt::bench::Args args;
  CLI::App app{
      "bench_load: cold, hot and resharded loads through a real ckptd against same-run "
      "baselines (fio O_DIRECT read, the same-layout cold load)"};
  app.add_option("--dir", args.dir, "a fresh work directory is made here (a disk, not tmpfs)")
      ->capture_default_str();
  app.add_option("--bin", args.bin, "directory holding ckptd (default: this binary's)");
  app.add_option("--json", args.json, "write the results as JSON here");
  app.add_option("--size", args.size, "state size (all ranks)")->capture_default_str();
  app.add_option("--tensors", args.tensors, "global tensors")
      ->capture_default_str()
      ->check(CLI::Range(1, 10000));
  app.add_option("--cols", args.cols, "columns of every global tensor (float32)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 24));
  app.add_option("--ranks", args.ranks, "ranks saving, row-sharded")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  app.add_option("--reshard-ranks", args.reshard_ranks, "ranks of the column-sharded load")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  app.add_option("--pool", args.pool, "ckptd --host-pool (default: size + 512 MiB)");
  app.add_option("--rounds", args.rounds, "cold rounds (median)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  app.add_option("--hot-rounds", args.hot_rounds, "hot rounds (median)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  app.add_option("--slot-size", args.daemon.slot_size, "ckptd --slot-size")->capture_default_str();
  app.add_option("--checksum-chunk", args.daemon.checksum_chunk, "ckptd --checksum-chunk")
      ->capture_default_str();
  app.add_option("--ckptd-arg", args.daemon.extra_args, "extra ckptd argument, repeatable");
  app.add_flag("--keep", args.keep, "keep the work directory (daemon log, checkpoint)");
  for (CLI::Option* option : app.get_options()) {
    if (option->get_items_expected_max() == 1) {
      option->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    }
  }
  CLI11_PARSE(app, argc, argv);
  try {
    return ckpt::bench::Run(args);
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "bench_load: %s\n", e.what());
    return 1;
  }
}
