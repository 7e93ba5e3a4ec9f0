#include "daemon/thread_priority.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/logging.h"

namespace ckpt {

void SetThisThreadNice(int nice) {
  if (nice == 0) return;
  // On Linux a nice value belongs to the thread: PRIO_PROCESS with a thread id sets only it.
  if (::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), nice) != 0) {
    spdlog::warn("cannot set a background thread's nice value to {}: {}", nice,
                 std::strerror(errno));
  }
}

}  // namespace ckpt
