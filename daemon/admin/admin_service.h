// AdminService: the gRPC callback service for ckptd.v1.Admin. It only translates: each unary call
// asks the AdminProvider and finishes the RPC from the provider's reply (no blocking in a
// reactor, docs/design.md §10.4); WatchEvents subscribes a bounded per-stream queue to the
// provider's WatchHub. Status → grpc::Status happens in ToGrpcStatus (daemon/rpc/grpc_status.h)
// only.
//
// Watch streams: each holds at most kMaxQueuedEvents unsent events; a client that falls further
// behind is ended with RESOURCE_EXHAUSTED rather than growing the daemon's memory. Progress
// samples of a step are forwarded at most once per the request's progress_interval_ms.
// Access: the endpoint's transport rule decides who reaches it at all (loopback, a Unix socket,
// or TLS with client certificates: daemon/rpc/grpc_server.h); with `read_only` (the
// admin-read-only key) the operations that change what is kept — PinCheckpoint, UnpinCheckpoint,
// DeleteCheckpoint, ReleaseJob — are refused with PERMISSION_DENIED before the provider sees
// them.
// Thread safety: gRPC calls it from its own threads; the provider must outlive the server.
#pragma once

#include <grpcpp/grpcpp.h>

#include "ckptd/v1/admin.grpc.pb.h"
#include "daemon/admin/admin_provider.h"

namespace ckpt {

class AdminService final : public ckptd::v1::Admin::CallbackService {
 public:
  static constexpr size_t kMaxQueuedEvents = 4096;

  explicit AdminService(AdminProvider* provider, bool read_only = false)
      : provider_(provider), read_only_(read_only) {}

  grpc::ServerUnaryReactor* GetStatus(grpc::CallbackServerContext* ctx,
                                      const ckptd::v1::GetStatusRequest* request,
                                      ckptd::v1::GetStatusResponse* response) override;
  grpc::ServerUnaryReactor* ListCheckpoints(grpc::CallbackServerContext* ctx,
                                            const ckptd::v1::ListCheckpointsRequest* request,
                                            ckptd::v1::ListCheckpointsResponse* response) override;
  grpc::ServerUnaryReactor* DescribeCheckpoint(
      grpc::CallbackServerContext* ctx, const ckptd::v1::DescribeCheckpointRequest* request,
      ckptd::v1::DescribeCheckpointResponse* response) override;
  grpc::ServerWriteReactor<ckptd::v1::WatchEventsResponse>* WatchEvents(
      grpc::CallbackServerContext* ctx, const ckptd::v1::WatchEventsRequest* request) override;
  grpc::ServerUnaryReactor* PinCheckpoint(grpc::CallbackServerContext* ctx,
                                          const ckptd::v1::PinCheckpointRequest* request,
                                          ckptd::v1::PinCheckpointResponse* response) override;
  grpc::ServerUnaryReactor* UnpinCheckpoint(grpc::CallbackServerContext* ctx,
                                            const ckptd::v1::UnpinCheckpointRequest* request,
                                            ckptd::v1::UnpinCheckpointResponse* response) override;
  grpc::ServerUnaryReactor* DeleteCheckpoint(
      grpc::CallbackServerContext* ctx, const ckptd::v1::DeleteCheckpointRequest* request,
      ckptd::v1::DeleteCheckpointResponse* response) override;
  grpc::ServerUnaryReactor* ReleaseJob(grpc::CallbackServerContext* ctx,
                                       const ckptd::v1::ReleaseJobRequest* request,
                                       ckptd::v1::ReleaseJobResponse* response) override;

 private:
  // PERMISSION_DENIED for an operation under read_only_; OK otherwise.
  Status CheckWritable(const std::string& what) const;
  // Pin, unpin and delete: the read-only check, then `operation` of the provider.
  template <typename Request, typename Response, typename Operation>
  grpc::ServerUnaryReactor* StepOperation(grpc::CallbackServerContext* ctx, const char* verb,
                                          const Request* request, Response* response,
                                          Operation operation);

  AdminProvider* provider_;
  bool read_only_;
};

}  // namespace ckpt
