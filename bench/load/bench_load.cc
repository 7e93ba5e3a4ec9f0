// bench_load: loads through a real ckptd, driven by the C++ client, against baselines measured in
// the same run on the same machine and directory (ANCHORS.md "Physical limits"; bench/load/run.sh
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
// restarted trainer's would be); registration is timed apart and printed. After every load the destination is compared
// with the saved bytes (outside the clock), and bytes_from_memory / bytes_from_storage are
// checked: a hot load must read nothing from storage, a cold one must start with nothing in
// memory. Medians over --rounds rounds. One table at the end; --json PATH writes everything.
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

#include "ckpt/client.h"
#include "common/units.h"

extern char** environ;

namespace ckpt::bench {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kElement = 4;  // float32
constexpr uint64_t kStep = 1;
constexpr const char* kJob = "bench-load";

// Errors end the run: thrown here, caught in main; destructors stop the daemon and clean up.
struct BenchError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

[[noreturn]] void ThrowErrno(const std::string& what) {
  throw BenchError(what + ": " + std::strerror(errno));
}

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }
double SecondsSince(Clock::time_point t) { return Seconds(Clock::now() - t); }

std::string Fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}
std::string MBps(double bytes_per_s) { return Fixed(bytes_per_s / 1e6, 0) + " MB/s"; }

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// "median (min-max) MB/s" of byte rates.
std::string Spread(const std::vector<double>& v) {
  if (v.empty()) return "-";
  const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
  return Fixed(Median(v) / 1e6, 0) + " (" + Fixed(*lo / 1e6, 0) + "-" + Fixed(*hi / 1e6, 0) +
         ") MB/s";
}

// ---------------------------------------------------------------------------- results

// Everything measured: printed as the final table and written as JSON (bench_daemon's format).
class Report {
 public:
  struct Row {
    std::string metric, ckptd, baseline;
    double ratio = 0;
    std::string goal;
    std::optional<bool> met;  // nullopt: no goal, reported for information
  };
  void AddRow(Row row) { rows_.push_back(std::move(row)); }
  void Set(const std::string& key, double value) { values_.emplace_back(key, Fixed(value, 6)); }
  void SetText(const std::string& key, const std::string& value) {
    values_.emplace_back(key, Quote(value));
  }
  void SetList(const std::string& key, const std::vector<double>& v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + Fixed(v[i], 3);
    values_.emplace_back(key, s + "]");
  }

  void PrintTable() const {
    size_t w[4] = {6, 5, 8, 4};
    for (const Row& r : rows_) {
      w[0] = std::max(w[0], r.metric.size());
      w[1] = std::max(w[1], r.ckptd.size());
      w[2] = std::max(w[2], r.baseline.size());
      w[3] = std::max(w[3], r.goal.size());
    }
    auto line = [&](const std::string& a, const std::string& b, const std::string& c,
                    const std::string& d, const std::string& e, const std::string& f) {
      std::printf("| %-*s | %*s | %*s | %6s | %-*s | %-4s |\n", static_cast<int>(w[0]), a.c_str(),
                  static_cast<int>(w[1]), b.c_str(), static_cast<int>(w[2]), c.c_str(), d.c_str(),
                  static_cast<int>(w[3]), e.c_str(), f.c_str());
    };
    line("metric", "ckptd", "baseline", "ratio", "goal", "met?");
    std::printf("|%s|%s:|%s:|-------:|%s|------|\n", std::string(w[0] + 2, '-').c_str(),
                std::string(w[1] + 1, '-').c_str(), std::string(w[2] + 1, '-').c_str(),
                std::string(w[3] + 2, '-').c_str());
    for (const Row& r : rows_) {
      line(r.metric, r.ckptd, r.baseline, Fixed(r.ratio, r.ratio < 10 ? 2 : 1), r.goal,
           !r.met ? "-" : *r.met ? "yes" : "NO");
    }
  }

