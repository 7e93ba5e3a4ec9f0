// The admin endpoint of a real daemon, through the generated gRPC stubs: status (clients, steps in
// flight with their bytes, recent failures), list, describe, watch streams, health while serving
// and draining, and the Prometheus endpoint as a scraper sees it.
#include "tests/integration/daemon_harness.h"  // first: it configures Catch

#include <grpcpp/grpcpp.h>

#include <future>

#include "ckptd/v1/admin.grpc.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "tests/integration/admin_client.h"
#include "tests/integration/http_scrape.h"

namespace {

using ckpt::itest::ConfigValue;
using ckpt::itest::DaemonProcess;
using ckpt::itest::Deadline;
using ckpt::itest::ExitedWith;
using ckpt::itest::GetStatus;
using ckpt::itest::HttpGet;
using ckpt::itest::InProcessRank;
using ckpt::itest::PollUntil;
using ckpt::itest::Sample;
using ckpt::testing::TempDir;
using ckptd::v1::Admin;
using grpc::health::v1::Health;
using grpc::health::v1::HealthCheckResponse;

std::shared_ptr<grpc::Channel> AdminChannel(const DaemonProcess& d) {
  return grpc::CreateChannel("unix:" + d.admin_socket(), grpc::InsecureChannelCredentials());
}

HealthCheckResponse::ServingStatus Health(const std::shared_ptr<grpc::Channel>& channel) {
  auto stub = Health::NewStub(channel);
  HealthCheckResponse r;
  auto ctx = Deadline();
  const grpc::Status st = stub->Check(ctx.get(), {}, &r);
  INFO("Health/Check: " << st.error_message());
  REQUIRE(st.ok());
  return r.status();
}

// A rank of `job` in this process: registered, ready to save.
struct Rank {
  Rank(const DaemonProcess& d, const std::string& job, uint32_t rank, uint32_t world)
      : data(4ull << 20, 4, rank, world, 7), client(d.Connect(job, rank, world)) {
    REQUIRE_OK(client->Register(data.Specs()));
  }
  void Save(uint64_t step) {
    data.Fill(step);
    REQUIRE_OK(client->Save(step, data.Extra(step)));
  }
  uint64_t shard_bytes() const {
    uint64_t n = 0;
    for (const auto& t : data.Specs()) n += t.nbytes;
    return n;
  }
  InProcessRank data;
  std::unique_ptr<ckpt::Client> client;
};

}  // namespace

