// ckpt::Status → grpc::Status, for every gRPC service of the daemon and the coordinator (the one
// place the two meet). StatusCode mirrors the gRPC codes one to one (common/status.h), so the
// code and message pass through unchanged.
#pragma once

#include <grpcpp/support/status.h>

#include "common/status.h"

namespace ckpt {

grpc::Status ToGrpcStatus(const Status& status);

}  // namespace ckpt
