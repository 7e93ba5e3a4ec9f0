#include "daemon/component_stack.h"

#include <chrono>

#include "common/logging.h"

namespace ckpt {

Status ComponentStack::Start(std::string name, const std::function<Status()>& start,
                             std::function<void()> stop) {
  RETURN_IF_ERROR(start());
  started_.push_back({std::move(name), std::move(stop)});
  return Status::Ok();
}

void ComponentStack::StartInfallible(std::string name, const std::function<void()>& start,
                                     std::function<void()> stop) {
  start();
  started_.push_back({std::move(name), std::move(stop)});
}

void ComponentStack::StopAll() {
  while (!started_.empty()) {
    // Popped before it runs: a stop that throws is not run again by the destructor.
    Component c = std::move(started_.back());
    started_.pop_back();
    const auto begin = std::chrono::steady_clock::now();
    c.stop();
    const std::chrono::duration<double, std::milli> took = std::chrono::steady_clock::now() - begin;
    spdlog::info("{}: stopped {} in {:.1f} ms", what_, c.name, took.count());
  }
}

std::vector<std::string> ComponentStack::running() const {
  std::vector<std::string> names;
  for (const Component& c : started_) names.push_back(c.name);
  return names;
}

}  // namespace ckpt
