#include "daemon/coordinator/restore_points.h"

namespace ckpt {

std::optional<std::optional<uint64_t>> RestorePoints::Take(Pins::iterator it, uint32_t rank,
                                                           uint32_t world_size,
                                                           const std::string& session) {
  PinRecord& pin = it->second;
  auto asked = pin.asked.find(rank);
  if (pin.world_size != world_size || (asked != pin.asked.end() && asked->second != session)) {
    pins_.erase(it);  // another restart's pin
    return std::nullopt;
  }
  pin.asked.emplace(rank, session);
  return pin.step;
}

std::optional<std::optional<uint64_t>> RestorePoints::Find(const std::string& job, uint32_t rank,
                                                           uint32_t world_size,
                                                           const std::string& session) {
  auto it = pins_.find(job);
  if (it == pins_.end()) return std::nullopt;
  return Take(it, rank, world_size, session);
}

std::optional<uint64_t> RestorePoints::Pin(const std::string& job, uint32_t rank,
                                           uint32_t world_size, const std::string& session,
                                           std::optional<uint64_t> latest,
                                           std::set<uint64_t> known_steps) {
  if (auto it = pins_.find(job); it != pins_.end()) {
    if (auto pinned = Take(it, rank, world_size, session)) return *pinned;
  }
  PinRecord& pin = pins_[job];
  pin.step = latest;
  pin.world_size = world_size;
  pin.asked = {{rank, session}};
  pin.known_steps = std::move(known_steps);
  return latest;
}

void RestorePoints::OnStepStarted(const std::string& job, uint64_t step) {
  auto it = pins_.find(job);
  if (it != pins_.end() && it->second.known_steps.count(step) == 0) pins_.erase(it);
}

void RestorePoints::OnSessionEnded(const std::string& job, uint32_t rank,
                                   const std::string& session) {
  auto it = pins_.find(job);
  if (it == pins_.end()) return;
  auto asked = it->second.asked.find(rank);
  if (asked != it->second.asked.end() && asked->second == session) pins_.erase(it);
}

}  // namespace ckpt
