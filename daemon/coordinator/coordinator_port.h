// CoordinatorPort: how a node's state (NodeState) speaks to the global coordinator, with no
// transport in it — protobuf messages in, decisions and plans out through Handler.
//
// The implementation today is CoordinatorLink (gRPC to a remote ckpt-coordinator); the node
// state neither knows nor includes it, so the daemon core compiles and links without gRPC.
// Every call returns at once: reports are queued and delivered in order, answers and events
// arrive on the daemon's loop.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "ckptd/v1/coordinator.pb.h"
#include "ckptd/v1/manifest.pb.h"
#include "common/status.h"

namespace ckpt {

class CoordinatorPort {
 public:
  // Implemented by the node state; called on the daemon's loop.
  // What the coordinator said to a registration (ckptd.v1.RegisterNodeResponse).
  struct Registration {
    uint64_t epoch = 0;   // stamped on every report made from now on (0: none)
    bool fenced = false;  // this process was declared lost since its last registration
  };
  class Handler {
   public:
    virtual ~Handler() = default;
    // (Re)connected: re-report everything still in flight (reports are idempotent) — or, when
    // `fenced`, end it: the coordinator ended it when it declared this node lost.
    virtual void OnCoordinatorConnected(const Registration& registration) = 0;
    // A step decision or a writer plan.
    virtual void OnCoordinatorEvent(const ckptd::v1::CoordinatorEvent& event) = 0;
  };
  // A question for the job's restore point (restore_points.h) instead of its newest step.
  struct RestoreQuery {
    uint32_t rank = 0;
    uint32_t world_size = 0;
    std::string session;  // unique per trainer connection: "<node id>/<session id>"
  };
  using LatestDone = std::function<void(Result<std::optional<uint64_t>>)>;

  virtual ~CoordinatorPort() = default;
  virtual void ReportRanks(ckptd::v1::ReportRanksRequest request) = 0;
  virtual void ReportRegistration(ckptd::v1::ReportRegistrationRequest request) = 0;
  // `done` runs on the loop.
  virtual void Latest(const std::string& job, std::optional<RestoreQuery> restore_point,
                      LatestDone done) = 0;
  // Who reads which stored bytes of a cold load across nodes (load_planner.h). `done` runs on
  // the loop, or at once from the caller when the port plans no loads: kUnimplemented, the
  // default (the coordinator in process serves one node, whose loads already read once).
  using PlanLoadDone = std::function<void(Result<ckptd::v1::LoadPlanResponse>)>;
  virtual void PlanLoad(ckptd::v1::LoadPlanRequest /*request*/, PlanLoadDone done) {
    done(Unimplemented("no coordinator plans loads across nodes here"));
  }
  // The manifest of a memory-only step (CoordinatorCore::StepManifest): it is nowhere else.
  // `done` runs on the loop.
  using StepManifestDone = std::function<void(Result<std::shared_ptr<const ckptd::v1::Manifest>>)>;
  virtual void StepManifest(const std::string& job, uint64_t step, StepManifestDone done) = 0;
};

}  // namespace ckpt
