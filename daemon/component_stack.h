// ComponentStack: the start/stop order of a process's long-lived parts, written once.
//
// A daemon brings its parts up in dependency order (threads before what feeds them, the socket
// last) and must take them down in exactly the reverse order, both at shutdown and when a start
// fails halfway: an engine stopped while something still feeds it loses work, a socket left
// open after the engines stop accepts work nobody will do. Written by hand, that teardown is
// repeated at every early return and drifts. Here each part is pushed when it starts, with the
// stop that undoes it; StopAll runs those stops newest first and logs each one with its name and
// how long it took (a slow shutdown names its culprit).
//
// A start that fails registers nothing and returns its error; the caller returns, and the
// destructor stops what did start. No start is retried and no stop is run twice: StopAll is
// idempotent, so an explicit StopAll at shutdown and the destructor after it do not collide.
//
// Not thread-safe: one thread starts and stops (the daemon's main thread).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "common/status.h"

namespace ckpt {

class ComponentStack {
 public:
  // `what` names the stack in its log lines ("operations", "service").
  explicit ComponentStack(std::string what) : what_(std::move(what)) {}
  ~ComponentStack() { StopAll(); }
  ComponentStack(const ComponentStack&) = delete;
  ComponentStack& operator=(const ComponentStack&) = delete;

  // Runs `start`; when it succeeds, `name` is on the stack and `stop` will undo it. When it
  // fails, nothing is pushed and its status is returned unchanged.
  Status Start(std::string name, const std::function<Status()>& start, std::function<void()> stop);
  // The same for a start that cannot fail (a thread pool's): always pushed.
  void StartInfallible(std::string name, const std::function<void()>& start,
                       std::function<void()> stop);

  // Stops every started component, newest first, one log line each. Later calls do nothing.
  void StopAll();

  // Names of the components started and not yet stopped, oldest first.
  std::vector<std::string> running() const;

 private:
  struct Component {
    std::string name;
    std::function<void()> stop;
  };
  std::string what_;
  std::vector<Component> started_;
};

}  // namespace ckpt