  std::string Json() const {
    std::string out = "{\n  \"results\": {\n";
    for (size_t i = 0; i < values_.size(); ++i) {
      out += "    " + Quote(values_[i].first) + ": " + values_[i].second +
             (i + 1 < values_.size() ? ",\n" : "\n");
    }
    out += "  },\n  \"table\": [\n";
    for (size_t i = 0; i < rows_.size(); ++i) {
      const Row& r = rows_[i];
      out += "    {\"metric\": " + Quote(r.metric) + ", \"ckptd\": " + Quote(r.ckptd) +
             ", \"baseline\": " + Quote(r.baseline) + ", \"ratio\": " + Fixed(r.ratio, 4) +
             ", \"goal\": " + Quote(r.goal) + ", \"met\": " +
             (!r.met ? "null" : *r.met ? "true" : "false") + "}" +
             (i + 1 < rows_.size() ? ",\n" : "\n");
    }
    return out + "  ]\n}\n";
  }

 private:
  static std::string Quote(const std::string& s) {
    std::string out = "\"";
    for (char c : s) {
      if (c == '"' || c == '\\') out += '\\';
      if (static_cast<unsigned char>(c) < 0x20) {
        out += ' ';
        continue;
      }
      out += c;
    }
    return out + "\"";
  }
  std::vector<Row> rows_;
  std::vector<std::pair<std::string, std::string>> values_;
};

// ---------------------------------------------------------------------------- machine load

// CPU time of the whole machine vs this process and its reaped children (fio, the daemons), so
// that the run can say how much of the cores others took.
class LoadProbe {
 public:
  LoadProbe() : start_(Clock::now()), busy_(MachineBusySeconds()), ours_(OurCpuSeconds()) {}
  // Cores' worth of CPU used by other processes since construction (steal time included).
  // Call it when every daemon has been stopped (reaped children count as ours).
  double OthersCores() const {
    const double elapsed = SecondsSince(start_);
    const double others = (MachineBusySeconds() - busy_) - (OurCpuSeconds() - ours_);
    return elapsed > 0 ? std::max(0.0, others / elapsed) : 0;
  }
  static std::string LoadAverage() {
    std::ifstream in("/proc/loadavg");
    std::string one, five, fifteen;
    in >> one >> five >> fifteen;
    return one + " " + five + " " + fifteen;
  }

 private:
  static double MachineBusySeconds() {
    std::ifstream in("/proc/stat");
    std::string cpu;
    uint64_t user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0,
             steal = 0;
    in >> cpu >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal;
    return static_cast<double>(user + nice + system + irq + softirq + steal) /
           static_cast<double>(::sysconf(_SC_CLK_TCK));
  }
  static double OurCpuSeconds() {
    auto sum = [](int who) {
      rusage u{};
      ::getrusage(who, &u);
      return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
             static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
    };
    return sum(RUSAGE_SELF) + sum(RUSAGE_CHILDREN);
  }
  Clock::time_point start_;
  double busy_;
  double ours_;
};

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

// ---------------------------------------------------------------------------- processes

// A child process (posix_spawn), stdout and stderr appended to `log`, CKPTD_* removed from its
// environment so that nothing but the flags configures a daemon. The destructor kills and reaps
// a child that is still running.
class ChildProcess {
 public:
  ChildProcess(const std::string& binary, const std::vector<std::string>& args,
               const std::string& log) {
    std::vector<std::string> argv_store{binary};
    argv_store.insert(argv_store.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : argv_store) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::vector<std::string> env_store;
    for (char** e = environ; *e != nullptr; ++e) {
      if (std::strncmp(*e, "CKPTD_", 6) != 0) env_store.emplace_back(*e);
    }
    std::vector<char*> envp;
    for (auto& e : env_store) envp.push_back(e.data());
    envp.push_back(nullptr);

    posix_spawn_file_actions_t actions;
    ::posix_spawn_file_actions_init(&actions);
    ::posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
    ::posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND,
                                       0644);
    ::posix_spawn_file_actions_adddup2(&actions, 1, 2);
    const int rc =
        ::posix_spawn(&pid_, binary.c_str(), &actions, nullptr, argv.data(), envp.data());
    ::posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) throw BenchError("posix_spawn " + binary + ": " + std::strerror(rc));
  }
  ~ChildProcess() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      int status = 0;
      ::waitpid(pid_, &status, 0);
    }
  }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  // Sends `signo` and waits up to `timeout` for the exit (then SIGKILL). Returns the wait status.
  int Stop(int signo, std::chrono::seconds timeout) {
    if (pid_ <= 0) return 0;
    ::kill(pid_, signo);
    const auto deadline = Clock::now() + timeout;
    int status = 0;
    while (::waitpid(pid_, &status, WNOHANG) == 0) {
      if (Clock::now() > deadline) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));  // polling an exit, no event
    }
    pid_ = -1;
    return status;
  }
  pid_t pid() const { return pid_; }
  bool Exited(int* status) {
    if (pid_ <= 0) return true;
    if (::waitpid(pid_, status, WNOHANG) != pid_) return false;
    pid_ = -1;
    return true;
  }

 private:
  pid_t pid_ = -1;
};

