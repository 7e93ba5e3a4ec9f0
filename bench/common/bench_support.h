// Helpers shared by bench_daemon and bench_load: errors (BenchError), timing and formatting
// (Seconds, Fixed, MBps, Median), the results table and JSON (Report), the machine's load
// (LoadProbe, RecordLoad), child processes and a real ckptd (ChildProcess, FileTail, Daemon,
// Require), the run's header lines (Today, FilesystemOf) and fio (RunCommand, Fio).
#pragma once

#include <fcntl.h>
#include <linux/magic.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ckpt/client.h"

extern char** environ;

namespace ckpt::bench {

using Clock = std::chrono::steady_clock;
inline constexpr uint64_t kMiB = 1ull << 20;
inline constexpr uint64_t kGiB = 1ull << 30;

// Errors end the run: thrown here, caught in main; destructors stop the daemon and clean up.
struct BenchError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

[[noreturn]] inline void ThrowErrno(const std::string& what) {
  throw BenchError(what + ": " + std::strerror(errno));
}

inline double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }
inline double SecondsSince(Clock::time_point t) { return Seconds(Clock::now() - t); }

inline std::string Fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}
inline std::string MBps(double bytes_per_s) { return Fixed(bytes_per_s / 1e6, 0) + " MB/s"; }

inline double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// ---------------------------------------------------------------------------- results

// Everything measured, in the order measured: printed as the final table and written as JSON.
class Report {
 public:
  struct Row {
    std::string metric, ckptd, baseline;
    double ratio = 0;
    std::string goal;
    std::optional<bool> met;  // nullopt: no goal, reported for information
  };
  // The table prints a ratio with 2 decimals below 10, `large_ratio_digits` from 10 up.
  explicit Report(int large_ratio_digits) : large_ratio_digits_(large_ratio_digits) {}

  void AddRow(Row row) { rows_.push_back(std::move(row)); }
  // A named number of a section (JSON only; the section's own output prints it readably).
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
      line(r.metric, r.ckptd, r.baseline, Fixed(r.ratio, r.ratio < 10 ? 2 : large_ratio_digits_),
           r.goal,
           !r.met   ? "-"
           : *r.met ? "yes"
                    : "NO");
    }
  }

  // Writes Json() to `path` (nothing when empty) and says where.
  void WriteJson(const std::string& path) const {
    if (path.empty()) return;
    std::ofstream out(path);
    out << Json();
    if (!out) throw BenchError("writing " + path);
    std::printf("\nJSON: %s\n", path.c_str());
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
             (!r.met   ? "null"
              : *r.met ? "true"
                       : "false") +
             "}" + (i + 1 < rows_.size() ? ",\n" : "\n");
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
  int large_ratio_digits_;
  std::vector<Row> rows_;
  std::vector<std::pair<std::string, std::string>> values_;
};

// ---------------------------------------------------------------------------- machine load

// CPU time of the whole machine vs this process and its reaped children (the daemons, fio), so
// that a run (or a section of it) can say how much of the cores others took while it ran.
class LoadProbe {
 public:
  LoadProbe() : start_(Clock::now()), busy_(MachineBusySeconds()), ours_(OurCpuSeconds()) {}
  // Cores' worth of CPU used by other processes since construction (steal time included).
  // Reaped children count as ours: call it when the daemons it should count have been stopped.
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
    uint64_t user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
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

// Prints and records the load of one section.
inline void RecordLoad(Report& report, const std::string& section, const LoadProbe& probe) {
  const double others = probe.OthersCores();
  const std::string load = LoadProbe::LoadAverage();
  std::printf("  load: other processes used %.2f cores during this section; load average %s\n",
              others, load.c_str());
  report.Set(section + ".others_cpu_cores", others);
  report.SetText(section + ".loadavg", load);
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
  // True (and reaped) when the child has exited; `status` gets its wait status.
  bool Exited(int* status) {
    if (pid_ <= 0) return true;
    if (::waitpid(pid_, status, WNOHANG) != pid_) return false;
    pid_ = -1;
    return true;
  }

 private:
  pid_t pid_ = -1;
};

inline std::string FileTail(const std::string& path, size_t lines) {
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
  uint64_t host_pool = 2 * kGiB;
  std::string slot_size = "16MiB";
  std::string checksum_chunk = "1MiB";
  int capture_threads = 2;
  int flush_threads = 8;
  std::vector<std::string> extra_args;  // appended to every ckptd command line
};

// One ckptd: socket `name`.sock, log `name`.log and storage root `root_name`, all under the work
// directory. With `remove_root` the destructor removes the root after stopping the daemon;
// without, the root outlives it (a later daemon restarts on it).
class Daemon {
 public:
  Daemon(const DaemonOptions& o, const std::string& name, const std::string& root_name,
         uint64_t host_pool, bool remove_root)
      : socket_(o.work_dir + "/" + name + ".sock"),
        root_(o.work_dir + "/" + root_name),
        log_(o.work_dir + "/" + name + ".log"),
        remove_root_(remove_root) {
    std::vector<std::string> args = {"--socket",
                                     socket_,
                                     "--storage-root",
                                     root_,
                                     "--host-pool",
                                     std::to_string(host_pool),
                                     "--slot-size",
                                     o.slot_size,
                                     "--checksum-chunk",
                                     o.checksum_chunk,
                                     "--capture-threads",
                                     std::to_string(o.capture_threads),
                                     "--flush-threads",
                                     std::to_string(o.flush_threads),
                                     "--keep",
                                     "1",
                                     "--node-id",
                                     "bench",
                                     "--log-level",
                                     "warn",
                                     "--admin",
                                     "unix:" + socket_ + ".admin",
                                     "--metrics",
                                     "127.0.0.1:0"};
    args.insert(args.end(), o.extra_args.begin(), o.extra_args.end());
    process_ = std::make_unique<ChildProcess>(o.bin_dir + "/ckptd", args, log_);
  }
  ~Daemon() {
    Stop();
    if (remove_root_) {
      std::error_code ec;
      std::filesystem::remove_all(root_, ec);
    }
  }
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  // SIGTERM, then waits up to a minute for the exit.
  void Stop() {
    if (process_) process_->Stop(SIGTERM, std::chrono::seconds(60));
  }

