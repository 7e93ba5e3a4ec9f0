#include "common/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <string>

namespace ckpt {

void InitLogging(std::string_view name, std::string_view level) {
  auto logger = spdlog::stderr_color_mt(std::string(name));
  spdlog::set_default_logger(logger);
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%L%$ [%n %t] %v");
  auto lvl = spdlog::level::from_str(std::string(level));
  // from_str maps unknown names to "off"; keep info in that case.
  if (lvl == spdlog::level::off && level != "off") lvl = spdlog::level::info;
  spdlog::set_level(lvl);
  spdlog::flush_on(spdlog::level::warn);
}

}  // namespace ckpt
