// SystemdWatchdog: sends WATCHDOG=1 to systemd at half the interval systemd asked for
// ($WATCHDOG_USEC, honoured only when $WATCHDOG_PID is unset or names this process), from a
// timer on the daemon's Asio loop — so a loop that hangs stops the pings and systemd restarts
// the daemon (WatchdogSec= in the unit). A no-op when the variables are absent.
// Thread safety: Start/Stop on the loop's thread or before it runs.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <optional>

namespace ckpt {

// The ping interval systemd asks for (half of WATCHDOG_USEC), or nullopt.
std::optional<std::chrono::microseconds> WatchdogIntervalFromEnv();

class SystemdWatchdog {
 public:
  explicit SystemdWatchdog(boost::asio::io_context& io) : timer_(io) {}
  // Returns true when pings were started.
  bool Start();
  void Stop() { timer_.cancel(); }

 private:
  void Arm();
  boost::asio::steady_timer timer_;
  std::chrono::microseconds interval_{0};
};

}  // namespace ckpt
