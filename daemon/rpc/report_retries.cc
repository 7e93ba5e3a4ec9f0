#include "daemon/rpc/report_retries.h"

namespace ckpt {

uint64_t ReportRetries::Queued(const std::string& key) {
  if (key.empty()) return 0;
  waiting_.erase(key);
  return newest_[key] = ++last_number_;
}

bool ReportRetries::Schedule(const std::string& key, uint64_t seq, Clock::time_point due,
                             std::function<void()> send) {
  if (key.empty()) {
    waiting_["\x01" + std::to_string(++unkeyed_)] = Waiting{due, std::move(send)};
    return true;
  }
  auto newest = newest_.find(key);
  if (newest == newest_.end() || newest->second != seq) return false;  // replaced since
  waiting_[key] = Waiting{due, std::move(send)};
  return true;
}

bool ReportRetries::IsNewest(const std::string& key, uint64_t seq) const {
  auto it = newest_.find(key);
  return it != newest_.end() && it->second == seq;
}

void ReportRetries::Done(const std::string& key, uint64_t seq) {
  if (key.empty()) return;
  if (auto it = newest_.find(key); it != newest_.end() && it->second == seq) newest_.erase(it);
}

std::function<void()> ReportRetries::TakeDue(Clock::time_point now) {
  auto first = waiting_.end();
  for (auto it = waiting_.begin(); it != waiting_.end(); ++it) {
    if (first == waiting_.end() || it->second.due < first->second.due) first = it;
  }
  if (first == waiting_.end() || first->second.due > now) return nullptr;
  std::function<void()> send = std::move(first->second.send);
  waiting_.erase(first);
  return send;
}

std::optional<ReportRetries::Clock::time_point> ReportRetries::NextDue() const {
  std::optional<Clock::time_point> first;
  for (const auto& [key, w] : waiting_) {
    if (!first || w.due < *first) first = w.due;
  }
  return first;
}

}  // namespace ckpt
