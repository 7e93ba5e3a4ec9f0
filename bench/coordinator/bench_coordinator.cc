// bench_coordinator: the coordinator's cost at scale, with no data moved (bench/README.md,
// "Coordinator"). A load generator plays N nodes of R ranks each, T tensors per rank, in a
// TP × PP × DP layout (every tensor of a pipeline stage split in TP row slices, each slice
// replicated over the DP ranks), and drives an in-process CoordinatorCore exactly as daemons do:
// RegisterNode, Watch (a sink), ReportRegistration per rank — by layout fingerprint first, with
// the layout only when the coordinator answers need_layout, as daemon/rpc/coordinator_link.cc
// does — then per node a PERSISTED report each time another of its ranks persisted, with the
// node manifest of its ranks persisted so far (as node_state.cc reports). Every request goes
// through protobuf serialize + parse first, the CPU part of the wire.
//
// The generator streams: it builds each rank's registration and each node's manifest just
// before sending it and drops it after, keeping only one full registration per distinct layout
// (which a daemon computes once and the coordinator holds anyway), so the process's peak RSS is
// the coordinator's.
//
// Measured, in one run, on one storage root:
//   registration  every rank's ReportRegistration, in all (the plan runs after, on the plan
//                 thread, and is not in it);
//   plan          from the registration that completes the job to the plan being in force;
//   commit        from the last PERSISTED report to the COMMITTED event: the rest of the merge,
//                 validation, coverage check, MANIFEST temp+fsync+rename+fsync dir, LATEST;
//   baseline      (unless --no-baseline) the same commit with no writer plan: every rank lists
//                 every shard it holds and the merge drops the replicas;
//   peak RSS      of the whole process (getrusage), after all of the above.
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <mutex>

#include "common/file_system.h"
#include "common/layout_fingerprint.h"
#include "common/logging.h"
#include "common/manifest_io.h"
#include "common/step_layout.h"
#include "daemon/coordinator/coordinator_core.h"

namespace {

using Clock = std::chrono::steady_clock;
namespace pb = ckptd::v1;

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

// Waits for a step decision of `state` on one node's stream.
class Sink final : public ckpt::NodeSink {
 public:
  void Send(const pb::CoordinatorEvent& e) override {
    if (!e.has_step()) return;  // plans: the generator reads the plan from the core
    std::lock_guard lock(mu_);
    last_[{e.step().job(), e.step().step()}] = e.step().state();
    at_ = Clock::now();
    reason_ = e.step().reason();
    cv_.notify_all();
  }
  Clock::time_point Wait(const std::string& job, uint64_t step, pb::StepState state) {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] {
      auto it = last_.find({job, step});
      return it != last_.end() && (it->second == state || it->second == pb::STEP_STATE_FAILED ||
                                   it->second == pb::STEP_STATE_ABORTED);
    });
    if (last_[{job, step}] != state) {
      std::fprintf(stderr, "bench_coordinator: job %s step %llu ended otherwise: %s\n", job.c_str(),
                   static_cast<unsigned long long>(step), reason_.c_str());
      std::exit(1);
    }
    return at_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::pair<std::string, uint64_t>, pb::StepState> last_;
  Clock::time_point at_;
  std::string reason_;
};

struct Layout {
  uint32_t ranks, tensors, tp, pp, per_node;
  uint64_t rows(uint32_t t) const { return 64ull * (1 + t % 16); }  // rows per TP slice
  static constexpr uint64_t kCols = 4096;
  uint64_t bytes(uint32_t t) const { return rows(t) * kCols * 2; }  // bfloat16
  uint32_t nodes() const { return (ranks + per_node - 1) / per_node; }
  std::string node(uint32_t rank) const { return "node" + std::to_string(rank / per_node); }
  uint32_t slice(uint32_t rank) const { return rank % tp; }
  uint32_t stage(uint32_t rank) const { return (rank / tp) % pp; }
  uint32_t distinct() const { return tp * pp; }
  uint32_t layout_of(uint32_t rank) const { return stage(rank) * tp + slice(rank); }
};