TEST_CASE("admin: status shows connected ranks and an in-flight step's bytes per rank",
          "[admin][ops]") {
  TempDir dir;
  DaemonProcess daemon(DaemonProcess::InDir(dir));
  auto channel = AdminChannel(daemon);
  auto admin = Admin::NewStub(channel);
  CHECK(Health(channel) == HealthCheckResponse::SERVING);

  Rank r0(daemon, "opsjob", 0, 2);
  r0.Save(1);
  REQUIRE_OK(r0.client->WaitSnapshot());  // rank 0 captured; rank 1 has not saved

  const auto s = GetStatus(*admin);
  CHECK(s.node_id() == "itest-node");
  CHECK(s.role() == "daemon");
  CHECK(s.serving());
  CHECK_FALSE(s.draining());
  CHECK(ConfigValue(s, "storage-root") == daemon.root());
  CHECK(s.pool().total_bytes() == 64ull << 20);
  CHECK(s.pool().total_bytes() ==
        s.pool().free_bytes() + s.pool().cached_bytes() + s.pool().in_use_bytes());
  bool found_client = false;
  for (const auto& c : s.clients()) {
    if (c.job() == "opsjob") {
      found_client = true;
      CHECK(c.rank() == 0);
      CHECK(c.world_size() == 2);
      CHECK(c.pid() == ::getpid());
      CHECK(c.uid() == ::getuid());
    }
  }
  CHECK(found_client);
  REQUIRE(s.steps_size() == 1);
  const auto& step = s.steps(0);
  CHECK(step.job() == "opsjob");
  CHECK(step.step() == 1);
  CHECK(step.state() == ckptd::v1::STEP_STATE_CAPTURING);  // waits for rank 1
  CHECK(step.world_size() == 2);
  CHECK(step.ranks_saved() == 1);
  REQUIRE(step.ranks_size() == 1);
  CHECK(step.ranks(0).captured());
  CHECK(step.ranks(0).bytes_total() == r0.shard_bytes());
  CHECK(step.ranks(0).bytes_captured() == r0.shard_bytes());
  CHECK(step.bytes_total() == r0.shard_bytes());

  // Rank 1 completes the step; then it is listed and described, and no longer in flight.
  Rank r1(daemon, "opsjob", 1, 2);
  r1.Save(1);
  REQUIRE_OK(r1.client->Wait(1, ckpt::WaitState::kCommitted));
  CHECK(GetStatus(*admin).steps_size() == 0);

  ckptd::v1::ListCheckpointsRequest list_request;
  list_request.set_job("opsjob");
  ckptd::v1::ListCheckpointsResponse list;
  REQUIRE(admin->ListCheckpoints(Deadline().get(), list_request, &list).ok());
  REQUIRE(list.steps_size() == 1);
  CHECK(list.steps(0) == 1);
  CHECK(list.latest() == 1);

  ckptd::v1::DescribeCheckpointRequest describe_request;
  describe_request.set_job("opsjob");
  describe_request.set_step(1);
  ckptd::v1::DescribeCheckpointResponse described;
  REQUIRE(admin->DescribeCheckpoint(Deadline().get(), describe_request, &described).ok());
  CHECK(described.manifest().job() == "opsjob");
  CHECK(described.manifest().step() == 1);
  CHECK(described.manifest().world_size() == 2);
  CHECK(described.manifest().tensors_size() == 4);
  CHECK(described.path() == ckpt::StepDir(daemon.root(), "opsjob", 1));

  SECTION("bad requests get precise errors") {
    describe_request.set_step(2);
    auto ctx = Deadline();
    grpc::Status st = admin->DescribeCheckpoint(ctx.get(), describe_request, &described);
    CHECK(st.error_code() == grpc::StatusCode::NOT_FOUND);
    CHECK_THAT(st.error_message(), Catch::Contains("step 2"));
    describe_request.set_job("../escape");
    auto ctx2 = Deadline();
    st = admin->DescribeCheckpoint(ctx2.get(), describe_request, &described);
    CHECK(st.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    list_request.set_job("never-saved");
    auto ctx3 = Deadline();
    REQUIRE(admin->ListCheckpoints(ctx3.get(), list_request, &list).ok());
    CHECK(list.steps_size() == 0);
    CHECK_FALSE(list.has_latest());
  }
}

TEST_CASE("admin: a watch stream gets every state of a step in order, then progress samples",
          "[admin][ops]") {
  TempDir dir;
  DaemonProcess daemon(DaemonProcess::InDir(dir));
  auto channel = AdminChannel(daemon);
  auto admin = Admin::NewStub(channel);

  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  ckptd::v1::WatchEventsRequest request;
  request.set_job("watched");
  request.set_progress_interval_ms(100);
  auto reader = admin->WatchEvents(&ctx, request);
  reader->WaitForInitialMetadata();  // subscribed: no event after this is missed
  CHECK(GetStatus(*admin).watch_streams() == 1);

  {
    Rank other(daemon, "other-job", 0, 1);  // filtered out by the job filter
    other.Save(1);
    REQUIRE_OK(other.client->Wait(1, ckpt::WaitState::kCommitted));
  }
  Rank r(daemon, "watched", 0, 1);
  r.Save(1);
  REQUIRE_OK(r.client->Wait(1, ckpt::WaitState::kCommitted));

  std::vector<ckptd::v1::StepState> states;
  ckptd::v1::WatchEventsResponse e;
  while (states.empty() || states.back() != ckptd::v1::STEP_STATE_COMMITTED) {
    REQUIRE(reader->Read(&e));
    CHECK(e.unix_time_ms() > 0);
    if (!e.has_state_change()) continue;
    CHECK(e.state_change().job() == "watched");
    CHECK(e.state_change().step() == 1);
    states.push_back(e.state_change().state());
  }
  using namespace ckptd::v1;
  CHECK(states == std::vector<StepState>{STEP_STATE_CAPTURING, STEP_STATE_CAPTURED,
                                         STEP_STATE_PERSISTING, STEP_STATE_PERSISTED,
                                         STEP_STATE_COMMITTED});

  // A step that stays in flight (rank 1 of 2 never saves) is sampled while the stream is open.
  Rank half(daemon, "watched", 0, 2);
  half.Save(2);
  REQUIRE_OK(half.client->WaitSnapshot());
  while (true) {
    REQUIRE(reader->Read(&e));
    if (!e.has_progress() || e.progress().step() != 2) continue;
    const auto& p = e.progress();
    if (p.bytes_captured() < half.shard_bytes()) continue;  // sampled mid-capture
    CHECK(p.job() == "watched");
    CHECK(p.world_size() == 2);
    CHECK(p.ranks_saved() == 1);
    CHECK(p.bytes_total() == half.shard_bytes());
    break;
  }
  ctx.TryCancel();
  reader->Finish().IgnoreError();
}

TEST_CASE("admin: health is NOT_SERVING while the host pool is pinned, before the trainer socket",
          "[admin][ops]") {
  TempDir dir;
  const std::string hold = dir / "hold";
  REQUIRE(::mkfifo(hold.c_str(), 0600) == 0);
  auto options = DaemonProcess::InDir(dir);
  options.env = {"CKPTD_HOLD_BEFORE_PIN=" + hold};  // the daemon waits there, before Pin()
  // The harness's constructor returns once a trainer can say hello: run it aside while the
  // daemon is held, and look at it meanwhile. No assertion runs here until it has returned.
  auto started = std::async(std::launch::async,
                            [&options] { return std::make_unique<DaemonProcess>(options); });
  auto channel =
      grpc::CreateChannel("unix:" + options.socket + ".admin", grpc::InsecureChannelCredentials());
  std::optional<HealthCheckResponse::ServingStatus> while_held;
  const bool answered = PollUntil([&] {
    HealthCheckResponse r;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    if (!Health::NewStub(channel)->Check(&ctx, {}, &r).ok()) return false;
    while_held = r.status();
    return true;
  });
  const bool socket_while_held = std::filesystem::exists(options.socket);
  {
    const int fd = ::open(hold.c_str(), O_WRONLY | O_CLOEXEC);  // releases the daemon
    if (fd >= 0) ::close(fd);
  }
  auto daemon = started.get();
  REQUIRE(answered);
  CHECK(while_held == HealthCheckResponse::NOT_SERVING);
  CHECK_FALSE(socket_while_held);
  CHECK(Health(AdminChannel(*daemon)) == HealthCheckResponse::SERVING);
  CHECK_THAT(daemon->Log(), Catch::Contains("CKPTD_HOLD_BEFORE_PIN"));
}

TEST_CASE("admin: health is NOT_SERVING and status says draining while the daemon drains",
          "[admin][ops]") {
  TempDir dir;
  auto options = DaemonProcess::InDir(dir);
  options.flags = {"--shutdown-timeout", "60s"};
  DaemonProcess daemon(options);
  auto channel = AdminChannel(daemon);
  auto admin = Admin::NewStub(channel);
  REQUIRE(Health(channel) == HealthCheckResponse::SERVING);

  Rank r0(daemon, "drainjob", 0, 2);  // rank 1 never saves: the drain waits for this step
  r0.Save(1);
  REQUIRE_OK(r0.client->WaitSnapshot());
  daemon.Kill(SIGTERM);
  CHECK(PollUntil([&] { return Health(channel) == HealthCheckResponse::NOT_SERVING; }));
  const auto s = GetStatus(*admin);
  CHECK(s.draining());
  CHECK_FALSE(s.serving());
  CHECK(s.steps_size() == 1);
  daemon.Kill(SIGTERM);  // a second signal stops at once
  CHECK(ExitedWith(daemon.Terminate(), 0));
}

TEST_CASE("admin: a timed-out step is a recent failure and moves the failure metric",
          "[admin][ops][metrics]") {
  TempDir dir;
  auto options = DaemonProcess::InDir(dir);
  // Long enough for rank 0's capture on a loaded machine; rank 1 never saves.
  options.flags = {"--step-timeout", "4s"};
  DaemonProcess daemon(options);
  auto admin = Admin::NewStub(AdminChannel(daemon));
  const std::string metrics = ConfigValue(GetStatus(*admin), "metrics-bound");
  REQUIRE_THAT(metrics, Catch::StartsWith("127.0.0.1:"));

  const std::string before = HttpGet(metrics, "/metrics");
  CHECK(Sample(before, "ckptd_build_info{node=\"itest-node\",version=\"0.1.0\"}") == 1);
  CHECK(Sample(before, "ckptd_step_failures_total{reason=\"timeout\"}") == -1);  // none yet
  CHECK(Sample(before, "ckptd_captured_bytes_total") == 0);

  Rank r0(daemon, "late", 0, 2);
  r0.Save(1);
  REQUIRE_OK(r0.client->WaitSnapshot());  // captured well before the 4 s timeout aborts it
  const ckpt::Status waited = r0.client->Wait(1, ckpt::WaitState::kCommitted);
  REQUIRE(waited.code() == ckpt::StatusCode::kAborted);

  const auto s = GetStatus(*admin);
  REQUIRE(s.recent_failures_size() == 1);
  const auto& f = s.recent_failures(0);
  CHECK(f.job() == "late");
  CHECK(f.step() == 1);
  CHECK(f.state() == ckptd::v1::STEP_STATE_ABORTED);
  CHECK_THAT(f.reason(), Catch::Contains("ranks [1]"));

  const std::string after = HttpGet(metrics, "/metrics");
  CHECK(Sample(after, "ckptd_step_failures_total{reason=\"timeout\"}") == 1);
  CHECK(Sample(after, "ckptd_captured_bytes_total") == static_cast<double>(r0.shard_bytes()));
  CHECK(Sample(after, "ckptd_steps_in_flight") == 0);
  CHECK(Sample(after, "ckptd_capture_duration_seconds_count") == 1);
}
