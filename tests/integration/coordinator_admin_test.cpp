// ckpt-coordinator's operations surface, with real processes: the same ckptd.v1.Admin API a
// daemon serves (role "coordinator": registered nodes, steps waiting for ranks, failures), health
// and the systemd notify protocol, read through the generated stubs and through ckptctl.
// coordinator_harness.h includes daemon_harness.h first (it configures Catch).
#include "tests/integration/coordinator_harness.h"

#include <grpcpp/grpcpp.h>

#include "ckptd/v1/admin.grpc.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "tests/integration/admin_client.h"

namespace {

using ckpt::itest::BindDatagramSocket;
using ckpt::itest::CoordinatorProcess;
using ckpt::itest::Deadline;
using ckpt::itest::ExitedWith;
using ckpt::itest::GetStatus;
using ckpt::itest::ModelRank;
using ckpt::itest::PollUntil;
using ckpt::itest::ReceiveDatagram;
using ckpt::itest::RunCkptctl;
using ckpt::itest::StartNodes;
using ckpt::testing::TempDir;
using ckptd::v1::Admin;
using grpc::health::v1::HealthCheckResponse;

CoordinatorProcess::Options CoordinatorIn(const TempDir& dir, std::vector<std::string> env = {}) {
  CoordinatorProcess::Options o;
  o.socket = dir / "coord.sock";
  o.storage_root = dir / "root";
  o.log_path = dir / "coordinator.log";
  o.flags = {"--lease", "60s"};  // a killed node stays "disconnected" for the whole test
  o.env = std::move(env);
  return o;
}

const ckptd::v1::NodeStatus* FindNode(const ckptd::v1::GetStatusResponse& s,
                                      const std::string& id) {
  for (const auto& n : s.nodes()) {
    if (n.node_id() == id) return &n;
  }
  return nullptr;
}

}  // namespace

