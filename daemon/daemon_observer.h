// DaemonObserver: the one narrow hook through which the operations side (admin status, watch
// streams, Prometheus metrics) learns what the daemon does, without the core knowing about gRPC
// or metrics. The core calls it from a handful of places (node_state.cc, session.cc); the admin
// code implements it (daemon/admin/).
//
// Contract: every method is called on the daemon's Asio loop, must return quickly and must not
// call back into the caller. Default implementations ignore the event, so an observer overrides
// only what it needs. ObserverList fans one call out to several observers.
//
// StepSnapshot is what NodeState::Snapshot() returns: a copy of the steps it knows of, for
// status pages; taking it is cheap (no I/O) and must happen on the loop.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "ckptd/v1/local.pb.h"

namespace ckpt {

struct ClientDescription {
  uint64_t session_id = 0;
  std::string job;
  uint32_t rank = 0;
  uint32_t world_size = 0;
  int32_t pid = 0;
  uint32_t uid = 0;
  bool reattached = false;  // the client connected before (daemon restart, broken connection)
};

class DaemonObserver {
 public:
  virtual ~DaemonObserver() = default;
  // A step changed state (reason is set for ABORTED / FAILED).
  virtual void OnStepState(const std::string& /*job*/, uint64_t /*step*/,
                           ckptd::v1::StepState /*state*/, const std::string& /*reason*/) {}
  // One rank's bytes are all in the host pool; `seconds` since its save was accepted.
  virtual void OnRankCaptured(const std::string& /*job*/, uint64_t /*step*/, uint32_t /*rank*/,
                              uint64_t /*bytes*/, double /*seconds*/) {}
  // One rank's data file is written and synced; `seconds` since it was captured.
  virtual void OnRankPersisted(const std::string& /*job*/, uint64_t /*step*/, uint32_t /*rank*/,
                               uint64_t /*bytes*/, double /*seconds*/) {}
  // A load finished successfully.
  virtual void OnLoad(const std::string& /*job*/, uint64_t /*step*/, uint64_t /*bytes_from_memory*/,
                      uint64_t /*bytes_from_storage*/, double /*seconds*/) {}
  // Bytes read from storage outside a trainer's load: a FETCH from another node that the data
  // plane served from storage.
  virtual void OnStorageRead(const std::string& /*job*/, uint64_t /*bytes*/) {}
  virtual void OnClientConnected(const ClientDescription& /*client*/) {}
  virtual void OnClientDisconnected(uint64_t /*session_id*/) {}
};

// Forwards to every observer added, in order. Add all observers before the loop runs.
class ObserverList final : public DaemonObserver {
 public:
  void Add(DaemonObserver* o) { observers_.push_back(o); }
  void OnStepState(const std::string& job, uint64_t step, ckptd::v1::StepState state,
                   const std::string& reason) override {
    for (auto* o : observers_) o->OnStepState(job, step, state, reason);
  }
  void OnRankCaptured(const std::string& job, uint64_t step, uint32_t rank, uint64_t bytes,
                      double seconds) override {
    for (auto* o : observers_) o->OnRankCaptured(job, step, rank, bytes, seconds);
  }
  void OnRankPersisted(const std::string& job, uint64_t step, uint32_t rank, uint64_t bytes,
                       double seconds) override {
    for (auto* o : observers_) o->OnRankPersisted(job, step, rank, bytes, seconds);
  }
  void OnLoad(const std::string& job, uint64_t step, uint64_t from_memory, uint64_t from_storage,
              double seconds) override {
    for (auto* o : observers_) o->OnLoad(job, step, from_memory, from_storage, seconds);
  }
  void OnStorageRead(const std::string& job, uint64_t bytes) override {
    for (auto* o : observers_) o->OnStorageRead(job, bytes);
  }
  void OnClientConnected(const ClientDescription& client) override {
    for (auto* o : observers_) o->OnClientConnected(client);
  }
  void OnClientDisconnected(uint64_t session_id) override {
    for (auto* o : observers_) o->OnClientDisconnected(session_id);
  }

 private:
  std::vector<DaemonObserver*> observers_;
};

// A copy of one step as NodeState sees it.
struct StepSnapshot {
  struct Rank {
    uint32_t rank = 0;
    int32_t pid = 0;
    uint64_t bytes_total = 0;
    uint64_t bytes_captured = 0;
    uint64_t bytes_persisted = 0;
    bool captured = false;
    bool persisted = false;
  };
  std::string job;
  uint64_t step = 0;
  ckptd::v1::StepState state = ckptd::v1::STEP_STATE_PENDING;
  std::string reason;
  uint32_t world_size = 0;
  std::chrono::steady_clock::time_point accepted;  // first rank's save
  std::vector<Rank> ranks;
};

}  // namespace ckpt