template <typename M>
M OverTheWire(const M& m) {
  M out;
  out.ParseFromString(m.SerializeAsString());
  return out;
}

// Shard `t` of one rank: tensor t of its stage, its TP slice.
void AddShard(const Layout& l, uint32_t rank, uint32_t t, pb::ReportRegistrationRequest* req) {
  auto* s = req->add_shards();
  s->set_name("layers." + std::to_string(l.stage(rank)) + "." + std::to_string(t / 8) + ".w" +
              std::to_string(t % 8));
  s->set_dtype("bfloat16");
  s->add_global_shape(l.rows(t) * l.tp);
  s->add_global_shape(Layout::kCols);
  auto* box = s->mutable_geometry()->mutable_box();
  box->add_offsets(l.slice(rank) * l.rows(t));
  box->add_offsets(0);
  box->add_lengths(l.rows(t));
  box->add_lengths(Layout::kCols);
  s->set_bytes(l.bytes(t));
}

// What daemons send: each distinct layout's shards and fingerprint, computed once (a daemon
// computes its ranks' once per registration; the coordinator holds one copy per layout too).
class Registrations {
 public:
  Registrations(const Layout& l, std::string job)
      : l_(l), job_(std::move(job)), full_(l.distinct()) {}
  const pb::ReportRegistrationRequest& Full(uint32_t rank) {
    auto& f = full_[l_.layout_of(rank)];
    if (f.shards_size() == 0) {
      for (uint32_t t = 0; t < l_.tensors; ++t) AddShard(l_, rank, t, &f);
      f.set_layout_fingerprint(ckpt::FingerprintLayout(f.shards()).ToBytes());
    }
    f.set_node_id(l_.node(rank));
    f.set_job(job_);
    f.set_rank(rank);
    f.set_world_size(l_.ranks);
    f.set_registration_id(1000 + rank);
    return f;
  }
  pb::ReportRegistrationRequest Brief(uint32_t rank) {
    const auto& f = Full(rank);
    pb::ReportRegistrationRequest b;
    b.set_node_id(f.node_id());
    b.set_job(f.job());
    b.set_rank(rank);
    b.set_world_size(f.world_size());
    b.set_registration_id(f.registration_id());
    b.set_layout_fingerprint(f.layout_fingerprint());
    return b;
  }

 private:
  const Layout& l_;
  std::string job_;
  std::vector<pb::ReportRegistrationRequest> full_;
};

// The node manifest of `node` for one step once its first `persisted` ranks have persisted, as
// its daemon reports it: each rank lists the shards it writes (all it holds without a plan) and
// names the registration it skipped the others under.
pb::NodeManifest NodeManifest(const Layout& l, const std::string& job, uint64_t step, uint32_t node,
                              const ckpt::WriterAssignment* plan, uint32_t persisted) {
  constexpr uint64_t kChunk = 4ull << 20;
  pb::NodeManifest m;
  m.set_format_version(ckpt::kFormatVersion);
  m.set_job(job);
  m.set_step(step);
  m.set_world_size(l.ranks);
  m.set_node_id("node" + std::to_string(node));
  const uint32_t first = node * l.per_node;
  for (uint32_t rank = first;
       rank < std::min({l.ranks, (node + 1) * l.per_node, first + persisted}); ++rank) {
    std::vector<uint32_t> all(l.tensors);
    for (uint32_t i = 0; i < all.size(); ++i) all[i] = i;
    const std::vector<uint32_t>* writes = &all;
    if (plan != nullptr) {
      const ptrdiff_t index = plan->IndexOf(rank);
      if (index < 0) std::exit(1);
      writes = &plan->writes[static_cast<size_t>(index)];
    }
    uint64_t offset = 0;
    for (uint32_t i : *writes) {  // a shard's index in a layout is its tensor number here
      pb::ReportRegistrationRequest one;
      AddShard(l, rank, i, &one);
      const auto& s = one.shards(0);
      auto* t = m.add_tensors();
      t->set_name(s.name());
      t->set_dtype(s.dtype());
      *t->mutable_global_shape() = s.global_shape();
      auto* stored = t->add_shards();
      *stored->mutable_geometry() = s.geometry();
      stored->set_file(ckpt::DataFileName(rank));
      stored->set_offset(offset);
      stored->set_length(s.bytes());
      stored->set_chunk_size(kChunk);
      for (uint64_t c = 0; c < (s.bytes() + kChunk - 1) / kChunk; ++c) {
        stored->add_chunk_xxh3(0x9E3779B97F4A7C15ull * (c + 1));
      }
      stored->set_writer_rank(rank);
      offset += (s.bytes() + 4095) / 4096 * 4096;
    }
    if (writes->size() < l.tensors) {
      // What a daemon reports for the rest: the registration it skipped them under.
      auto* under = m.add_skipped_under();
      under->set_rank(rank);
      under->set_registration_id(1000 + rank);  // Registrations::Full
      under->set_shards(static_cast<uint32_t>(l.tensors - writes->size()));
    }
    auto* r = m.add_ranks();
    r->set_rank(rank);
    r->set_node_id(m.node_id());
    r->set_extra(std::string(64, 'x'));
  }
  return m;
}

