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
//     pending): N data-parallel ranks send one layout, not N. A report's answer that the step
//     already ended globally is posted to the loop as an event.
//   * a report or registration the coordinator did not answer or could not take (unavailable,
//     deadline, overloaded) is sent again by the sender thread with backoff (100 ms … 2 s)
//     while the event stream may well stay up: until the next reconnect, a lost PERSISTED report
//     would hold every later commit of its job back until the step timeout, a registration the
//     coordinator never heard of would leave its job without a writer plan (every replica
//     written by every holder), a lost withdrawal a plan in force for a rank that left. A
//     newer report of the same key replaces a waiting retry and an older one never follows it
//     (report_retries.h: a rank's registrations, a step's PERSISTED reports). A retry keeps
//     the epoch of its first send, so one that outlives a fence is refused, and refusals are
//     not retried: the re-report after the next reconnect covers them. Reports are retried for
//     at most kReportRetryWindow; registrations until delivered, refused or replaced.
// Nothing here blocks the loop or a trainer; the queue and the retries waiting are each bounded
// (kMaxQueued).
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
#include "daemon/rpc/report_retries.h"
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
    uint64_t seq = 0;                      // its number (ReportRetries), given as it is queued
    uint32_t tries = 0;                    // sends so far
    std::chrono::milliseconds backoff{0};  // before the next send, if this one fails
    bool layout_asked = false;             // the coordinator asked for it with its layout
  };
  // Where one ReportRanks stands.
  struct ReportAttempt {
    std::string key;  // ReportRetries key: "" for reports nothing replaces
    uint64_t seq = 0;
    uint32_t tries = 0;
    std::chrono::milliseconds backoff{0};
    ReportRetries::Clock::time_point give_up_at;  // set at the first failure
  };
  // How long a report is sent again after its first failure.
  static constexpr std::chrono::seconds kReportRetryWindow{60};
  // The sender thread's next task: the oldest queued one, else a retry that is due; null when
  // neither.
  std::function<void()> NextTask() REQUIRES(mu_);
  // On the sender thread: one report; sent again later when the coordinator could not take it.
  void SendReport(ReportAttempt attempt, ckptd::v1::ReportRanksRequest req);
  // Queues `send` (a retry of the report numbered `seq` under `key`) to run on the sender thread
  // `after` from now, unless the link is stopping, kMaxQueued retries wait already, or a newer
  // report under `key` was queued since.
  void ScheduleRetry(const std::string& key, uint64_t seq, std::chrono::milliseconds after,
                     std::function<void()> send);
  // A report under `key` numbered `seq` is delivered, refused or given up.
  void ReportDone(const std::string& key, uint64_t seq);
  // False when the task was dropped (stopping, or kMaxQueued reached).
  bool Enqueue(std::function<void()> task);
  // The same for a report under `key` (ReportRetries; "" for none): numbered in the same hold
  // of the mutex that queues it, and `send` gets its number.
  bool EnqueueReport(const std::string& key, std::function<void(uint64_t seq)> send);
  // One ReportRegistration call with the RPC deadline.
  grpc::Status CallReportRegistration(const ckptd::v1::ReportRegistrationRequest& req,
                                      ckptd::v1::ReportRegistrationResponse* resp);
  // On the sender thread: one registration, by fingerprint, then with its layout if asked.
  void SendRegistration(RegistrationAttempt attempt, ckptd::v1::ReportRegistrationRequest full);
  // A registration that failed with `st`: logged, and queued again after its backoff when the
  // failure was not a refusal and no newer registration of the rank was made meanwhile.
  void RetryRegistration(RegistrationAttempt attempt, ckptd::v1::ReportRegistrationRequest full,
                         const grpc::Status& st);
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
  // Reports and registrations waiting to be sent again, and the newest number of each key (a
  // rank's registrations until its withdrawal is delivered or refused; a step's PERSISTED
  // reports until the newest is delivered or given up).
  ReportRetries retries_ GUARDED_BY(mu_);
  bool stopping_ GUARDED_BY(mu_) = false;
  grpc::ClientContext* watch_ctx_ GUARDED_BY(mu_) = nullptr;  // cancelled by Stop
  // The epoch of the registration in force (RegisterNodeResponse.epoch): a layout sent again
  // when the coordinator asks is stamped with it, not with the epoch it was first sent in.
  uint64_t epoch_ GUARDED_BY(mu_) = 0;
  std::thread watch_thread_;
  std::thread send_thread_;
};

}  // namespace ckpt
