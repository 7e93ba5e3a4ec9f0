// ckptctl's online commands: they ask a running daemon (or ckpt-coordinator) over its admin
// gRPC endpoint (ckptd.v1.Admin, grpc.health.v1.Health).
//
//   status               node, version, uptime, health, host pool by state, connected trainers,
//                        steps in flight with bytes captured / persisted, recent failures
//   list JOB             committed steps of a job and its LATEST
//   describe JOB STEP    a committed step's MANIFEST (tensors, shards, ranks)
//   watch [--job JOB]    state changes as they happen and live progress (rate, ETA) of
//                        in-flight steps; --max-events N ends after N events
//   health               SERVING or NOT_SERVING; the exit code is what an exec probe needs
//   pin JOB STEP         keep a committed step from retention until unpinned (durable)
//   unpin JOB STEP       hand a pinned step back to retention (the next commit may remove it)
//   delete JOB STEP      remove a committed step now; never the newest committed step, a
//                        pinned one or one in flight. The server (a daemon with the embedded
//                        coordinator, or ckpt-coordinator) refuses all three when it runs with
//                        admin-read-only.
//   release-job JOB      drop a finished job's copies in other nodes' memory now (its
//                        memory-only steps stop being restorable); ckpt-coordinator only, and
//                        only once no rank of the job is registered. The coordinator does it by
//                        itself after --peer-job-ttl.
//
// --json prints the proto3 JSON mapping of the reply (field names as in admin.proto; 64-bit
// integers are JSON strings, as that mapping prescribes); watch prints one JSON object per line.
// Exit codes: 0 success / SERVING; 1 the endpoint could not be reached, the call failed, or
// health is not SERVING; 2 usage errors.
#pragma once

#include <cstdint>
#include <string>

#include "client/ckptctl/admin_channel.h"

namespace ckpt::ctl {

int RunStatus(const AdminTarget& target);
int RunList(const AdminTarget& target, const std::string& job);
int RunDescribe(const AdminTarget& target, const std::string& job, uint64_t step);
int RunHealth(const AdminTarget& target, const std::string& service);
enum class StepOperation { kPin, kUnpin, kDelete };
int RunStepOperation(const AdminTarget& target, StepOperation op, const std::string& job,
                     uint64_t step);
int RunReleaseJob(const AdminTarget& target, const std::string& job);
struct WatchOptions {
  std::string job;          // empty: every job
  uint64_t max_events = 0;  // 0: until interrupted or the stream ends
  uint32_t progress_interval_ms = 1000;
};
int RunWatch(const AdminTarget& target, const WatchOptions& options);

}  // namespace ckpt::ctl
