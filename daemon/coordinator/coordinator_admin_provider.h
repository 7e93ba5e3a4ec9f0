// CoordinatorAdminProvider: ckpt-coordinator's answers to ckptd.v1.Admin, so ckptctl, grpcurl
// and dashboards read a coordinator exactly as they read a daemon (role "coordinator").
//
//   GetStatus    the nodes that registered (connected, or how long before their lease runs
//                out), the steps in flight with each rank's node and whether it captured and
//                persisted (the coordinator never sees bytes, so byte counts stay 0), the
//                recent aborts and failures with their reasons, and the config summary.
//   List/Describe the committed steps under the storage root (checkpoint_catalog.h), the same
//                files the daemons read.
//   Pin/Unpin/Delete a committed step through the core's commit engine (Sources::commit): the
//                coordinator commits its daemons' jobs, so these operations belong here.
//   WatchEvents  every state the core decides (CoordinatorCore::Config::on_step_state →
//   OnStepState),
//                and while a stream is open, progress samples of in-flight steps every
//                kProgressTick.
//
// Threads: every call runs on the provider's own worker thread (status takes the core's mutex,
// list and describe read files), never in a gRPC reactor. A sampler thread publishes progress.
// OnStepState is called with the core's mutex held: it records and publishes (the hub only
// queues) and takes no lock the core could wait on.
// Shutdown: Close() ends watch streams and answers later calls UNAVAILABLE; call it before the
// gRPC server's Shutdown so streams do not hold it to its deadline.
#pragma once

#include <chrono>
#include <deque>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/mutex.h"
#include "daemon/admin/admin_provider.h"
#include "daemon/coordinator/coordinator_core.h"
#include "daemon/task_pool.h"

namespace ckpt {

class CoordinatorAdminProvider final : public AdminProvider {
 public:
  static constexpr std::chrono::milliseconds kProgressTick{250};
  static constexpr size_t kFailuresKept = 32;

  struct Sources {
    FileSystem* fs = nullptr;
    std::string storage_root;
    std::string node_id = "coordinator";
    std::string version;
    std::vector<std::pair<std::string, std::string>> config;  // key, value for the summary
    CommitEngine* commit = nullptr;  // the core's; pin / unpin / delete go to it
  };

  explicit CoordinatorAdminProvider(Sources sources);
  ~CoordinatorAdminProvider() override;

  // The core is built after the provider (its Config::on_step_state is OnStepState), so it is
  // handed over here, before the gRPC server starts; starts the progress sampler.
  void Start(CoordinatorCore* core);

  // Health as GetStatus reports it (the gRPC health service is set by the caller). Any thread.
  void SetServing(bool serving) { serving_ = serving; }
  void Close();

  // Wire into CoordinatorCore::Config::on_step_state (before the core is constructed).
  void OnStepState(const std::string& job, uint64_t step, ckptd::v1::StepState state,
                   const std::string& reason);

  // AdminProvider
  void GetStatus(Reply<ckptd::v1::GetStatusResponse> reply) override;
  void ListCheckpoints(const std::string& job,
                       Reply<ckptd::v1::ListCheckpointsResponse> reply) override;
  void DescribeCheckpoint(const std::string& job, uint64_t step,
                          Reply<ckptd::v1::DescribeCheckpointResponse> reply) override;
  void PinCheckpoint(const std::string& job, uint64_t step,
                     Reply<ckptd::v1::PinCheckpointResponse> reply) override;
  void UnpinCheckpoint(const std::string& job, uint64_t step,
                       Reply<ckptd::v1::UnpinCheckpointResponse> reply) override;
  void DeleteCheckpoint(const std::string& job, uint64_t step,
                        Reply<ckptd::v1::DeleteCheckpointResponse> reply) override;
  // The core's, at once (it takes the core's mutex briefly and only queues events).
  void ReleaseJob(const std::string& job, Reply<ckptd::v1::ReleaseJobResponse> reply) override;
  WatchHub& watch_hub() override { return hub_; }

 private:
  bool Post(std::function<void()> f);
  ckptd::v1::GetStatusResponse CollectStatus();
  void SampleLoop();

  Sources sources_;
  CoordinatorCore* core_ = nullptr;
  const std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
  WatchHub hub_;
  std::atomic<bool> serving_{false};
  TaskPool worker_{1, 0, "coord-admin"};
  Mutex mu_;
  CondVar cv_;
  bool closed_ GUARDED_BY(mu_) = false;
  std::deque<ckptd::v1::Failure> failures_ GUARDED_BY(mu_);
  std::thread sampler_;
};

}  // namespace ckpt
