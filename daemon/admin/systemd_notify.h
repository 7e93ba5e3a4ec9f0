// The systemd notify protocol (sd_notify(3), from libsystemd): READY, STOPPING, STATUS and
// WATCHDOG messages to the service manager. A no-op when the process was not started by systemd
// ($NOTIFY_SOCKET unset), so it is safe to call anywhere. Thread safe.
#pragma once

#include <string_view>

namespace ckpt {

// Sends e.g. "READY=1", "STOPPING=1", "STATUS=draining 2 steps". Errors are ignored (systemd
// notices a service that never says READY on its own).
void NotifySystemd(std::string_view message);

}  // namespace ckpt
