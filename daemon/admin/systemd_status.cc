#include "daemon/admin/systemd_status.h"

#include <cstdlib>

#include "daemon/admin/systemd_notify.h"

namespace ckpt {

SystemdStatus::SystemdStatus() : enabled_(std::getenv("NOTIFY_SOCKET") != nullptr) {}

void SystemdStatus::OnStepState(const std::string& job, uint64_t step, ckptd::v1::StepState state,
                                const std::string& reason) {
  if (!enabled_) return;
  const auto key = std::make_pair(job, step);
  const std::string what = "job '" + job + "' step " + std::to_string(step);
  switch (state) {
    case ckptd::v1::STEP_STATE_COMMITTED:
      in_flight_.erase(key);
      last_commit_ = what;
      break;
    case ckptd::v1::STEP_STATE_ABORTED:
    case ckptd::v1::STEP_STATE_FAILED:
      in_flight_.erase(key);
      last_failure_ = what + ": " + reason.substr(0, 200);
      break;
    default:
      if (!in_flight_.insert(key).second) return;  // already counted: nothing changed
  }
  std::string status = "STATUS=serving; " + std::to_string(in_flight_.size()) + " step" +
                       (in_flight_.size() == 1 ? "" : "s") + " in flight";
  if (!last_commit_.empty()) status += "; last commit: " + last_commit_;
  if (!last_failure_.empty()) status += "; last failure: " + last_failure_;
  NotifySystemd(status);
}

}  // namespace ckpt
