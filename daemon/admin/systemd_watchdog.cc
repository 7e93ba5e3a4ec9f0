#include "daemon/admin/systemd_watchdog.h"

#include <unistd.h>

#include <cstdlib>
#include <string>

#include "common/logging.h"
#include "daemon/admin/systemd_notify.h"

namespace ckpt {

std::optional<std::chrono::microseconds> WatchdogIntervalFromEnv() {
  const char* usec = std::getenv("WATCHDOG_USEC");
  if (usec == nullptr || *usec == '\0') return std::nullopt;
  const char* pid = std::getenv("WATCHDOG_PID");
  if (pid != nullptr && *pid != '\0' && std::strtoll(pid, nullptr, 10) != ::getpid()) {
    return std::nullopt;  // meant for another process (e.g. a wrapper that exec'd us)
  }
  char* end = nullptr;
  const unsigned long long value = std::strtoull(usec, &end, 10);
  if (end == usec || *end != '\0' || value == 0) {
    spdlog::warn("WATCHDOG_USEC='{}' is not a positive number of microseconds; no watchdog", usec);
    return std::nullopt;
  }
  return std::chrono::microseconds(value / 2);
}

bool SystemdWatchdog::Start() {
  auto interval = WatchdogIntervalFromEnv();
  if (!interval) return false;
  interval_ = *interval;
  spdlog::info("systemd watchdog: WATCHDOG=1 every {} ms", interval_.count() / 1000);
  NotifySystemd("WATCHDOG=1");
  Arm();
  return true;
}

void SystemdWatchdog::Arm() {
  timer_.expires_after(interval_);
  timer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec) return;
    NotifySystemd("WATCHDOG=1");
    Arm();
  });
}

}  // namespace ckpt
