#include "daemon/coordinator/layout_registry.h"

#include <algorithm>
#include <utility>

namespace ckpt {

std::shared_ptr<const RankLayout> LayoutRegistry::Find(const LayoutFingerprint& fingerprint) const {
  auto it = entries_.find(fingerprint);
  return it == entries_.end() ? nullptr : it->second.layout.lock();
}

std::shared_ptr<const RankLayout> LayoutRegistry::Intern(std::shared_ptr<const RankLayout> layout) {
  Entry& e = entries_[layout->fingerprint];
  e.asked_at.reset();
  if (auto live = e.layout.lock()) return live;
  e.layout = layout;
  if (entries_.size() >= sweep_at_) Sweep();
  return layout;
}

bool LayoutRegistry::Ask(const LayoutFingerprint& fingerprint, Clock::time_point now) {
  Entry& e = entries_[fingerprint];
  if (e.asked_at && now - *e.asked_at < ask_timeout_) return false;
  e.asked_at = now;
  return true;
}

void LayoutRegistry::AddWaiter(const LayoutFingerprint& fingerprint, Waiter waiter) {
  entries_[fingerprint].waiters.push_back(std::move(waiter));
}

std::vector<LayoutRegistry::Waiter> LayoutRegistry::TakeWaiters(
    const LayoutFingerprint& fingerprint) {
  auto it = entries_.find(fingerprint);
  if (it == entries_.end()) return {};
  it->second.turn = 0;
  return std::exchange(it->second.waiters, {});
}

std::vector<std::pair<LayoutFingerprint, LayoutRegistry::Waiter>> LayoutRegistry::OverdueAsks(
    Clock::time_point now) {
  std::vector<std::pair<LayoutFingerprint, Waiter>> out;
  for (auto& [fingerprint, e] : entries_) {
    if (e.waiters.empty() || !e.asked_at || now - *e.asked_at < ask_timeout_) continue;
    e.asked_at = now;
    out.emplace_back(fingerprint, e.waiters[e.turn++ % e.waiters.size()]);
  }
  return out;
}

std::optional<LayoutRegistry::Clock::time_point> LayoutRegistry::NextDeadline() const {
  std::optional<Clock::time_point> next;
  for (const auto& [fingerprint, e] : entries_) {
    if (e.waiters.empty() || !e.asked_at) continue;
    const auto due = *e.asked_at + ask_timeout_;
    if (!next || due < *next) next = due;
  }
  return next;
}

size_t LayoutRegistry::live_layouts() const {
  size_t n = 0;
  for (const auto& [fingerprint, e] : entries_) n += e.layout.expired() ? 0 : 1;
  return n;
}

size_t LayoutRegistry::waiting() const {
  size_t n = 0;
  for (const auto& [fingerprint, e] : entries_) n += e.waiters.size();
  return n;
}

void LayoutRegistry::Sweep() {
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (it->second.layout.expired() && it->second.waiters.empty() && !it->second.asked_at) {
      it = entries_.erase(it);
    } else {
      ++it;
    }
  }
  sweep_at_ = std::max<size_t>(1024, entries_.size() * 2);
}

}  // namespace ckpt
