// AdminServer + AdminService over a fake AdminProvider (what ckpt-coordinator will hand it):
// replies and errors pass through unchanged, health follows SetServing, and a watch stream whose
// client stops reading is ended with RESOURCE_EXHAUSTED instead of queueing without bound.
#include <grpcpp/grpcpp.h>
#include <catch2/catch.hpp>

#include <thread>

#include "ckptd/v1/admin.grpc.pb.h"
#include "daemon/admin/admin_server.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "tests/test_util.h"

namespace ckpt {
namespace {

using ckpt::testing::TempDir;

class FakeProvider final : public AdminProvider {
 public:
  void GetStatus(Reply<ckptd::v1::GetStatusResponse> reply) override {
    ckptd::v1::GetStatusResponse r;
    r.set_node_id("fake");
    r.set_role("coordinator");
    reply(r);
  }
  void ListCheckpoints(const std::string& job,
                       Reply<ckptd::v1::ListCheckpointsResponse> reply) override {
    if (job == "nope") {
      reply(NotFound("job 'nope' is unknown"));
      return;
    }
    ckptd::v1::ListCheckpointsResponse r;
    r.add_steps(4);
    r.set_latest(4);
    reply(r);
  }
  void DescribeCheckpoint(const std::string&, uint64_t step,
                          Reply<ckptd::v1::DescribeCheckpointResponse> reply) override {
    reply(DataLoss("step " + std::to_string(step) + ": MANIFEST is damaged"));
  }
  WatchHub& watch_hub() override { return hub; }
  WatchHub hub;
};

struct Fixture {
  Fixture() : server({"unix:" + std::string(dir / "admin.sock")}, &provider) {
    REQUIRE_OK(server.Start());
    channel = grpc::CreateChannel("unix:" + std::string(dir / "admin.sock"),
                                  grpc::InsecureChannelCredentials());
    admin = ckptd::v1::Admin::NewStub(channel);
  }
  std::unique_ptr<grpc::ClientContext> Ctx() {
    auto c = std::make_unique<grpc::ClientContext>();
    c->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    return c;
  }
  grpc::health::v1::HealthCheckResponse::ServingStatus Health() {
    grpc::health::v1::HealthCheckResponse r;
    auto stub = grpc::health::v1::Health::NewStub(channel);
    REQUIRE(stub->Check(Ctx().get(), {}, &r).ok());
    return r.status();
  }
  TempDir dir;
  FakeProvider provider;
  AdminServer server;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<ckptd::v1::Admin::Stub> admin;
};

TEST_CASE("admin service: replies and errors of the provider reach the client as they are",
          "[admin]") {
  Fixture f;
  ckptd::v1::GetStatusResponse status;
  REQUIRE(f.admin->GetStatus(f.Ctx().get(), {}, &status).ok());
  CHECK(status.node_id() == "fake");
  CHECK(status.role() == "coordinator");

  ckptd::v1::ListCheckpointsRequest list_request;
  list_request.set_job("nope");
  ckptd::v1::ListCheckpointsResponse list;
  grpc::Status st = f.admin->ListCheckpoints(f.Ctx().get(), list_request, &list);
  CHECK(st.error_code() == grpc::StatusCode::NOT_FOUND);
  CHECK(st.error_message() == "job 'nope' is unknown");
  list_request.set_job("yes");
  REQUIRE(f.admin->ListCheckpoints(f.Ctx().get(), list_request, &list).ok());
  CHECK(list.latest() == 4);

  ckptd::v1::DescribeCheckpointRequest describe;
  describe.set_step(9);
  ckptd::v1::DescribeCheckpointResponse described;
  st = f.admin->DescribeCheckpoint(f.Ctx().get(), describe, &described);
  CHECK(st.error_code() == grpc::StatusCode::DATA_LOSS);
  CHECK(st.error_message() == "step 9: MANIFEST is damaged");
}

TEST_CASE("admin service: health is NOT_SERVING until SetServing(true), and after (false)",
          "[admin]") {
  Fixture f;
  CHECK(f.Health() == grpc::health::v1::HealthCheckResponse::NOT_SERVING);
  f.server.SetServing(true);
  CHECK(f.Health() == grpc::health::v1::HealthCheckResponse::SERVING);
  f.server.SetServing(false);
  CHECK(f.Health() == grpc::health::v1::HealthCheckResponse::NOT_SERVING);
}

TEST_CASE("admin service: a watch client that stops reading is cut off, not buffered forever",
          "[admin]") {
  Fixture f;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto reader = f.admin->WatchEvents(&ctx, {});
  reader->WaitForInitialMetadata();
  REQUIRE(f.provider.hub.subscribers() == 1);

  // Far more than the flow-control windows and the stream's queue hold, never read.
  ckptd::v1::WatchEventsResponse e;
  e.mutable_state_change()->set_job("j");
  e.mutable_state_change()->set_reason(std::string(4096, 'x'));
  const size_t published = 4 * AdminService::kMaxQueuedEvents;
  for (size_t i = 0; i < published; ++i) {
    e.mutable_state_change()->set_step(i);
    f.provider.hub.Publish("j", e);
  }
  size_t read = 0;
  while (reader->Read(&e)) ++read;
  const grpc::Status st = reader->Finish();
  CHECK(st.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
  CHECK_THAT(st.error_message(), Catch::Contains("read too slowly"));
  CHECK(read < published);
  // The stream lets go of its subscription once gRPC is done with it (no event announces that:
  // poll, with a deadline reached only if it never happens).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (f.provider.hub.subscribers() != 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // polling interval
  }
  CHECK(f.provider.hub.subscribers() == 0);
}

TEST_CASE("admin service: stopping the server ends open watch streams at once", "[admin]") {
  Fixture f;
  grpc::ClientContext ctx;
  auto reader = f.admin->WatchEvents(&ctx, {});
  reader->WaitForInitialMetadata();
  f.provider.hub.CloseAll();  // what a provider's Close() does before the server stops
  ckptd::v1::WatchEventsResponse e;
  CHECK_FALSE(reader->Read(&e));
  const grpc::Status st = reader->Finish();
  CHECK(st.error_code() == grpc::StatusCode::UNAVAILABLE);
  CHECK_THAT(st.error_message(), Catch::Contains("shutting down"));
  f.server.Stop();
}

}  // namespace
}  // namespace ckpt
