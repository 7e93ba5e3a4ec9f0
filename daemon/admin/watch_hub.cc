#include "daemon/admin/watch_hub.h"

#include <chrono>

namespace ckpt {

uint64_t WatchHub::Subscribe(std::string job, Deliver deliver, Closed closed) {
  MutexLock lock(mu_);
  const uint64_t id = next_id_++;
  if (closed_) {
    closed();
    return id;
  }
  subscribers_.emplace(id, Subscriber{std::move(job), std::move(deliver), std::move(closed)});
  return id;
}

void WatchHub::CloseAll() {
  MutexLock lock(mu_);
  closed_ = true;
  for (const auto& [id, s] : subscribers_) s.closed();
  subscribers_.clear();
}

void WatchHub::Unsubscribe(uint64_t id) {
  MutexLock lock(mu_);
  subscribers_.erase(id);
}

size_t WatchHub::subscribers() const {
  MutexLock lock(mu_);
  return subscribers_.size();
}

void WatchHub::Publish(const std::string& job, ckptd::v1::WatchEventsResponse event) {
  event.set_unix_time_ms(std::chrono::duration_cast<std::chrono::milliseconds>(
                             std::chrono::system_clock::now().time_since_epoch())
                             .count());
  MutexLock lock(mu_);
  for (const auto& [id, s] : subscribers_) {
    if (s.job.empty() || s.job == job) s.deliver(event);
  }
}

}  // namespace ckpt
