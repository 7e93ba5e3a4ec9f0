#include "daemon/coordinator/restore_points.h"

namespace ckpt {

std::optional<std::optional<uint64_t>> RestorePoints::Take(
    std::map<std::string, PinRecord>::iterator it, uint32_t rank, uint32_t world_size,
    Clock::time_point now) {
  PinRecord& pin = it->second;
  if (pin.world_size != world_size || pin.asked.count(rank) != 0 || now >= pin.expires) {
    pins_.erase(it);  // another restart's pin
    return std::nullopt;
  }
  pin.asked.insert(rank);
  const std::optional<uint64_t> step = pin.step;
  if (pin.asked.size() >= pin.world_size) pins_.erase(it);  // every rank has its answer
  return step;
}

std::optional<std::optional<uint64_t>> RestorePoints::Find(const std::string& job, uint32_t rank,
                                                           uint32_t world_size,
                                                           Clock::time_point now) {
  auto it = pins_.find(job);
  if (it == pins_.end()) return std::nullopt;
  return Take(it, rank, world_size, now);
}

std::optional<uint64_t> RestorePoints::Pin(const std::string& job, uint32_t rank,
                                           uint32_t world_size, std::optional<uint64_t> latest,
                                           Clock::time_point now) {
  if (auto it = pins_.find(job); it != pins_.end()) {
    if (auto pinned = Take(it, rank, world_size, now)) return *pinned;
  }
  if (world_size <= 1) return latest;  // nobody to agree with
  PinRecord& pin = pins_[job];
  pin.step = latest;
  pin.world_size = world_size;
  pin.asked = {rank};
  pin.expires = now + ttl_;
  return latest;
}

}  // namespace ckpt
