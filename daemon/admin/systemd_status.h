// SystemdStatus: keeps systemd's STATUS= line current (what `systemctl status ckptd` shows):
// steps in flight, the newest commit and the newest failure. An observer; a no-op unless
// $NOTIFY_SOCKET is set. Loop thread only.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <utility>

#include "daemon/daemon_observer.h"

namespace ckpt {

class SystemdStatus final : public DaemonObserver {
 public:
  SystemdStatus();
  void OnStepState(const std::string& job, uint64_t step, ckptd::v1::StepState state,
                   const std::string& reason) override;

 private:
  bool enabled_;
  std::set<std::pair<std::string, uint64_t>> in_flight_;
  std::string last_commit_;
  std::string last_failure_;
};

}  // namespace ckpt