TEST_CASE(
    "coordinator admin: status shows nodes and a step waiting for a rank, watch sees it commit, "
    "list and describe read it",
    "[coordinator][admin][ops]") {
  TempDir dir;
  const std::string notify_path = dir / "notify.sock";
  ckpt::UniqueFd notify = BindDatagramSocket(notify_path);
  CoordinatorProcess coordinator(CoordinatorIn(dir, {"NOTIFY_SOCKET=" + notify_path}));
  CHECK_THAT(ReceiveDatagram(notify.get(), 30000), Catch::Contains("READY=1"));
  auto nodes = StartNodes(dir, dir / "root", coordinator.address(), 2);

  auto channel = grpc::CreateChannel(coordinator.address(), grpc::InsecureChannelCredentials());
  auto admin = Admin::NewStub(channel);
  {
    auto health = grpc::health::v1::Health::NewStub(channel);
    HealthCheckResponse r;
    auto ctx = Deadline();
    REQUIRE(health->Check(ctx.get(), {}, &r).ok());
    CHECK(r.status() == HealthCheckResponse::SERVING);
  }

  grpc::ClientContext watch_ctx;
  watch_ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  ckptd::v1::WatchEventsRequest request;
  request.set_job("ops");
  request.set_progress_interval_ms(100);
  auto reader = admin->WatchEvents(&watch_ctx, request);
  reader->WaitForInitialMetadata();  // subscribed: no event after this is missed

  // Rank 0 (node n0) saves step 1; rank 1 (node n1) has not yet: the coordinator shows the
  // step waiting, with the rank it has and where it lives.
  ModelRank r0(nodes[0]->socket(), "ops", 0, 2, 1, 4);
  ModelRank r1(nodes[1]->socket(), "ops", 1, 2, 1, 4);
  REQUIRE_OK(r0.SaveStep(1));
  ckptd::v1::GetStatusResponse s;
  REQUIRE(PollUntil([&] {
    s = GetStatus(*admin);
    return s.steps_size() == 1 && s.steps(0).ranks_size() == 1 && s.steps(0).ranks(0).persisted();
  }));
  CHECK(s.role() == "coordinator");
  CHECK(s.serving());
  CHECK(s.steps(0).job() == "ops");
  CHECK(s.steps(0).step() == 1);
  CHECK(s.steps(0).world_size() == 2);
  CHECK(s.steps(0).ranks_saved() == 1);
  CHECK(s.steps(0).ranks(0).rank() == 0);
  CHECK(s.steps(0).ranks(0).node_id() == "n0");
  REQUIRE(s.nodes_size() == 2);
  for (const char* id : {"n0", "n1"}) {
    const auto* n = FindNode(s, id);
    REQUIRE(n != nullptr);
    CHECK(n->connected());
  }
  REQUIRE(FindNode(s, "n0")->jobs_size() == 1);
  CHECK(FindNode(s, "n0")->jobs(0) == "ops");

  // ckptctl reads the coordinator as it reads a daemon.
  {
    auto [code, out] = RunCkptctl(dir, {"status", "--admin", coordinator.address()});
    INFO(out);
    CHECK(code == 0);
    CHECK_THAT(out, Catch::Contains("coordinator") && Catch::Contains("nodes: 2") &&
                        Catch::Contains("RANKS PERSISTED"));
  }

  // While the step waits for rank 1, the watch stream samples its progress: one rank of two
  // persisted, on n0. (No state was decided yet, so progress is all the stream has.)
  ckptd::v1::WatchEventsResponse e;
  do {
    REQUIRE(reader->Read(&e));
    REQUIRE(e.has_progress());
    REQUIRE(e.progress().step() == 1);
  } while (e.progress().ranks_size() != 1 || !e.progress().ranks(0).persisted());
  CHECK(e.progress().ranks_saved() == 1);
  REQUIRE(e.progress().ranks_size() == 1);
  CHECK(e.progress().ranks(0).node_id() == "n0");
  CHECK(e.progress().ranks(0).persisted());

  REQUIRE_OK(r1.SaveStep(1));
  REQUIRE_OK(r0.WaitCommitted(1));
  REQUIRE_OK(r1.WaitCommitted(1));
  std::vector<ckptd::v1::StepState> states;
  while (states.empty() || states.back() != ckptd::v1::STEP_STATE_COMMITTED) {
    REQUIRE(reader->Read(&e));
    if (e.has_progress()) continue;
    REQUIRE(e.has_state_change());
    CHECK(e.state_change().step() == 1);
    states.push_back(e.state_change().state());
  }
  using namespace ckptd::v1;
  CHECK(states ==
        std::vector<StepState>{STEP_STATE_CAPTURED, STEP_STATE_PERSISTED, STEP_STATE_COMMITTED});

  ckptd::v1::ListCheckpointsRequest list_request;
  list_request.set_job("ops");
  ckptd::v1::ListCheckpointsResponse list;
  {
    auto ctx = Deadline();
    REQUIRE(admin->ListCheckpoints(ctx.get(), list_request, &list).ok());
  }
  CHECK(std::vector<uint64_t>(list.steps().begin(), list.steps().end()) ==
        std::vector<uint64_t>{1});
  CHECK(list.latest() == 1);
  ckptd::v1::DescribeCheckpointRequest describe_request;
  describe_request.set_job("ops");
  describe_request.set_step(1);
  ckptd::v1::DescribeCheckpointResponse describe;
  {
    auto ctx = Deadline();
    REQUIRE(admin->DescribeCheckpoint(ctx.get(), describe_request, &describe).ok());
  }
  CHECK(describe.manifest().ranks_size() == 2);

  // A node that dies is shown disconnected, with the time left on its lease.
  REQUIRE(nodes[1]->Kill().has_value());
  REQUIRE(PollUntil([&] {
    s = GetStatus(*admin);
    const auto* n = FindNode(s, "n1");
    return n != nullptr && !n->connected();
  }));
  CHECK(FindNode(s, "n1")->lease_left_seconds() > 0);
  CHECK(FindNode(s, "n0")->connected());

  // SIGTERM: STOPPING=1, the open watch stream ends, the process exits 0.
  coordinator.process().Signal(SIGTERM);
  std::string message;
  REQUIRE(PollUntil([&] {
    message = ReceiveDatagram(notify.get(), 100);
    return message.find("STOPPING=1") != std::string::npos;
  }));
  while (reader->Read(&e)) {
  }
  CHECK(reader->Finish().error_code() == grpc::StatusCode::UNAVAILABLE);
  CHECK(ExitedWith(coordinator.process().Wait(), 0));
}