struct CommitResult {
  double report_ms = 0;  // all PERSISTED reports but the last, inside the core
  double commit_ms = 0;  // last report → COMMITTED
  uint64_t manifest_bytes = 0;
  uint64_t shards = 0;
  Clock::time_point last_report;
  double merge_ms = 0;  // last report → MANIFEST being written: merge, validation, coverage
  double write_ms = 0;  // MANIFEST and LATEST written and synced
};

CommitResult Commit(ckpt::CoordinatorCore& core, Sink& sink, const Layout& l,
                    const std::string& root, const std::string& job, uint64_t step,
                    const ckpt::WriterAssignment* plan) {
  std::filesystem::create_directories(ckpt::StepDir(root, job, step));
  CommitResult out;
  Clock::time_point last;
  // As a daemon does: a report each time another of the node's ranks persisted, each with the
  // node manifest of all its ranks persisted so far.
  for (uint32_t node = 0; node < l.nodes(); ++node) {
    for (uint32_t persisted = 1; persisted <= l.per_node; ++persisted) {
      pb::ReportRanksRequest req;
      req.set_node_id("node" + std::to_string(node));
      req.set_job(job);
      req.set_step(step);
      req.set_world_size(l.ranks);
      req.set_state(pb::STEP_STATE_PERSISTED);
      *req.mutable_node_manifest() = NodeManifest(l, job, step, node, plan, persisted);
      for (const auto& r : req.node_manifest().ranks()) req.add_ranks(r.rank());
      if (persisted == l.per_node) {
        for (const auto& t : req.node_manifest().tensors()) out.shards += t.shards_size();
      }
      const auto wire = OverTheWire(req);
      const auto start = Clock::now();
      if (!core.ReportRanks(wire).ok()) std::exit(1);
      last = start;
      const bool final = node + 1 == l.nodes() && persisted == l.per_node;
      if (!final) out.report_ms += Ms(Clock::now() - start);
    }
  }
  const auto committed = sink.Wait(job, step, pb::STEP_STATE_COMMITTED);
  out.commit_ms = Ms(committed - last);
  out.last_report = last;
  out.manifest_bytes = std::filesystem::file_size(ckpt::StepDir(root, job, step) + "/MANIFEST");
  return out;
}