  // Connects a rank. The daemon listens once its pool is populated; until then (at most two
  // minutes) the client retries, and a daemon that exits instead is reported at once.
  std::unique_ptr<Client> Connect(const std::string& job, uint32_t rank = 0,
                                  uint32_t world_size = 1) {
    ClientOptions options;
    options.socket = socket_;
    options.job = job;
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
        throw BenchError(
            "connecting to ckptd at " + socket_ + ": " + client.status().ToString() +
            (exited ? " (ckptd exited, wait status " + std::to_string(status) + ")" : "") +
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
    const Ticks t = ReadTicks();
    const auto hz = static_cast<double>(::sysconf(_SC_CLK_TCK));
    return {static_cast<double>(t.utime) / hz, static_cast<double>(t.stime) / hz, t.minflt};
  }
  // CPU time (user + system) the daemon has used so far.
  double CpuSeconds() const {
    const Ticks t = ReadTicks();
    return static_cast<double>(t.utime + t.stime) / static_cast<double>(::sysconf(_SC_CLK_TCK));
  }

 private:
  struct Ticks {
    uint64_t minflt = 0, utime = 0, stime = 0;
  };
  Ticks ReadTicks() const {
    std::ifstream in("/proc/" + std::to_string(process_->pid()) + "/stat");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t close = text.rfind(')');  // the command name may hold spaces
    if (close == std::string::npos) return {};
    std::istringstream fields(text.substr(close + 2));
    std::string skip;
    for (int i = 3; i < 10; ++i) fields >> skip;  // fields 3..9
    uint64_t cminflt = 0, majflt = 0, cmajflt = 0;
    Ticks t;
    fields >> t.minflt >> cminflt >> majflt >> cmajflt >> t.utime >> t.stime;  // fields 10..15
    return t;
  }

  std::string socket_, root_, log_;
  bool remove_root_;
  std::unique_ptr<ChildProcess> process_;
};

// A client's Require: on failure, adds the tail of the daemon's log.
inline void Require(const Status& s, const std::string& what, const Daemon& daemon) {
  if (!s.ok()) {
    throw BenchError(what + ": " + s.ToString() + "\n  daemon log " + daemon.log() + ":\n" +
                     FileTail(daemon.log(), 20));
  }
}

// ---------------------------------------------------------------------------- the run

inline std::string Today() {
  const std::time_t now = std::time(nullptr);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S %Z", std::localtime(&now));
  return buf;
}

inline std::string FilesystemOf(const std::string& dir) {
  struct statfs fs {};
  if (::statfs(dir.c_str(), &fs) != 0) return "unknown";
  switch (fs.f_type) {
    case TMPFS_MAGIC:
      return "tmpfs";
    case EXT4_SUPER_MAGIC:
      return "ext2/3/4";
    case XFS_SUPER_MAGIC:
      return "xfs";
    case BTRFS_SUPER_MAGIC:
      return "btrfs";
    case OVERLAYFS_SUPER_MAGIC:
      return "overlayfs";
    default: {
      char buf[32];
      std::snprintf(buf, sizeof buf, "0x%lx", static_cast<unsigned long>(fs.f_type));
      return buf;
    }
  }
}

// ---------------------------------------------------------------------------- fio

// Runs a shell command, returns its stdout; throws when it exits non-zero.
inline std::string RunCommand(const std::string& command) {
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) ThrowErrno("popen " + command);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) out.append(buf, n);
  const int status = ::pclose(pipe);
  if (status != 0)
    throw BenchError("'" + command + "' failed (status " + std::to_string(status) + "):\n" +
                     out.substr(0, 2000));
  return out;
}

// bench/storage/run.sh's fio: sequential `rw` ("read" or "write") of fio.dat in `dir`, O_DIRECT,
// bs=16M, libaio, `extra` flags appended. Returns fio's bw_bytes of that direction (its own bytes
// / runtime). With `remove_file`, fio.dat is removed once fio has run.
inline double Fio(const std::string& dir, const std::string& rw, uint64_t bytes, int iodepth,
                  const std::string& extra = "", bool remove_file = false) {
  const std::string json =
      RunCommand("fio --name=" + rw + " --rw=" + rw + " --directory='" + dir +
                 "' --filename=fio.dat --bs=16M --size=" + std::to_string(bytes) +
                 " --direct=1 --ioengine=libaio --iodepth=" + std::to_string(iodepth) +
                 " --output-format=json " + extra + " 2>&1");
  if (remove_file) std::filesystem::remove(dir + "/fio.dat");
  // {"jobs": [{..., "<rw>": {"io_bytes": N, "io_kbytes": N, "bw_bytes": N, ...
  const size_t section = json.find("\"" + rw + "\" : {");
  const size_t key = section == std::string::npos ? section : json.find("\"bw_bytes\"", section);
  const size_t colon = key == std::string::npos ? key : json.find(':', key);
  const double bw = colon == std::string::npos ? 0 : std::strtod(json.c_str() + colon + 1, nullptr);
  if (bw <= 0) throw BenchError("unexpected fio output:\n" + json.substr(0, 2000));
  return bw;
}

}  // namespace ckpt::bench
