// PeerObserver: what the data plane tells the daemon's metrics (daemon/admin/daemon_metrics.h:
// ckptd_peer_bytes_total{direction}, ckptd_peer_requests_failed_total{reason}). Methods may be
// called from any thread (the server's loop and pool, a client's caller) and must not block.
#pragma once

#include <cstdint>
#include <string_view>

#include "common/status.h"

namespace ckpt::peer {

enum class Direction { kSent, kReceived };

class PeerObserver {
 public:
  virtual ~PeerObserver() = default;
  // Data bytes (chunk payloads, not headers) that crossed the data plane.
  virtual void OnPeerBytes(Direction direction, uint64_t bytes) = 0;
  // A request refused or failed, by either side. `reason` is one of: malformed (a frame that
  // cannot be parsed), invalid (bad names or region), not_found, full (the peer pool), checksum,
  // timeout, unavailable (connection lost or refused), error (anything else).
  virtual void OnPeerFailure(std::string_view reason) = 0;
};

// The `reason` label for a failed request's status.
std::string_view PeerFailureReason(StatusCode code);

}  // namespace ckpt::peer