double PeakRssMiB() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_coordinator: registration, plan and commit at scale"};
  Layout l{1024, 2000, 8, 1, 8};
  std::string root = "/tmp/bench-coordinator";
  int repeat = 3;
  bool no_baseline = false;
  bool json = false;
  app.add_option("--ranks", l.ranks, "world size")->capture_default_str();
  app.add_option("--tensors", l.tensors, "tensors per rank")->capture_default_str();
  app.add_option("--tp", l.tp, "tensor-parallel degree")->capture_default_str();
  app.add_option("--pp", l.pp, "pipeline stages (each holds its own tensors)")
      ->capture_default_str();
  app.add_option("--ranks-per-node", l.per_node, "ranks per simulated node")->capture_default_str();
  app.add_option("--root", root, "storage root (MANIFEST and LATEST are really written here)")
      ->capture_default_str();
  app.add_option("--repeat", repeat, "commits measured per variant (median reported)")
      ->capture_default_str();
  app.add_flag("--no-baseline", no_baseline,
               "skip the commit without a plan (every rank lists every shard: slow past ~2 M)");
  app.add_flag("--json", json, "print one JSON object on stdout instead of the table");
  CLI11_PARSE(app, argc, argv);
  if (l.tp == 0 || l.pp == 0 || l.per_node == 0 || l.ranks % (l.tp * l.pp) != 0) {
    std::fprintf(stderr, "bench_coordinator: --ranks must be a multiple of --tp × --pp\n");
    return 2;
  }
  ckpt::InitLogging("bench_coordinator", "warn");
  std::filesystem::remove_all(root);

  ckpt::CoordinatorCore::Config config;
  config.storage_root = root;
  uint64_t layout_bytes = 0, request_bytes = 0;
  config.on_registration = [&](size_t bytes, size_t layout) {
    request_bytes += bytes;  // the core's callers are this one thread
    layout_bytes += layout;
  };
  std::map<std::string, Clock::time_point> points;  // the last commit's, by name
  std::mutex points_mu;
  config.on_commit_point = [&](std::string_view point) {
    std::lock_guard lock(points_mu);
    points[std::string(point)] = Clock::now();
  };
  ckpt::CoordinatorCore core(config, ckpt::PosixFileSystem());
  if (!core.Start().ok()) return 1;
  auto sink = std::make_shared<Sink>();
  for (uint32_t n = 0; n < l.nodes(); ++n) {
    pb::RegisterNodeRequest req;
    req.set_node_id("node" + std::to_string(n));
    req.set_instance("bench");
    if (!core.RegisterNode(req, "bench").ok()) return 1;
    if (!core.AttachNode(req.node_id(), sink).ok()) return 1;
  }

  // Registrations, as a daemon's link sends them; the last completes the job.
  Registrations regs(l, "planned");
  uint64_t layouts_sent = 0;
  const auto reg_start = Clock::now();
  for (uint32_t r = 0; r < l.ranks; ++r) {
    auto answer = core.ReportRegistration(OverTheWire(regs.Brief(r)));
    if (!answer.ok()) return 1;
    if (answer->need_layout()) {
      ++layouts_sent;
      if (!core.ReportRegistration(OverTheWire(regs.Full(r))).ok()) return 1;
    }
  }
  const auto reg_end = Clock::now();
  core.WaitIdle();  // the plan thread
  const auto plan_end = Clock::now();
  const double reg_ms = Ms(reg_end - reg_start);
  const double plan_ms = Ms(plan_end - reg_end);
  auto plan = core.CurrentPlan("planned");
  if (!plan) return 1;
  uint64_t lo = UINT64_MAX, hi = 0;
  for (const auto& [node, bytes] : plan->node_bytes) {
    lo = std::min(lo, bytes);
    hi = std::max(hi, bytes);
  }

  auto median = [](std::vector<CommitResult> v) {
    std::sort(v.begin(), v.end(), [](const CommitResult& a, const CommitResult& b) {
      return a.commit_ms < b.commit_ms;
    });
    return v[v.size() / 2];
  };
  std::vector<CommitResult> with_plan, without_plan;
  for (int i = 0; i < repeat; ++i) {
    with_plan.push_back(Commit(core, *sink, l, root, "planned", i + 1, plan.get()));
    {
      std::lock_guard lock(points_mu);
      with_plan.back().merge_ms = Ms(points["before-manifest"] - with_plan.back().last_report);
      with_plan.back().write_ms = Ms(points["after-latest"] - points["before-manifest"]);
    }
    if (!no_baseline) {
      without_plan.push_back(Commit(core, *sink, l, root, "unplanned", i + 1, nullptr));
    }
  }
  const CommitResult p = median(with_plan);
  const double rss = PeakRssMiB();

  if (json) {
    std::printf(
        "{\"ranks\": %u, \"tensors\": %u, \"tp\": %u, \"pp\": %u, \"nodes\": %u, "
        "\"registered_shards\": %llu, \"distinct_shards\": %zu, \"distinct_layouts\": %zu, "
        "\"layouts_sent\": %llu, \"registration_bytes\": %llu, \"layout_bytes\": %llu, "
        "\"registration_ms\": %.1f, \"plan_ms\": %.1f, \"commit_ms\": %.1f, "
        "\"reports_ms\": %.1f, \"commit_merge_ms\": %.1f, \"commit_write_ms\": %.1f, "
        "\"manifest_bytes\": %llu, \"node_bytes_max_over_min\": %.4f, "
        "\"baseline_commit_ms\": %s, \"commits_merged_afresh\": %llu, \"peak_rss_mib\": %.0f}\n",
        l.ranks, l.tensors, l.tp, l.pp, l.nodes(),
        static_cast<unsigned long long>(uint64_t{l.ranks} * l.tensors), plan->distinct_shards,
        plan->distinct_layouts, static_cast<unsigned long long>(layouts_sent),
        static_cast<unsigned long long>(request_bytes),
        static_cast<unsigned long long>(layout_bytes), reg_ms, plan_ms, p.commit_ms, p.report_ms,
        p.merge_ms, p.write_ms, static_cast<unsigned long long>(p.manifest_bytes),
        lo == 0 ? 0.0 : double(hi) / double(lo),
        no_baseline ? "null" : std::to_string(median(without_plan).commit_ms).c_str(),
        static_cast<unsigned long long>(core.CommitsMergedAfresh()), rss);
  } else {
    std::printf(
        "bench_coordinator: %u ranks (%u nodes x %u), %u tensors per rank, TP=%u x PP=%u x "
        "DP=%u\n",
        l.ranks, l.nodes(), l.per_node, l.tensors, l.tp, l.pp, l.ranks / (l.tp * l.pp));
    std::printf(
        "registration of %u ranks: %.1f ms (%llu layouts sent, %.2f MiB in all); plan: %.1f ms "
        "(%zu distinct layouts, %zu distinct shards)\n",
        l.ranks, reg_ms, static_cast<unsigned long long>(layouts_sent),
        request_bytes / double(1 << 20), plan_ms, plan->distinct_layouts, plan->distinct_shards);
    std::printf("plan: %.2f GiB registered, %.2f GiB written; node bytes max/min = %.4f\n",
                plan->registered_bytes / double(1ull << 30),
                plan->unique_bytes / double(1ull << 30), lo == 0 ? 0.0 : double(hi) / double(lo));
    std::printf("%-22s %12s %14s %14s %12s\n", "variant", "shards in", "reports (ms)",
                "commit (ms)", "MANIFEST");
    auto row = [](const char* name, const CommitResult& c) {
      std::printf("%-22s %12llu %14.1f %14.1f %9.2f MiB\n", name,
                  static_cast<unsigned long long>(c.shards), c.report_ms, c.commit_ms,
                  c.manifest_bytes / double(1 << 20));
    };
    row("write-once plan", p);
    if (!no_baseline) {
      const CommitResult b = median(without_plan);
      row("baseline: no plan", b);
      std::printf("commit latency with plan / without: %.3f\n", p.commit_ms / b.commit_ms);
    }
    std::printf("peak RSS of this process: %.0f MiB\n", rss);
  }
  core.Stop();
  std::filesystem::remove_all(root);
  return 0;
}
