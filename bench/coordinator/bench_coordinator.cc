// bench_coordinator: the coordinator's cost at scale, with no data moved (bench/README.md,
// "Coordinator"). A load generator plays N nodes of R ranks each, T tensors per rank, in a
// TP × DP layout (every tensor split in TP row slices, each slice replicated over DP ranks), and
// drives an in-process CoordinatorCore exactly as daemons do: RegisterNode, Watch (a sink),
// ReportRegistration per rank, then per node a PERSISTED report with its node manifest. Every
// request goes through protobuf serialize + parse first, the CPU part of the wire.
//
// Measured, in one run, on one storage root:
//   plan       time of the ReportRegistration that completes the job (it computes the plan);
//   commit     from the last node's PERSISTED report to the COMMITTED event: merge, validation,
//              coverage check, MANIFEST temp+fsync+rename+fsync dir, LATEST the same way;
//   baseline   the same commit with no writer plan (every rank lists every shard it holds; the
//              merge drops the replicas) — what write-once saves the commit path;
//   manifest   size of the MANIFEST file written.
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <mutex>

#include "common/file_system.h"
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
    std::lock_guard lock(mu_);
    if (e.has_step()) {
      last_[{e.step().job(), e.step().step()}] = e.step().state();
      at_ = Clock::now();
      reason_ = e.step().reason();
    }
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
  uint32_t ranks, tensors, tp, per_node;
  uint64_t rows(uint32_t t) const { return 64ull * (1 + t % 16); }  // rows per TP slice
  static constexpr uint64_t kCols = 4096;
  uint64_t bytes(uint32_t t) const { return rows(t) * kCols * 2; }  // bfloat16
  std::string node(uint32_t rank) const { return "node" + std::to_string(rank / per_node); }
};

template <typename M>
M OverTheWire(const M& m) {
  M out;
  out.ParseFromString(m.SerializeAsString());
  return out;
}

pb::ReportRegistrationRequest Registration(const Layout& l, const std::string& job, uint32_t rank) {
  pb::ReportRegistrationRequest req;
  req.set_node_id(l.node(rank));
  req.set_job(job);
  req.set_rank(rank);
  req.set_world_size(l.ranks);
  const uint32_t slice = rank % l.tp;
  for (uint32_t t = 0; t < l.tensors; ++t) {
    auto* s = req.add_shards();
    s->set_name("layers." + std::to_string(t / 8) + ".w" + std::to_string(t % 8));
    s->set_dtype("bfloat16");
    s->add_global_shape(l.rows(t) * l.tp);
    s->add_global_shape(Layout::kCols);
    auto* box = s->mutable_geometry()->mutable_box();
    box->add_offsets(slice * l.rows(t));
    box->add_offsets(0);
    box->add_lengths(l.rows(t));
    box->add_lengths(Layout::kCols);
    s->set_bytes(l.bytes(t));
  }
  return req;
}

