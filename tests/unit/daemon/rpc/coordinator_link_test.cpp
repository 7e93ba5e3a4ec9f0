// CoordinatorLink (daemon/rpc/coordinator_link.h) against a scripted coordinator on loopback: a
// rank's registration that the coordinator could not take is sent again while the node's event
// stream stays up — and only while it is the rank's newest registration and the failure was not
// a refusal.
#include "daemon/rpc/coordinator_link.h"

#include <boost/asio/io_context.hpp>
#include <chrono>
#include <deque>
#include <string>
#include <vector>

#include "common/mutex.h"
#include "daemon/rpc/grpc_server.h"
#include "tests/test_util.h"

namespace ckpt {
namespace {

namespace pb = ckptd::v1;

// A Watch stream that sends nothing and ends when the node cancels it (or the server stops).
class IdleWatch final : public grpc::ServerWriteReactor<pb::CoordinatorEvent> {
 public:
  void OnCancel() override { Finish(grpc::Status::CANCELLED); }
  void OnDone() override { delete this; }
};

// Answers ReportRegistration and ReportRanks from a script each (then OK), and keeps every
// request it received. A scripted answer may be held back until the test releases it: the
// link's sender thread then waits for it, and the test can queue more meanwhile.
class ScriptedCoordinator final : public pb::Coordinator::CallbackService {
 public:
  struct Scripted {
    grpc::Status status;
    bool need_layout = false;
    bool hold = false;  // answered when the test calls ReleaseHeld()
  };

  grpc::ServerUnaryReactor* RegisterNode(grpc::CallbackServerContext* ctx,
                                         const pb::RegisterNodeRequest*,
                                         pb::RegisterNodeResponse* resp) override {
    {
      MutexLock lock(mu_);
      ++node_registrations_;
    }
    cv_.NotifyAll();
    resp->set_lease_ms(5000);
    resp->set_incarnation("scripted");
    resp->set_epoch(1);
    auto* reactor = ctx->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  grpc::ServerWriteReactor<pb::CoordinatorEvent>* Watch(grpc::CallbackServerContext*,
                                                        const pb::WatchRequest*) override {
    return new IdleWatch;
  }
  grpc::ServerUnaryReactor* ReportRegistration(grpc::CallbackServerContext* ctx,
                                               const pb::ReportRegistrationRequest* req,
                                               pb::ReportRegistrationResponse* resp) override {
    MutexLock lock(mu_);
    registrations_.push_back(*req);
    const Scripted answer = Next(registration_script_);
    resp->set_need_layout(answer.need_layout);
    return Reply(ctx->DefaultReactor(), answer);
  }
  grpc::ServerUnaryReactor* ReportRanks(grpc::CallbackServerContext* ctx,
                                        const pb::ReportRanksRequest* req,
                                        pb::ReportRanksResponse*) override {
    MutexLock lock(mu_);
    reports_.push_back(*req);
    return Reply(ctx->DefaultReactor(), Next(report_script_));
  }

  void Answer(grpc::StatusCode code, const std::string& message, bool hold = false) {
    MutexLock lock(mu_);
    registration_script_.push_back({grpc::Status(code, message), false, hold});
  }
  void AskForLayout() {
    MutexLock lock(mu_);
    registration_script_.push_back({grpc::Status::OK, true, false});
  }
  void AnswerReport(grpc::StatusCode code, const std::string& message, bool hold = false) {
    MutexLock lock(mu_);
    report_script_.push_back({grpc::Status(code, message), false, hold});
  }
  // No answer is held back from now on.
  void StopHolding() {
    MutexLock lock(mu_);
    holding_ = false;
  }
  // Answers every call held back so far.
  void ReleaseHeld() {
    std::vector<std::pair<grpc::ServerUnaryReactor*, grpc::Status>> held;
    {
      MutexLock lock(mu_);
      held.swap(held_);
    }
    for (auto& [reactor, status] : held) reactor->Finish(status);
  }

  // The registrations (reports) received, once there are at least `n` (empty after 20 s
  // without).
  std::vector<pb::ReportRegistrationRequest> WaitForRegistrations(size_t n) {
    return WaitForAtLeast(&ScriptedCoordinator::registrations_, n);
  }
  std::vector<pb::ReportRanksRequest> WaitForReports(size_t n) {
    return WaitForAtLeast(&ScriptedCoordinator::reports_, n);
  }
  bool WaitForNodeRegistration() {
    MutexLock lock(mu_);
    return cv_.WaitFor(mu_, std::chrono::seconds(20),
                       [&]() REQUIRES(mu_) { return node_registrations_ > 0; });
  }
  int node_registrations() {
    MutexLock lock(mu_);
    return node_registrations_;
  }

 private:
  // `received` names the member (registrations_ or reports_), read under the mutex.
  template <class Request>
  std::vector<Request> WaitForAtLeast(std::vector<Request> ScriptedCoordinator::*received,
                                      size_t n) {
    MutexLock lock(mu_);
    if (!cv_.WaitFor(mu_, std::chrono::seconds(20),
                     [&]() REQUIRES(mu_) { return (this->*received).size() >= n; })) {
      return {};
    }
    return this->*received;
  }
  static Scripted Next(std::deque<Scripted>& script) {
    if (script.empty()) return Scripted{grpc::Status::OK};
    Scripted next = script.front();
    script.pop_front();
    return next;
  }
  grpc::ServerUnaryReactor* Reply(grpc::ServerUnaryReactor* reactor, const Scripted& answer)
      REQUIRES(mu_) {
    cv_.NotifyAll();
    if (answer.hold && holding_) {
      held_.emplace_back(reactor, answer.status);
    } else {
      reactor->Finish(answer.status);
    }
    return reactor;
  }

  Mutex mu_;
  CondVar cv_;
  std::deque<Scripted> registration_script_ GUARDED_BY(mu_);
  std::deque<Scripted> report_script_ GUARDED_BY(mu_);
  std::vector<pb::ReportRegistrationRequest> registrations_ GUARDED_BY(mu_);
  std::vector<pb::ReportRanksRequest> reports_ GUARDED_BY(mu_);
  std::vector<std::pair<grpc::ServerUnaryReactor*, grpc::Status>> held_ GUARDED_BY(mu_);
  int node_registrations_ GUARDED_BY(mu_) = 0;
  bool holding_ GUARDED_BY(mu_) = true;
};

class IgnoringHandler final : public CoordinatorPort::Handler {
 public:
  void OnCoordinatorConnected(const CoordinatorPort::Registration&) override {}
  void OnCoordinatorEvent(const pb::CoordinatorEvent&) override {}
};

// A scripted coordinator on loopback and one node's link to it. The link's loop (io) is never
// run: these tests look at what reaches the coordinator.
struct Rig {
  ScriptedCoordinator coordinator;
  std::unique_ptr<GrpcServer> server;
  boost::asio::io_context io;
  IgnoringHandler handler;
  std::unique_ptr<CoordinatorLink> link;

