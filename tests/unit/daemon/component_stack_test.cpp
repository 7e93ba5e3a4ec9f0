// ComponentStack (daemon/component_stack.h): components start in the order given, stop newest
// first, a failed start leaves only what did start to be stopped, and stopping twice (StopAll,
// then the destructor) stops each component once.
#include "daemon/component_stack.h"

#include <functional>
#include <string>
#include <vector>

#include "tests/test_util.h"

namespace ckpt {
namespace {

// Records "start X" / "stop X" in the order they happen.
struct Journal {
  std::vector<std::string> events;
  std::function<void()> Starts(const std::string& name) {
    return [this, name] { events.push_back("start " + name); };
  }
  std::function<void()> Stops(const std::string& name) {
    return [this, name] { events.push_back("stop " + name); };
  }
};

TEST_CASE("component stack: starts in order, stops newest first", "[component_stack]") {
  Journal j;
  ComponentStack stack("test");
  stack.StartInfallible("storage", j.Starts("storage"), j.Stops("storage"));
  REQUIRE_OK(stack.Start(
      "engine",
      [&] {
        j.Starts("engine")();
        return Status::Ok();
      },
      j.Stops("engine")));
  stack.StartInfallible("socket", j.Starts("socket"), j.Stops("socket"));
  CHECK(stack.running() == std::vector<std::string>{"storage", "engine", "socket"});

  stack.StopAll();
  CHECK(j.events == std::vector<std::string>{"start storage", "start engine", "start socket",
                                             "stop socket", "stop engine", "stop storage"});
  CHECK(stack.running().empty());
}

TEST_CASE("component stack: a failed start is not stopped, what started before it is",
          "[component_stack]") {
  Journal j;
  Status failed;
  {
    ComponentStack stack("test");
    stack.StartInfallible("storage", j.Starts("storage"), j.Stops("storage"));
    stack.StartInfallible("engine", j.Starts("engine"), j.Stops("engine"));
    failed = stack.Start(
        "socket", [] { return InvalidArgument("socket path too long"); }, j.Stops("socket"));
    CHECK(stack.running() == std::vector<std::string>{"storage", "engine"});
    // The caller returns on the error: leaving the scope stops what started.
  }
  CHECK(failed.code() == StatusCode::kInvalidArgument);
  CHECK(failed.message() == "socket path too long");  // unchanged: the caller logs it as is
  CHECK(j.events ==
        std::vector<std::string>{"start storage", "start engine", "stop engine", "stop storage"});
}

TEST_CASE("component stack: stopping is idempotent", "[component_stack]") {
  Journal j;
  {
    ComponentStack stack("test");
    stack.StartInfallible("a", j.Starts("a"), j.Stops("a"));
    stack.StartInfallible("b", j.Starts("b"), j.Stops("b"));
    stack.StopAll();
    stack.StopAll();
  }  // and the destructor
  CHECK(j.events == std::vector<std::string>{"start a", "start b", "stop b", "stop a"});
}

TEST_CASE("component stack: two stacks stop in reverse of their declaration on scope exit",
          "[component_stack]") {
  // RunDaemon's shape: the operations stack starts its first component before the service stack
  // starts anything, yet is stopped first because it is declared (and so destroyed) last.
  Journal j;
  {
    ComponentStack service("service");
    ComponentStack operations("operations");
    operations.StartInfallible("admin", j.Starts("admin"), j.Stops("admin"));
    service.StartInfallible("engine", j.Starts("engine"), j.Stops("engine"));
    service.StartInfallible("socket", j.Starts("socket"), j.Stops("socket"));
  }
  CHECK(j.events == std::vector<std::string>{"start admin", "start engine", "start socket",
                                             "stop admin", "stop socket", "stop engine"});
}

}  // namespace
}  // namespace ckpt
