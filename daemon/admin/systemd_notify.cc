#include "daemon/admin/systemd_notify.h"

#include <systemd/sd-daemon.h>

#include <string>

namespace ckpt {

void NotifySystemd(std::string_view message) {
  ::sd_notify(/*unset_environment=*/0, std::string(message).c_str());
}

}  // namespace ckpt
