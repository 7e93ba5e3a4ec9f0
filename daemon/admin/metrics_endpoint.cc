#include "daemon/admin/metrics_endpoint.h"

#include <prometheus/collectable.h>
#include <prometheus/exposer.h>

#include <exception>

#include "common/logging.h"

namespace ckpt {

MetricsEndpoint::MetricsEndpoint() = default;
MetricsEndpoint::~MetricsEndpoint() = default;

Status MetricsEndpoint::Serve(
    const std::string& address,
    const std::vector<std::shared_ptr<prometheus::Collectable>>& collectables) {
  try {
    exposer_ = std::make_unique<prometheus::Exposer>(address, 1);
  } catch (const std::exception& e) {
    return Unavailable("metrics: cannot serve HTTP on " + address + ": " + e.what());
  }
  for (const auto& c : collectables) exposer_->RegisterCollectable(c);
  const auto ports = exposer_->GetListeningPorts();
  bound_address_ = address.substr(0, address.rfind(':') + 1) +
                   (ports.empty() ? std::string("?") : std::to_string(ports.front()));
  spdlog::info("metrics: Prometheus endpoint http://{}/metrics", bound_address_);
  return Status::Ok();
}

}  // namespace ckpt