std::string FileTail(const std::string& path, size_t lines) {
  std::ifstream in(path);
  std::vector<std::string> all;
  for (std::string l; std::getline(in, l);) all.push_back(l);
  std::string out;
  for (size_t i = all.size() > lines ? all.size() - lines : 0; i < all.size(); ++i) {
    out += "    " + all[i] + "\n";
  }
  return out;
}

struct DaemonOptions {
  std::string bin_dir;
  std::string work_dir;
  uint64_t host_pool = 0;
  std::string slot_size = "16MiB";
  std::string checksum_chunk = "1MiB";
  int capture_threads = 2;
  int flush_threads = 8;
  std::vector<std::string> extra_args;  // appended to the ckptd command line
};

// One ckptd on the work directory's storage root, which outlives it (a later daemon restarts on
// it); its socket and log under the work directory.
class Daemon {
 public:
  explicit Daemon(const DaemonOptions& o)
      : socket_(o.work_dir + "/ckptd.sock"), root_(o.work_dir + "/root"),
        log_(o.work_dir + "/ckptd.log") {
    std::vector<std::string> args = {
        "--socket", socket_, "--storage-root", root_, "--host-pool",
        std::to_string(o.host_pool), "--slot-size", o.slot_size, "--checksum-chunk",
        o.checksum_chunk, "--capture-threads", std::to_string(o.capture_threads),
        "--flush-threads", std::to_string(o.flush_threads), "--keep", "1", "--node-id", "bench",
        "--log-level", "warn"};
    args.insert(args.end(), o.extra_args.begin(), o.extra_args.end());
    process_ = std::make_unique<ChildProcess>(o.bin_dir + "/ckptd", args, log_);
  }
  ~Daemon() { Stop(); }
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  void Stop() {
    if (process_) process_->Stop(SIGTERM, std::chrono::seconds(60));
  }

  // Connects a rank. The daemon listens once its pool is populated; until then (at most two
  // minutes) the client retries, and a daemon that exits instead is reported at once.
  std::unique_ptr<Client> Connect(uint32_t rank, uint32_t world_size) {
    ClientOptions options;
    options.socket = socket_;
    options.job = kJob;
    options.rank = rank;
    options.world_size = world_size;
    options.local_rank = rank;
    options.connect_timeout = std::chrono::milliseconds(500);
    const auto deadline = Clock::now() + std::chrono::minutes(2);
    while (true) {
      auto client = Client::Connect(options);
      if (client.ok()) return std::move(client).value();
      int status = 0;
      const bool exited = process_->Exited(&status);
      if (exited || Clock::now() > deadline) {
        throw BenchError("connecting to ckptd at " + socket_ + ": " + client.status().ToString() +
                         (exited ? " (ckptd exited, wait status " + std::to_string(status) + ")"
                                 : "") +
                         "\n  daemon log " + log_ + ":\n" + FileTail(log_, 20));
      }
    }
  }
  const std::string& root() const { return root_; }
  const std::string& log() const { return log_; }
  // The daemon's CPU time so far (user, system) and its minor page faults, from /proc/PID/stat.
  struct Usage {
    double user_s = 0, system_s = 0;
    uint64_t minor_faults = 0;
  };
  Usage CpuUsage() const {
    std::ifstream in("/proc/" + std::to_string(process_->pid()) + "/stat");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t close = text.rfind(')');  // the command name may hold spaces
    if (close == std::string::npos) return {};
    std::istringstream fields(text.substr(close + 2));
    std::string skip;
    for (int i = 3; i < 10; ++i) fields >> skip;  // fields 3..9
    uint64_t minflt = 0, cminflt = 0, majflt = 0, cmajflt = 0, utime = 0, stime = 0;
    fields >> minflt >> cminflt >> majflt >> cmajflt >> utime >> stime;  // fields 10..15
    const auto hz = static_cast<double>(::sysconf(_SC_CLK_TCK));
    return {static_cast<double>(utime) / hz, static_cast<double>(stime) / hz, minflt};
  }

