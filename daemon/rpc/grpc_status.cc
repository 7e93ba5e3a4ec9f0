#include "daemon/rpc/grpc_status.h"

namespace ckpt {

static_assert(static_cast<int>(StatusCode::kDataLoss) == grpc::StatusCode::DATA_LOSS &&
                  static_cast<int>(StatusCode::kPermissionDenied) ==
                      grpc::StatusCode::PERMISSION_DENIED,
              "StatusCode must mirror grpc::StatusCode");

grpc::Status ToGrpcStatus(const Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), status.message());
}

}  // namespace ckpt
