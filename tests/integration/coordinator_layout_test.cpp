// A job that restarts into a new parallel layout, with real processes on loopback: one
// ckpt-coordinator, three daemons, 8 ranks spread over the nodes (rank r on node r % 3). Four
// incarnations of the trainers, each in a new layout — replicated, row-sharded (TP 2),
// column-sharded (TP 4), flat ranges (TP 8) — save two steps each. Within an incarnation half of
// the ranks register and save before the other half even connects, in a shuffled order.
//
// What must hold: the first save of every incarnation commits (the writer plan of a step comes
// from that step's registrations, never from the previous trainers'); the second save writes
// each replica once (the new plan is in force); every committed step loads, bit-exact, into
// other layouts.
// coordinator_harness.h includes daemon_harness.h first (it configures Catch).
#include "tests/integration/coordinator_harness.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <random>

#include "ckptd/v1/admin.grpc.pb.h"
#include "tests/integration/admin_client.h"

namespace {

using ckpt::itest::CommittedSteps;
using ckpt::itest::CoordinatorProcess;
using ckpt::itest::DaemonProcess;
using ckpt::itest::DataFileBytes;
using ckpt::itest::GetStatus;
using ckpt::itest::ModelRank;
using ckpt::itest::PollUntil;
using ckpt::itest::StartNodes;
using ckpt::itest::WaitForWriterPlans;
using ckpt::itest::WriterPlansApplied;
using ckpt::testing::CoordinatorModel;
using ckpt::testing::TempDir;
using Split = CoordinatorModel::Split;

constexpr uint32_t kWorld = 8;
constexpr uint32_t kTensors = 4;
constexpr int kNodes = 3;
const char* kJob = "relayout";

struct Incarnation {
  const char* layout;
  Split split;
  uint32_t tp;
  uint64_t first_step;  // saves first_step and first_step + 1
};

// The job's writer plan as the coordinator reports it (nullptr: none known); points into `s`.
const ckptd::v1::WriterPlanStatus* PlanOf(const ckptd::v1::GetStatusResponse& s) {
  for (const auto& p : s.writer_plans()) {
    if (p.job() == kJob) return &p;
  }
  return nullptr;
}

}  // namespace

TEST_CASE(
    "coordinator: trainers restarting into a new layout (replicated, rows, columns, flat) "
    "commit their first save, late and out-of-order registration included",
    "[coordinator][layout]") {
  TempDir dir;
  CoordinatorProcess::Options o;
  o.socket = dir / "coord.sock";
  o.storage_root = dir / "root";
  o.log_path = dir / "coordinator.log";
  CoordinatorProcess coordinator(o);
  auto nodes = StartNodes(dir, dir / "root", coordinator.address(), kNodes);
  auto admin = ckptd::v1::Admin::NewStub(
      grpc::CreateChannel(coordinator.address(), grpc::InsecureChannelCredentials()));
  const std::string root = dir / "root";
  const uint64_t unique = CoordinatorModel::UniqueBytes(kTensors);

  const std::vector<Incarnation> incarnations = {
      {"replicated", Split::kRows, 1, 1},
      {"row-sharded", Split::kRows, 2, 3},
      {"column-sharded", Split::kCols, 4, 5},
      {"flat", Split::kFlat, 8, 7},
  };
  std::mt19937 rng(20261125);
  for (const Incarnation& inc : incarnations) {
    INFO("incarnation: " << inc.layout << " (TP " << inc.tp << "), steps " << inc.first_step
                         << " and " << inc.first_step + 1);
    // The previous trainers are gone; the coordinator has heard so from every node (a real
    // restart takes seconds: process start, imports, restore).
    REQUIRE(PollUntil([&] {
      const auto status = GetStatus(*admin);
      const auto* plan = PlanOf(status);
      return plan == nullptr || plan->ranks_registered() == 0;
    }));
    std::vector<const DaemonProcess*> node_list;
    std::vector<size_t> plans_before;
    for (const auto& n : nodes) {
      node_list.push_back(n.get());
      plans_before.push_back(WriterPlansApplied(*n, kJob));
    }

    std::vector<uint32_t> order(kWorld);
    for (uint32_t r = 0; r < kWorld; ++r) order[r] = r;
    std::shuffle(order.begin(), order.end(), rng);
    std::map<uint32_t, std::unique_ptr<ModelRank>> ranks;
    auto start = [&](uint32_t r) {
      ranks[r] = std::make_unique<ModelRank>(nodes[r % kNodes]->socket(), kJob, r, kWorld, inc.tp,
                                             kTensors, inc.split);
    };
    // First half: connect, register and save the first step before the others exist.
    for (size_t i = 0; i < kWorld / 2; ++i) start(order[i]);
    for (size_t i = 0; i < kWorld / 2; ++i) REQUIRE_OK(ranks[order[i]]->SaveStep(inc.first_step));
    // Second half, late, registering in reverse.
    for (size_t i = kWorld; i-- > kWorld / 2;) start(order[i]);
    for (size_t i = kWorld / 2; i < kWorld; ++i) {
      REQUIRE_OK(ranks[order[i]]->SaveStep(inc.first_step));
    }
    for (auto& [r, rank] : ranks) {
      INFO("rank " << r);
      CHECK_OK(rank->WaitCommitted(inc.first_step));
    }
    // The first save wrote everything each rank holds (no plan for the new layout yet)...
    CHECK(DataFileBytes(root, kJob, inc.first_step) >= unique);
    WaitForWriterPlans(node_list, kJob, plans_before);

    std::shuffle(order.begin(), order.end(), rng);
    for (uint32_t r : order) REQUIRE_OK(ranks[r]->SaveStep(inc.first_step + 1));
    for (auto& [r, rank] : ranks) {
      INFO("rank " << r);
      CHECK_OK(rank->WaitCommitted(inc.first_step + 1));
    }
    // ...and the second each replica once: the new plan is in force on every node.
    CHECK(DataFileBytes(root, kJob, inc.first_step + 1) == unique);
    const auto status = GetStatus(*admin);
    const auto* plan = PlanOf(status);
    REQUIRE(plan != nullptr);
    CHECK(plan->in_force());
    CHECK(plan->ranks_registered() == kWorld);
    CHECK(plan->unique_bytes() == unique);
    ranks.clear();  // the trainers exit
  }
  REQUIRE(CommittedSteps(root, kJob) == std::vector<uint64_t>{1, 2, 3, 4, 5, 6, 7, 8});

  // Every committed step restores bit-exact into a layout it was not saved in: two ranks,
  // row-sharded, for the steps of the replicated, column and flat incarnations.
  REQUIRE(PollUntil([&] {
    const auto status = GetStatus(*admin);
    const auto* plan = PlanOf(status);
    return plan == nullptr || plan->ranks_registered() == 0;
  }));
  for (uint64_t step : {2u, 5u, 8u}) {
    INFO("load step " << step);
    for (uint32_t r = 0; r < 2; ++r) {
      ModelRank loader(nodes[r]->socket(), kJob, r, 2, 2, kTensors, Split::kRows);
      auto bad = loader.LoadAndCheck(step);
      REQUIRE_OK(bad);
      CHECK(*bad == 0);
    }
  }
}