  Rig() {
    GrpcServer::Options options;
    options.what = "scripted coordinator";
    options.address = "127.0.0.1:0";
    options.keepalive = true;  // the link pings every 2 s, as the coordinator's nodes do
    auto started = GrpcServer::Start(options, {&coordinator});
    REQUIRE_OK(started);
    server = std::move(*started);
    CoordinatorLink::Config config;
    config.address = server->bound_address();
    config.node_id = "node-a";
    config.backoff_min = std::chrono::milliseconds(20);
    config.backoff_max = std::chrono::milliseconds(200);
    link = std::make_unique<CoordinatorLink>(io, config);
    REQUIRE_OK(link->Start(&handler));
    REQUIRE(coordinator.WaitForNodeRegistration());
  }
  ~Rig() {
    // A test that failed early may leave answers held back, or scripted to be: the server
    // would wait for them on shutdown.
    coordinator.StopHolding();
    coordinator.ReleaseHeld();
    link->Stop();
    server->Stop(std::chrono::milliseconds(0));
  }
};

pb::ReportRegistrationRequest Registration(uint32_t rank, uint64_t id) {
  pb::ReportRegistrationRequest req;
  req.set_job("job-a");
  req.set_rank(rank);
  req.set_world_size(8);
  req.set_registration_id(id);
  req.set_epoch(1);
  pb::ShardKey* shard = req.add_shards();
  shard->set_name("w");
  shard->set_dtype("float32");
  shard->add_global_shape(16);
  shard->set_bytes(64);
  return req;
}

pb::ReportRegistrationRequest Withdrawal(uint32_t rank, uint64_t id) {
  pb::ReportRegistrationRequest req = Registration(rank, id);
  req.clear_shards();
  req.set_withdrawn(true);
  return req;
}

size_t CountOf(const std::vector<pb::ReportRegistrationRequest>& received, uint32_t rank,
               bool withdrawn) {
  size_t n = 0;
  for (const auto& r : received) {
    if (r.rank() == rank && r.withdrawn() == withdrawn) ++n;
  }
  return n;
}

TEST_CASE(
    "coordinator link: a registration the coordinator could not take is sent again "
    "while the event stream stays up",
    "[rpc][coordinator_link]") {
  Rig rig;
  const grpc::StatusCode code =
      GENERATE(grpc::StatusCode::UNAVAILABLE, grpc::StatusCode::DEADLINE_EXCEEDED,
               grpc::StatusCode::RESOURCE_EXHAUSTED);
  INFO("the coordinator answers " << static_cast<int>(code) << ", twice");
  rig.coordinator.Answer(code, "the coordinator is busy");
  rig.coordinator.Answer(code, "the coordinator is busy");
  rig.link->ReportRegistration(Registration(3, 77));

  const auto received = rig.coordinator.WaitForRegistrations(3);
  REQUIRE(received.size() == 3);
  for (const auto& r : received) {
    CHECK(r.rank() == 3);
    CHECK(r.registration_id() == 77);
    CHECK(r.node_id() == "node-a");
    CHECK(r.layout_fingerprint() == received[0].layout_fingerprint());
  }
  CHECK_FALSE(received[0].layout_fingerprint().empty());
  // Sent again on the same registration of the node: no reconnect was needed.
  CHECK(rig.coordinator.node_registrations() == 1);

  SECTION("a withdrawal is sent again too") {
    rig.coordinator.Answer(grpc::StatusCode::UNAVAILABLE, "the coordinator is busy");
    rig.link->ReportRegistration(Withdrawal(3, 77));
    const auto all = rig.coordinator.WaitForRegistrations(5);
    REQUIRE(all.size() == 5);
    CHECK(CountOf(all, 3, /*withdrawn=*/true) == 2);
  }
}

TEST_CASE("coordinator link: a registration whose layout was asked for is sent again with it",
          "[rpc][coordinator_link]") {
  Rig rig;
  rig.coordinator.AskForLayout();
  rig.coordinator.Answer(grpc::StatusCode::UNAVAILABLE, "the coordinator is busy");
  rig.link->ReportRegistration(Registration(3, 77));
  const auto received = rig.coordinator.WaitForRegistrations(3);
  REQUIRE(received.size() == 3);
  CHECK(received[0].shards_size() == 0);  // by fingerprint
  CHECK(received[1].shards_size() == 1);  // asked for: with its layout, which fails
  CHECK(received[2].shards_size() == 1);  // the retry: with its layout at once
  CHECK(received[2].layout_fingerprint() == received[0].layout_fingerprint());
}

TEST_CASE(
    "coordinator link: a newer registration or withdrawal of the rank replaces the one "
    "waiting to be sent again",
    "[rpc][coordinator_link]") {
  Rig rig;
  const bool withdraw = GENERATE(false, true);
  INFO((withdraw ? "withdrawn" : "registered again") << " while the first waits");
  rig.coordinator.Answer(grpc::StatusCode::UNAVAILABLE, "the coordinator is busy", /*hold=*/true);
  rig.link->ReportRegistration(Registration(3, 77));
  REQUIRE(rig.coordinator.WaitForRegistrations(1).size() == 1);
  // Queued while the first's answer is held back; the first then fails, and must not reach the
  // coordinator again. (A retry already waiting when a newer one is queued is dropped too:
  // report_retries_test.cpp.)
  rig.link->ReportRegistration(withdraw ? Withdrawal(3, 77) : Registration(3, 78));
  rig.coordinator.ReleaseHeld();
  REQUIRE(rig.coordinator.WaitForRegistrations(2).size() == 2);

  // Another rank's registration fails once: its retry is due after any retry of the first
  // (both wait the same first backoff), so when it arrives, a wrong retry would have too.
  rig.coordinator.Answer(grpc::StatusCode::UNAVAILABLE, "the coordinator is busy");
  rig.link->ReportRegistration(Registration(5, 90));
  const auto received = rig.coordinator.WaitForRegistrations(4);
  REQUIRE(received.size() == 4);
  CHECK(received[3].rank() == 5);
  CHECK(CountOf(received, 5, false) == 2);
  size_t first = 0;
  for (const auto& r : received) {
    if (r.rank() == 3 && r.registration_id() == 77 && !r.withdrawn()) ++first;
  }
  CHECK(first == 1);
  CHECK(received[1].rank() == 3);
  CHECK(received[1].withdrawn() == withdraw);
}

TEST_CASE("coordinator link: a refused registration is not sent again", "[rpc][coordinator_link]") {
  Rig rig;
  const grpc::StatusCode refusal =
      GENERATE(grpc::StatusCode::FAILED_PRECONDITION, grpc::StatusCode::INVALID_ARGUMENT);
  INFO("refused with " << static_cast<int>(refusal));
  rig.coordinator.Answer(refusal, "stale epoch");
  rig.link->ReportRegistration(Registration(3, 77));
  // As above: rank 5's retry comes after any retry of rank 3's would have.
  rig.coordinator.Answer(grpc::StatusCode::UNAVAILABLE, "the coordinator is busy");
  rig.link->ReportRegistration(Registration(5, 90));
  const auto received = rig.coordinator.WaitForRegistrations(3);
  REQUIRE(received.size() == 3);
  CHECK(CountOf(received, 3, false) == 1);
  CHECK(received[2].rank() == 5);
}

pb::ReportRanksRequest Report(uint64_t step, pb::StepState state, std::vector<uint32_t> ranks) {
  pb::ReportRanksRequest req;
  req.set_job("job-a");
  req.set_step(step);
  req.set_world_size(8);
  req.set_state(state);
  req.set_epoch(1);
  for (uint32_t r : ranks) req.add_ranks(r);
  return req;
}

TEST_CASE("coordinator link: a step report the coordinator could not take is sent again",
          "[rpc][coordinator_link]") {
  Rig rig;
  const pb::StepState state = GENERATE(pb::STEP_STATE_CAPTURED, pb::STEP_STATE_PERSISTED);
  INFO(pb::StepState_Name(state));
  rig.coordinator.AnswerReport(grpc::StatusCode::UNAVAILABLE, "the coordinator is busy");
  rig.link->ReportRanks(Report(1, state, {0, 1}));
  const auto received = rig.coordinator.WaitForReports(2);
  REQUIRE(received.size() == 2);
  for (const auto& r : received) {
    CHECK(r.step() == 1);
    CHECK(r.state() == state);
    CHECK(r.ranks_size() == 2);
    CHECK(r.node_id() == "node-a");
  }
  CHECK(rig.coordinator.node_registrations() == 1);  // no reconnect
}

TEST_CASE(
    "coordinator link: a newer PERSISTED report of the step replaces an older one waiting, "
    "and a refused report is not sent again",
    "[rpc][coordinator_link]") {
  Rig rig;
  size_t expected = 0;  // reports the coordinator hears in all
  SECTION("replaced") {
    expected = 4;  // the first (failed), the newer one, step 2's (failed) and its retry
    rig.coordinator.AnswerReport(grpc::StatusCode::UNAVAILABLE, "the coordinator is busy",
                                 /*hold=*/true);
    rig.link->ReportRanks(Report(1, pb::STEP_STATE_PERSISTED, {0}));
    REQUIRE(rig.coordinator.WaitForReports(1).size() == 1);
    // Queued while the first's answer is held back. Its node manifest holds ranks 0 and 1: the
    // older one (rank 0) arriving after it would shrink what the coordinator holds of the node.
    rig.link->ReportRanks(Report(1, pb::STEP_STATE_PERSISTED, {0, 1}));
    rig.coordinator.ReleaseHeld();
    REQUIRE(rig.coordinator.WaitForReports(2).size() == 2);  // before the next answer is set
  }
  SECTION("refused") {
    expected = 3;  // the first (refused), step 2's (failed) and its retry
    rig.coordinator.AnswerReport(grpc::StatusCode::FAILED_PRECONDITION, "stale epoch");
    rig.link->ReportRanks(Report(1, pb::STEP_STATE_PERSISTED, {0}));
    REQUIRE(rig.coordinator.WaitForReports(1).size() == 1);
  }
  // As with registrations: step 2's retry is due after any retry of the first report.
  rig.coordinator.AnswerReport(grpc::StatusCode::UNAVAILABLE, "the coordinator is busy");
  rig.link->ReportRanks(Report(2, pb::STEP_STATE_CAPTURED, {0}));
  const auto received = rig.coordinator.WaitForReports(expected);
  REQUIRE(received.size() == expected);
  size_t older = 0;
  for (const auto& r : received) {
    if (r.step() == 1 && r.ranks_size() == 1) ++older;
  }
  CHECK(older == 1);
  CHECK(received.back().step() == 2);
  CHECK(received.back().state() == pb::STEP_STATE_CAPTURED);
}

}  // namespace
}  // namespace ckpt
