#include "daemon/peer/peer_observer.h"

namespace ckpt::peer {

std::string_view PeerFailureReason(StatusCode code) {
  switch (code) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kOutOfRange:
      return "invalid";
    case StatusCode::kNotFound:
      return "not_found";
    case StatusCode::kResourceExhausted:
      return "full";
    case StatusCode::kDataLoss:
      return "checksum";
    case StatusCode::kDeadlineExceeded:
      return "timeout";
    case StatusCode::kUnavailable:
      return "unavailable";
    default:
      return "error";
  }
}

}  // namespace ckpt::peer
