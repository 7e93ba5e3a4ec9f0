// CoordinatorLink: a daemon's connection to ckpt-coordinator (daemon --coordinator ADDR); the
// gRPC implementation of CoordinatorPort.
//
// Two threads, neither on the daemon's Asio loop:
//   * the watch thread registers the node (node id, admin address, version, a random instance
//     id per daemon process), then holds the node's Watch stream open — that stream is the
//     node's lease — and posts every event onto the loop (Handler::OnCoordinatorEvent). When the
//     stream breaks it reconnects with exponential backoff (100 ms … 2 s); after every successful
//     registration it posts Handler::OnCoordinatorConnected with the registration's epoch (and
//     whether this process was fenced meanwhile), on which the node state re-reports everything
//     it still has in flight (reports are idempotent: sets of ranks and cumulative node
//     manifests), so a restarted coordinator or a dropped connection loses nothing.
//   * the sender thread sends reports and queries in the order they were queued, each with a
//     deadline. A rank's registration goes by fingerprint first and with its layout only when the
//     coordinator asks (need_layout, or later a LayoutRequest event for a registration it held as
//     pending): N data-parallel ranks send one layout, not N. A registration the coordinator did
//     not answer or could not take (unavailable, deadline, overloaded) is sent again with backoff
//     (100 ms … 2 s; its epoch that of its first send, so one that outlives a fence is refused and
//     replaced by the re-registration) until it is delivered or refused, or a newer registration or
//     withdrawal of the same rank replaces it: the event stream may well stay up meanwhile, and
//     until the next reconnect a rank the coordinator never heard of would leave its job without a
//     writer plan (every replica written by every holder), a lost withdrawal a plan in force for a
//     rank that left. Other reports that cannot be delivered are dropped with a warning — the
//     re-report after reconnecting replaces them, and a step missing one fails by its timeout. A
//     report's answer that the step already ended globally is posted to the loop as an event.
// Nothing here blocks the loop or a trainer; queues are bounded (kMaxQueued).
// Thread safety: all public methods may be called from any thread; callbacks run on the loop.
#pragma once

#include <grpcpp/grpcpp.h>

#include <boost/asio/io_context.hpp>
#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "ckptd/v1/coordinator.grpc.pb.h"
#include "common/mutex.h"
#include "common/status.h"
#include "daemon/coordinator/coordinator_port.h"
#include "daemon/rpc/transport_security.h"

namespace ckpt {

class CoordinatorLink final : public CoordinatorPort {
 public:
  struct Config {
    std::string address;
    std::string node_id;
    std::string admin_address;
    std::string version;
    // The peer-memory tier (RegisterNodeRequest fields 5-8); the data plane's address is known
    // once it is bound (SetPeerAddress, before Start).
    std::string failure_domain;
    uint64_t peer_pool_bytes = 0;
    uint32_t replicas = 0;
    TlsFiles tls;
    bool allow_plaintext = false;
    std::chrono::milliseconds rpc_deadline{std::chrono::seconds(10)};
    std::chrono::milliseconds backoff_min{100};
    std::chrono::milliseconds backoff_max{2000};
  };
  CoordinatorLink(boost::asio::io_context& io, Config config);
  ~CoordinatorLink() override;

  // Checks the address and credentials (errors name the flag); starts both threads. The
  // handler must outlive Stop().
  Status Start(Handler* handler);
  void Stop();

  // CoordinatorPort
  void ReportRanks(ckptd::v1::ReportRanksRequest request) override;
  void ReportRegistration(ckptd::v1::ReportRegistrationRequest request) override;
  void Latest(const std::string& job, std::optional<RestoreQuery> restore_point,
              LatestDone done) override;
  void PlanLoad(ckptd::v1::LoadPlanRequest request, PlanLoadDone done) override;
  void StepManifest(const std::string& job, uint64_t step, StepManifestDone done) override;

  const Config& config() const { return config_; }
  // The data plane's advertised address (host:port); before Start.
  void SetPeerAddress(std::string address) { peer_address_ = std::move(address); }
  // The jobs this node's peer pool holds and the newest step of each
  // (RegisterNodeRequest.held_jobs), asked at each registration from the link's thread; before
  // Start. Unset: none.
  using HeldJobs = std::function<std::vector<std::pair<std::string, uint64_t>>()>;
  void SetHeldJobs(HeldJobs held_jobs) { held_jobs_ = std::move(held_jobs); }

