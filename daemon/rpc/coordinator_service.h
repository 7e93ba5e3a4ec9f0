// CoordinatorService: the gRPC face of CoordinatorCore (callback API). It only translates:
// each unary RPC is one short core call under the core's lock (no I/O — commits and removals
// run on the core's commit thread), Watch is a write reactor that queues the core's events and
// writes them one at a time. A Watch that ends tells the core, which starts the node's lease.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "ckptd/v1/coordinator.grpc.pb.h"
#include "daemon/coordinator/coordinator_core.h"

namespace ckpt {

class CoordinatorService final : public ckptd::v1::Coordinator::CallbackService {
 public:
  // `incarnation` is returned by RegisterNode; a restarted coordinator must use a new one.
  CoordinatorService(CoordinatorCore* core, std::string incarnation)
      : core_(core), incarnation_(std::move(incarnation)) {}

  grpc::ServerUnaryReactor* RegisterNode(grpc::CallbackServerContext* ctx,
                                         const ckptd::v1::RegisterNodeRequest* req,
                                         ckptd::v1::RegisterNodeResponse* resp) override;
  grpc::ServerWriteReactor<ckptd::v1::CoordinatorEvent>* Watch(
      grpc::CallbackServerContext* ctx, const ckptd::v1::WatchRequest* req) override;
  grpc::ServerUnaryReactor* ReportRanks(grpc::CallbackServerContext* ctx,
                                        const ckptd::v1::ReportRanksRequest* req,
                                        ckptd::v1::ReportRanksResponse* resp) override;
  grpc::ServerUnaryReactor* ReportRegistration(
      grpc::CallbackServerContext* ctx, const ckptd::v1::ReportRegistrationRequest* req,
      ckptd::v1::ReportRegistrationResponse* resp) override;
  grpc::ServerUnaryReactor* Latest(grpc::CallbackServerContext* ctx,
                                   const ckptd::v1::JobRequest* req,
                                   ckptd::v1::LatestResponse* resp) override;
  grpc::ServerUnaryReactor* ListSteps(grpc::CallbackServerContext* ctx,
                                      const ckptd::v1::JobRequest* req,
                                      ckptd::v1::ListStepsResponse* resp) override;
  grpc::ServerUnaryReactor* PlanLoad(grpc::CallbackServerContext* ctx,
                                     const ckptd::v1::LoadPlanRequest* req,
                                     ckptd::v1::LoadPlanResponse* resp) override;
  grpc::ServerUnaryReactor* StepManifest(grpc::CallbackServerContext* ctx,
                                         const ckptd::v1::StepManifestRequest* req,
                                         ckptd::v1::Manifest* resp) override;

 private:
  CoordinatorCore* core_;
  std::string incarnation_;
};

}  // namespace ckpt