// Node manifests of one step: each rank lists the shards it writes (all of them without a plan).
std::map<std::string, pb::NodeManifest> NodeManifests(
    const Layout& l, const std::string& job, uint64_t step,
    const std::optional<ckpt::WriterAssignment>& plan) {
  std::map<std::string, pb::NodeManifest> out;
  constexpr uint64_t kChunk = 4ull << 20;
  for (uint32_t rank = 0; rank < l.ranks; ++rank) {
    pb::NodeManifest& m = out[l.node(rank)];
    if (m.job().empty()) {
      m.set_format_version(ckpt::kFormatVersion);
      m.set_job(job);
      m.set_step(step);
      m.set_world_size(l.ranks);
      m.set_node_id(l.node(rank));
    }
    std::set<std::string> skip;
    if (plan) {
      auto it = plan->skips.find(rank);
      if (it != plan->skips.end()) skip.insert(it->second.begin(), it->second.end());
    }
    const auto reg = Registration(l, job, rank);
    uint64_t offset = 0;
    for (const auto& s : reg.shards()) {
      if (skip.count(s.name()) != 0) continue;
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
    auto* r = m.add_ranks();
    r->set_rank(rank);
    r->set_node_id(l.node(rank));
    r->set_extra(std::string(64, 'x'));
  }
  return out;
}

struct CommitResult {
  double report_ms = 0;  // all PERSISTED reports but the last
  double commit_ms = 0;  // last report → COMMITTED
  uint64_t manifest_bytes = 0;
  uint64_t shards = 0;
};

CommitResult Commit(ckpt::CoordinatorCore& core, Sink& sink, const Layout& l,
                    const std::string& root, const std::string& job, uint64_t step,
                    const std::optional<ckpt::WriterAssignment>& plan) {
  std::filesystem::create_directories(ckpt::StepDir(root, job, step));
  auto manifests = NodeManifests(l, job, step, plan);
  CommitResult out;
  for (const auto& [node, m] : manifests) {
    for (const auto& t : m.tensors()) out.shards += t.shards_size();
  }
  std::vector<pb::ReportRanksRequest> reports;
  for (auto& [node, m] : manifests) {
    pb::ReportRanksRequest req;
    req.set_node_id(node);
    req.set_job(job);
    req.set_step(step);
    req.set_world_size(l.ranks);
    req.set_state(pb::STEP_STATE_PERSISTED);
    for (const auto& r : m.ranks()) req.add_ranks(r.rank());
    *req.mutable_node_manifest() = std::move(m);
    reports.push_back(std::move(req));
  }
  const auto start = Clock::now();
  for (size_t i = 0; i + 1 < reports.size(); ++i) {
    if (!core.ReportRanks(OverTheWire(reports[i])).ok()) std::exit(1);
  }
  const auto last = Clock::now();
  out.report_ms = Ms(last - start);
  if (!core.ReportRanks(OverTheWire(reports.back())).ok()) std::exit(1);
  const auto committed = sink.Wait(job, step, pb::STEP_STATE_COMMITTED);
  out.commit_ms = Ms(committed - last);
  out.manifest_bytes = std::filesystem::file_size(ckpt::StepDir(root, job, step) + "/MANIFEST");
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_coordinator: commit latency, manifest size and plan time at scale"};
  Layout l{1024, 2000, 8, 8};
  std::string root = "/tmp/bench-coordinator";
  int repeat = 3;
  app.add_option("--ranks", l.ranks, "world size");
  app.add_option("--tensors", l.tensors, "tensors per rank");
  app.add_option("--tp", l.tp, "tensor-parallel degree (the rest is data-parallel)");
  app.add_option("--ranks-per-node", l.per_node, "ranks per simulated node");
  app.add_option("--root", root, "storage root (MANIFEST and LATEST are really written here)");
  app.add_option("--repeat", repeat, "commits measured per variant (median reported)");
  CLI11_PARSE(app, argc, argv);
  ckpt::InitLogging("bench_coordinator", "warn");
  std::filesystem::remove_all(root);

  ckpt::CoordinatorCore::Config config;
  config.storage_root = root;
  ckpt::CoordinatorCore core(config, ckpt::PosixFileSystem());
  if (!core.Start().ok()) return 1;
  auto sink = std::make_shared<Sink>();
  const uint32_t nodes = (l.ranks + l.per_node - 1) / l.per_node;
  for (uint32_t n = 0; n < nodes; ++n) {
    pb::RegisterNodeRequest req;
    req.set_node_id("node" + std::to_string(n));
    req.set_instance("bench");
    if (!core.RegisterNode(req, "bench").ok()) return 1;
    if (!core.AttachNode(req.node_id(), sink).ok()) return 1;
  }

  // Registrations: the last one computes the writer plan.
  std::vector<pb::ReportRegistrationRequest> regs;
  for (uint32_t r = 0; r < l.ranks; ++r) regs.push_back(Registration(l, "planned", r));
  const auto reg_start = Clock::now();
  for (uint32_t r = 0; r + 1 < l.ranks; ++r) {
    if (!core.ReportRegistration(OverTheWire(regs[r])).ok()) return 1;
  }
  const auto plan_start = Clock::now();
  if (!core.ReportRegistration(OverTheWire(regs.back())).ok()) return 1;
  const double plan_ms = Ms(Clock::now() - plan_start);
  const double reg_ms = Ms(plan_start - reg_start);
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
    with_plan.push_back(Commit(core, *sink, l, root, "planned", i + 1, plan));
    without_plan.push_back(Commit(core, *sink, l, root, "unplanned", i + 1, std::nullopt));
  }
  const CommitResult p = median(with_plan);
  const CommitResult b = median(without_plan);

  std::printf("bench_coordinator: %u ranks (%u nodes x %u), %u tensors per rank, TP=%u x DP=%u\n",
              l.ranks, nodes, l.per_node, l.tensors, l.tp, l.ranks / l.tp);
  std::printf("registration of %u ranks: %.1f ms; plan (the last registration): %.1f ms\n", l.ranks,
              reg_ms, plan_ms);
  std::printf("plan: %.2f GiB registered, %.2f GiB written; node bytes max/min = %.4f\n",
              plan->registered_bytes / double(1ull << 30), plan->unique_bytes / double(1ull << 30),
              lo == 0 ? 0.0 : double(hi) / double(lo));
  std::printf("%-22s %12s %14s %14s %12s\n", "variant", "shards in", "reports (ms)", "commit (ms)",
              "MANIFEST");
  std::printf("%-22s %12llu %14.1f %14.1f %9.2f MiB\n", "write-once plan",
              static_cast<unsigned long long>(p.shards), p.report_ms, p.commit_ms,
              p.manifest_bytes / double(1 << 20));
  std::printf("%-22s %12llu %14.1f %14.1f %9.2f MiB\n", "baseline: no plan",
              static_cast<unsigned long long>(b.shards), b.report_ms, b.commit_ms,
              b.manifest_bytes / double(1 << 20));
  std::printf("commit latency with plan / without: %.3f; goal < 2000 ms: %s\n",
              p.commit_ms / b.commit_ms, p.commit_ms < 2000 ? "met" : "NOT met");
  core.Stop();
  std::filesystem::remove_all(root);
  return 0;
}