 private:
  std::string socket_, root_, log_;
  std::unique_ptr<ChildProcess> process_;
};

void Require(const Status& s, const std::string& what, const Daemon& daemon) {
  if (!s.ok()) {
    throw BenchError(what + ": " + s.ToString() + "\n  daemon log " + daemon.log() + ":\n" +
                     FileTail(daemon.log(), 20));
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

// ---------------------------------------------------------------------------- fio

std::string RunCommand(const std::string& command) {
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) ThrowErrno("popen " + command);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) out.append(buf, n);
  const int status = ::pclose(pipe);
  if (status != 0) throw BenchError("'" + command + "' failed (status " + std::to_string(status) +
                                    "):\n" + out.substr(0, 2000));
  return out;
}

// bench/storage/run.sh's fio: sequential, O_DIRECT, bs=16M, libaio. Returns fio's bw_bytes.
double Fio(const std::string& dir, const std::string& rw, uint64_t bytes, int iodepth,
           const std::string& extra = "") {
  const std::string json =
      RunCommand("fio --name=" + rw + " --rw=" + rw + " --directory='" + dir +
                 "' --filename=fio.dat --bs=16M --size=" + std::to_string(bytes) +
                 " --direct=1 --ioengine=libaio --iodepth=" + std::to_string(iodepth) +
                 " --output-format=json " + extra + " 2>&1");
  const size_t section = json.find("\"" + rw + "\" : {");
  const size_t key = section == std::string::npos ? section : json.find("\"bw_bytes\"", section);
  const size_t colon = key == std::string::npos ? key : json.find(':', key);
  const double bw = colon == std::string::npos ? 0 : std::strtod(json.c_str() + colon + 1, nullptr);
  if (bw <= 0) throw BenchError("unexpected fio output:\n" + json.substr(0, 2000));
  return bw;
}

// ---------------------------------------------------------------------------- loads

struct LoadRun {
  double seconds = 0;            // first Load sent → last Load returned
  double register_s = 0;         // registering all ranks, one after the other
  uint64_t bytes = 0;            // the layout's bytes (what the ranks asked for)
  uint64_t from_memory = 0;      // sums over ranks of LoadResult
  uint64_t from_storage = 0;
  double daemon_user_s = 0;      // daemon CPU during the load
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
  for (uint32_t r = 0; r < nranks; ++r) clients.push_back(daemon.Connect(r, nranks));
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
    Require(results[r].status(), "load of rank " + std::to_string(r) + " (" + l.name + ")",
            daemon);
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

std::string Today() {
  const std::time_t now = std::time(nullptr);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S %Z", std::localtime(&now));
  return buf;
}

std::string FilesystemOf(const std::string& dir) {
  struct statfs fs{};
  if (::statfs(dir.c_str(), &fs) != 0) return "unknown";
  switch (fs.f_type) {
    case TMPFS_MAGIC: return "tmpfs";
    case EXT4_SUPER_MAGIC: return "ext2/3/4";
    case XFS_SUPER_MAGIC: return "xfs";
    case BTRFS_SUPER_MAGIC: return "btrfs";
    case OVERLAYFS_SUPER_MAGIC: return "overlayfs";
    default: {
      char buf[32];
      std::snprintf(buf, sizeof buf, "0x%lx", static_cast<unsigned long>(fs.f_type));
      return buf;
    }
  }
}

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
  args.daemon.bin_dir =
      args.bin.empty() ? std::filesystem::read_symlink("/proc/self/exe").parent_path().string()
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
  const Layout cols = MakeLayout(m, "cols" + std::to_string(args.reshard_ranks),
                                 args.reshard_ranks, false);
  const Layout whole = MakeLayout(m, "whole1", 1, true);
  const uint64_t total = m.total_bytes();