 private:
  static constexpr size_t kMaxQueued = 100'000;
  void WatchLoop();
  void SendLoop();
  // Where one registration of a rank stands.
  struct RegistrationAttempt {
    uint64_t seq = 0;                      // its number among the rank's registrations on this node
    uint32_t tries = 0;                    // sends so far
    std::chrono::milliseconds backoff{0};  // before the next send, if this one fails
    bool layout_asked = false;             // the coordinator asked for it with its layout
  };
  // A registration the coordinator could not take, sent again at `due` unless a newer one of
  // the rank replaces it first.
  struct PendingRetry {
    RegistrationAttempt attempt;
    ckptd::v1::ReportRegistrationRequest request;
    std::chrono::steady_clock::time_point due;
  };
  // The sender thread's next task: the oldest queued one, else a registration retry that is
  // due; null when neither.
  std::function<void()> NextTask() REQUIRES(mu_);
  std::map<std::string, PendingRetry>::iterator EarliestRetry() REQUIRES(mu_);
  // False when the task was dropped (stopping, or kMaxQueued reached).
  bool Enqueue(std::function<void()> task);
  // One ReportRegistration call with the RPC deadline.
  grpc::Status CallReportRegistration(const ckptd::v1::ReportRegistrationRequest& req,
                                      ckptd::v1::ReportRegistrationResponse* resp);
  // On the sender thread: one registration, by fingerprint, then with its layout if asked.
  void SendRegistration(RegistrationAttempt attempt, ckptd::v1::ReportRegistrationRequest full);
  // A registration that failed with `st`: logged, and queued again after its backoff when the
  // failure was not a refusal and no newer registration of the rank was made meanwhile.
  void RetryRegistration(RegistrationAttempt attempt, ckptd::v1::ReportRegistrationRequest full,
                         const grpc::Status& st);
  // The rank's withdrawal was delivered or refused: its count starts over (unless a newer
  // registration of it is queued).
  void ForgetWithdrawnRank(const std::string& key, uint64_t seq);
  // On the watch thread: the coordinator asks again for a layout it held a registration for.
  void ResendLayout(const ckptd::v1::LayoutRequest& ask);
  void PostToLoop(std::function<void()> f);
  void Deadline(grpc::ClientContext& ctx) const;

  boost::asio::io_context& io_;
  Config config_;
  std::string peer_address_;
  HeldJobs held_jobs_;
  std::string instance_;
  Handler* handler_ = nullptr;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<ckptd::v1::Coordinator::Stub> stub_;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);

  Mutex mu_;
  CondVar cv_;
  std::deque<std::function<void()>> queue_ GUARDED_BY(mu_);
  // "job\0rank" → the full registration the coordinator holds as pending (by fingerprint).
  std::map<std::string, ckptd::v1::ReportRegistrationRequest> pending_layouts_ GUARDED_BY(mu_);
  // "job\0rank" → the number of the newest registration (or withdrawal) of the rank queued;
  // erased when the rank's withdrawal is delivered or refused, so it holds the ranks this node
  // serves (and any whose withdrawal could not even be queued).
  std::map<std::string, uint64_t> registration_seq_ GUARDED_BY(mu_);
  // "job\0rank" → the rank's registration waiting to be sent again (PendingRetry).
  std::map<std::string, PendingRetry> registration_retries_ GUARDED_BY(mu_);
  bool stopping_ GUARDED_BY(mu_) = false;
  grpc::ClientContext* watch_ctx_ GUARDED_BY(mu_) = nullptr;  // cancelled by Stop
  // The epoch of the registration in force (RegisterNodeResponse.epoch): a layout sent again
  // when the coordinator asks is stamped with it, not with the epoch it was first sent in.
  uint64_t epoch_ GUARDED_BY(mu_) = 0;
  std::thread watch_thread_;
  std::thread send_thread_;
};

}  // namespace ckpt
