// MetricsEndpoint: the one HTTP server of Prometheus text on /metrics, shared by ckptd
// (`--metrics`, daemon_metrics.h) and ckpt-coordinator (`--metrics`, coordinator_metrics.h), so
// both bind, report the bound port and fail the same way. It is prometheus-cpp's pull exposer
// with one thread: scrapes are rare and cheap, and a second thread would only add contention.
//
// The bound address ("host:port", the real port when asked for port 0) is logged as
// "metrics: Prometheus endpoint http://HOST:PORT/metrics": operators and tests read the port
// from there (or from the admin status' `metrics-bound`).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace prometheus {
class Collectable;
class Exposer;
}  // namespace prometheus

namespace ckpt {

class MetricsEndpoint {
 public:
  MetricsEndpoint();
  ~MetricsEndpoint();
  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;

  // Serves `collectables` (in this order) on http://address/metrics ("127.0.0.1:7461"; port 0
  // picks one). Fails when it cannot bind. Call once.
  Status Serve(const std::string& address,
               const std::vector<std::shared_ptr<prometheus::Collectable>>& collectables);
  // "host:port" actually bound, after Serve; empty before.
  const std::string& bound_address() const { return bound_address_; }

 private:
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::string bound_address_;
};

}  // namespace ckpt
