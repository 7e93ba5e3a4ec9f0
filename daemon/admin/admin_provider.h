// AdminProvider: what a process serving ckptd.v1.Admin must answer, with no gRPC types in it
// (docs/design.md §10.2: the gRPC service in admin_service.h only translates). The node daemon
// implements it in node_admin_provider.h; ckpt-coordinator implements it over its own state and
// hands it to the same AdminServer, so both serve one Admin API.
//
// Contract: each method calls `reply` exactly once, from any thread, possibly before returning;
// none may block (they post work to the owner's loop or storage thread). Errors name the job
// and step they are about; they reach the client as the gRPC status with the same code.
// Watch streams subscribe to watch_hub(), which the provider publishes into.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include "ckptd/v1/admin.pb.h"
#include "common/status.h"
#include "daemon/admin/watch_hub.h"

namespace ckpt {

class AdminProvider {
 public:
  template <typename T>
  using Reply = std::function<void(Result<T>)>;

  virtual ~AdminProvider() = default;
  virtual void GetStatus(Reply<ckptd::v1::GetStatusResponse> reply) = 0;
  virtual void ListCheckpoints(const std::string& job,
                               Reply<ckptd::v1::ListCheckpointsResponse> reply) = 0;
  virtual void DescribeCheckpoint(const std::string& job, uint64_t step,
                                  Reply<ckptd::v1::DescribeCheckpointResponse> reply) = 0;
  // Operator operations on one committed step (CommitEngine's PinForOperator, UnpinForOperator,
  // DeleteCommitted; their errors). They belong to the process whose engine commits the job;
  // a provider that has none keeps these defaults, which answer UNIMPLEMENTED. Whether the
  // caller may ask at all (admin-read-only) is the AdminService's check, made before these run.
  virtual void PinCheckpoint(const std::string& job, uint64_t step,
                             Reply<ckptd::v1::PinCheckpointResponse> reply) {
    reply(Unimplemented("pin of job '" + job + "' step " + std::to_string(step) +
                        ": this server does not manage checkpoints"));
  }
  virtual void UnpinCheckpoint(const std::string& job, uint64_t step,
                               Reply<ckptd::v1::UnpinCheckpointResponse> reply) {
    reply(Unimplemented("unpin of job '" + job + "' step " + std::to_string(step) +
                        ": this server does not manage checkpoints"));
  }
  virtual void DeleteCheckpoint(const std::string& job, uint64_t step,
                                Reply<ckptd::v1::DeleteCheckpointResponse> reply) {
    reply(Unimplemented("delete of job '" + job + "' step " + std::to_string(step) +
                        ": this server does not manage checkpoints"));
  }
  // Releases a finished job's copies in memory (CoordinatorCore::ReleaseJob): the coordinator's.
  virtual void ReleaseJob(const std::string& job, Reply<ckptd::v1::ReleaseJobResponse> reply) {
    reply(Unimplemented("release of job '" + job +
                        "': this server does not coordinate jobs across nodes; ask "
                        "ckpt-coordinator's admin endpoint"));
  }
  // Outlives the AdminServer that serves this provider.
  virtual WatchHub& watch_hub() = 0;
};

// What both providers record and publish when a step changes state: the recent-failure entry
// (stamped now) and the watch event.
inline ckptd::v1::Failure MakeFailure(const std::string& job, uint64_t step,
                                      ckptd::v1::StepState state, const std::string& reason) {
  ckptd::v1::Failure f;
  f.set_job(job);
  f.set_step(step);
  f.set_state(state);
  f.set_reason(reason);
  f.set_unix_time_ms(std::chrono::duration_cast<std::chrono::milliseconds>(
                         std::chrono::system_clock::now().time_since_epoch())
                         .count());
  return f;
}

inline ckptd::v1::WatchEventsResponse StateChangeEvent(const std::string& job, uint64_t step,
                                                       ckptd::v1::StepState state,
                                                       const std::string& reason) {
  ckptd::v1::WatchEventsResponse e;
  auto* change = e.mutable_state_change();
  change->set_job(job);
  change->set_step(step);
  change->set_state(state);
  change->set_reason(reason);
  return e;
}

}  // namespace ckpt
