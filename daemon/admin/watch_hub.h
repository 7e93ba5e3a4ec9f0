// WatchHub: fans the events of one process (step state changes, progress samples) out to every
// open WatchEvents stream. Publishers call Publish from anywhere; each subscriber gets a copy of
// the events whose job matches its filter ("" = all jobs) through its `deliver` callback.
//
// Thread safety: all methods are safe from any thread. `deliver` runs under the hub's mutex, so it
// must only queue the event and return (the stream reactor does exactly that); it must not call
// back into the hub. Memory stays bounded because each subscriber caps its own queue.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "ckptd/v1/admin.pb.h"
#include "common/mutex.h"

namespace ckpt {

class WatchHub {
 public:
  using Deliver = std::function<void(const ckptd::v1::WatchEventsResponse&)>;

  using Closed = std::function<void()>;

  // Returns an id for Unsubscribe. After Unsubscribe returns, neither callback is called again.
  // `closed` runs (under the hub's mutex, like `deliver`) when CloseAll ends the subscription.
  uint64_t Subscribe(std::string job, Deliver deliver, Closed closed);
  void Unsubscribe(uint64_t id);
  size_t subscribers() const;

  // The server is going away: tells every subscriber (so streams end at once instead of at the
  // server's shutdown deadline) and refuses later subscriptions (their `closed` runs at once).
  void CloseAll();

  // Stamps unix_time_ms and delivers to every subscriber whose filter matches `job`.
  void Publish(const std::string& job, ckptd::v1::WatchEventsResponse event);

 private:
  struct Subscriber {
    std::string job;
    Deliver deliver;
    Closed closed;
  };
  mutable Mutex mu_;
  std::map<uint64_t, Subscriber> subscribers_ GUARDED_BY(mu_);
  uint64_t next_id_ GUARDED_BY(mu_) = 1;
  bool closed_ GUARDED_BY(mu_) = false;
};

}  // namespace ckpt