  Report report;
  const std::string fs = FilesystemOf(args.daemon.work_dir);
  const unsigned cores = std::thread::hardware_concurrency();
  std::printf("bench_load: %s, %u cores, work dir %s (%s), ckptd from %s\n", Today().c_str(),
              cores, args.daemon.work_dir.c_str(), fs.c_str(), args.daemon.bin_dir.c_str());
  std::printf("state: %u float32 tensors [%llu, %llu] = %s, saved by %u ranks row-sharded "
              "(%s each); ckptd --host-pool %s --slot-size %s --checksum-chunk %s; load average "
              "%s\n",
              m.tensors, static_cast<unsigned long long>(m.rows),
              static_cast<unsigned long long>(m.cols), FormatBytes(total).c_str(), m.save_ranks,
              FormatBytes(total / m.save_ranks).c_str(),
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
    Daemon daemon(args.daemon);
    std::vector<std::unique_ptr<Client>> clients;
    for (uint32_t r = 0; r < m.save_ranks; ++r) {
      clients.push_back(daemon.Connect(r, m.save_ranks));
      Require(clients.back()->Register(TensorsOf(m, saved, r, src[r]->fd())), "register", daemon);
    }
    const auto s0 = Clock::now();
    for (auto& c : clients) Require(c->Save(kStep), "save", daemon);
    for (auto& c : clients) Require(c->WaitSnapshot(), "wait_snapshot", daemon);
    Require(clients[0]->Wait(kStep, WaitState::kCommitted), "wait committed", daemon);
    save_s = SecondsSince(s0);
    for (auto& c : clients) c->Close();
    std::printf("\n== save: %u ranks, %s, Save → committed in %.2f s (%s)\n", m.save_ranks,
                FormatBytes(total).c_str(), save_s, MBps(static_cast<double>(total) / save_s).c_str());
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
  std::printf("\n== a/c. cold loads (ckptd restarted, page cache dropped before each) and fio "
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
      Daemon daemon(args.daemon);
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
    std::printf("  NOTE: dropping the page cache was refused (not root?); ckptd and fio read "
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
  std::printf("\n  medians (min-max): fio best-of-qd %s, cold %s, hot %s;\n"
              "  resharded cold: %s %s, %s %s; hot: %s %s, %s %s;\n"
              "  cold / fio round by round: median %.2f (%.2f-%.2f)\n",
              Spread(fio_best).c_str(), Spread(cold_same).c_str(), Spread(hot_same).c_str(),
              cols.name.c_str(), Spread(cold_cols).c_str(), whole.name.c_str(),
              Spread(cold_whole).c_str(), cols.name.c_str(), Spread(hot_cols).c_str(),
              whole.name.c_str(), Spread(hot_whole).c_str(), Median(cold_vs_fio),
              *std::min_element(cold_vs_fio.begin(), cold_vs_fio.end()),
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
  report.AddRow({"hot restore, " + same_label, MBps(hot_m), MBps(cold_m) + " cold",
                 hot_m / cold_m, ">= 5x", hot_m / cold_m >= 5});
  const double cc = Median(cold_cols), cw = Median(cold_whole);
  report.AddRow({"cold resharded load, " + std::to_string(m.save_ranks) + " rows -> " +
                     std::to_string(args.reshard_ranks) + " ranks cols",
                 MBps(cc), MBps(cold_m) + " cold", cc / cold_m, ">= 0.8", cc / cold_m >= 0.8});
  report.AddRow({"cold resharded load, " + std::to_string(m.save_ranks) +
                     " rows -> 1 rank whole",
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
  std::printf("\n== summary (%.0f s; other processes used %.2f of %u cores on average; load "
              "average at end %s; page cache %s)\n\n",
              total_s, others, cores, LoadProbe::LoadAverage().c_str(),
              dropped_all ? "dropped before every cold read" : "NOT dropped (refused)");
  report.PrintTable();
  if (!args.json.empty()) {
    std::ofstream out(args.json);
    out << report.Json();
    if (!out) throw BenchError("writing " + args.json);
    std::printf("\nJSON: %s\n", args.json.c_str());
  }
  return 0;
}

}  // namespace
}  // namespace ckpt::bench

int main(int argc, char** argv) {
  ckpt::bench::Args args;
  CLI::App app{"bench_load: cold, hot and resharded loads through a real ckptd against same-run "
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
