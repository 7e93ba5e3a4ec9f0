// NodeAdminProvider: the node daemon's answers to ckptd.v1.Admin, and the observer that feeds
// them. It is a DaemonObserver (connected clients, recent failures, state changes for watch
// streams) and an AdminProvider (status, list, describe).
//
// Threads: observer calls arrive on the daemon's loop. GetStatus posts to the loop, where it
// reads NodeState::Snapshot() and its own client table, then replies from there; list and
// describe run on the storage thread (file I/O); the operator operations (pin, unpin, delete:
// CommitEngine) on a thread of their own, so that removing a large step never delays the node
// manifests the storage thread writes for saves. While watch streams are open, a timer on the
// loop samples in-flight steps every kProgressTick and publishes their progress.
//
// Shutdown: Close() answers UNAVAILABLE to status calls still waiting for the loop (which may
// never run again) and to every later call, so no RPC is left unanswered and the gRPC server can
// stop; list and describe already posted finish on the storage thread.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <deque>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/mutex.h"
#include "daemon/admin/admin_provider.h"
#include "daemon/daemon_observer.h"
#include "daemon/host_pool.h"
#include "daemon/hot_cache.h"
#include "daemon/node_state.h"
#include "daemon/peer/peer_store.h"
#include "daemon/task_pool.h"

namespace ckpt {

class NodeAdminProvider final : public AdminProvider, public DaemonObserver {
 public:
  static constexpr std::chrono::milliseconds kProgressTick{250};
  static constexpr size_t kFailuresKept = 32;

  struct Sources {
    const NodeState* node = nullptr;
    const HostPool* pool = nullptr;
    const HotCache* hot = nullptr;
    FileSystem* fs = nullptr;
    TaskPool* storage = nullptr;  // list and describe run here
    // The engine that commits this node's jobs when the coordinator is embedded (pin, unpin and
    // delete go to it); null under a global coordinator, whose address `coordinator` names:
    // those operations then belong to it and are refused here.
    CommitEngine* commit = nullptr;
    std::string coordinator;
    std::string storage_root;
    std::string node_id;
    std::string version;
    std::vector<std::pair<std::string, std::string>> config;  // key, value for the summary
    // The writers' storage calls in flight and the oldest one's age (seconds); may be empty.
    std::function<std::pair<uint32_t, double>()> storage_activity;
    double storage_stall_timeout_seconds = 0;
    // The peer-memory tier: what this node holds for others (may be null), what it asks for.
    const peer::PeerStore* peer_store = nullptr;
    uint32_t replicas = 0;
    std::string failure_domain;
  };

  NodeAdminProvider(boost::asio::io_context& io, Sources sources);
  ~NodeAdminProvider() override;

  // Health as the admin server reports it (GetStatus shows it). Any thread.
  void SetServing(bool serving) { serving_ = serving; }
  // Adds a config summary entry (e.g. the metrics address once bound). Before Start only.
  void AddConfig(std::string key, std::string value) {
    sources_.config.emplace_back(std::move(key), std::move(value));
  }
  // Starts the progress sampler (on the loop).
  void Start();
  void Close();

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
  WatchHub& watch_hub() override { return hub_; }

  // DaemonObserver (loop)
  void OnStepState(const std::string& job, uint64_t step, ckptd::v1::StepState state,
                   const std::string& reason) override;
  void OnClientConnected(const ClientDescription& client) override;
  void OnClientDisconnected(uint64_t session_id) override;

  // The status as of now; on the loop only.
  ckptd::v1::GetStatusResponse CollectStatus() const;

 private:
  bool PostToStorage(std::function<void()> f);
  // Runs `op` (an operator operation on the commit engine) on operations_; refuses at
  // once when this daemon has no engine of its own (it runs under a global coordinator).
  template <typename T>
  void RunOperation(const std::string& what, std::function<Result<T>(CommitEngine*)> op,
                    Reply<T> reply);
  void ArmTick();
  void Tick();

  boost::asio::io_context& io_;
  Sources sources_;
  const std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
  WatchHub hub_;
  std::atomic<bool> serving_{false};
  Mutex mu_;
  bool closed_ GUARDED_BY(mu_) = false;
  uint64_t next_status_id_ GUARDED_BY(mu_) = 1;
  std::map<uint64_t, Reply<ckptd::v1::GetStatusResponse>> pending_status_ GUARDED_BY(mu_);
  // Loop-owned:
  struct Client {
    ClientDescription description;
    std::chrono::steady_clock::time_point since;
  };
  std::map<uint64_t, Client> clients_;
  std::deque<ckptd::v1::Failure> failures_;
  boost::asio::steady_timer tick_;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
  TaskPool operations_{1, 0, "admin-ops"};  // pin, unpin, delete; started by Start()
};

// A StepSnapshot as the Admin API shows it.
ckptd::v1::StepStatus ToStepStatus(const StepSnapshot& s,
                                   std::chrono::steady_clock::time_point now);
bool IsTerminalState(ckptd::v1::StepState s);

}  // namespace ckpt
