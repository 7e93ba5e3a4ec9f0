// The systemd notify protocol (sd_notify(3)) without libsystemd: one datagram per message to
// the AF_UNIX socket named by $NOTIFY_SOCKET ("@name" is the abstract namespace). A no-op when
// the variable is unset, so it is safe to call anywhere. Thread safe.
#pragma once

#include <string_view>

namespace ckpt {

// Sends e.g. "READY=1", "STOPPING=1", "STATUS=draining 2 steps". Errors are ignored (systemd
// notices a service that never says READY on its own).
void NotifySystemd(std::string_view message);

}  // namespace ckpt
