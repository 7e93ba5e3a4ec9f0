// Logging: spdlog, one process-wide logger. Levels from --log-level / CKPT_LOG_LEVEL
// (trace, debug, info, warn, error). Thread safe.
#pragma once

#include <spdlog/spdlog.h>

#include <string_view>

namespace ckpt {

// Sets the pattern and level. "name" prefixes lines ("ckptd", "ckpt-coordinator").
void InitLogging(std::string_view name, std::string_view level);

}  // namespace ckpt
