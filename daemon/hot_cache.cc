#include "daemon/hot_cache.h"

#include <algorithm>
#include <cstring>

namespace ckpt {

HotCache::~HotCache() {
  MutexLock lock(mu_);
  while (!steps_.empty()) FreeLocked(steps_.begin());
}

void HotCache::FreeLocked(std::map<Key, StepEntry>::iterator it) {
  ReleaseWindowsLocked(it);
  steps_.erase(it);
}

void HotCache::MaybeFreeLocked(std::map<Key, StepEntry>::iterator it) {
  StepEntry& e = it->second;
  if (e.pins != 0) return;
  if (e.keeps == 0 && (e.dropped || e.superseded || e.files.empty())) FreeLocked(it);
  pool_->WakeAll();  // unpinned: reclaimable (a keep does not stop ReclaimOne)
}

void HotCache::ReleaseWindowsLocked(std::map<Key, StepEntry>::iterator it) {
  for (auto& [file, windows] : it->second.files) {
    for (auto& [start, w] : windows) {
      pool_->Release(w.slot);
      --resident_slots_;
    }
  }
  it->second.files.clear();
}

void HotCache::DropOlderLocked(const std::string& job, uint64_t step) {
  for (auto it = steps_.lower_bound({job, 0});
       it != steps_.end() && it->first.first == job && it->first.second < step;) {
    auto next = std::next(it);
    if (it->second.pins == 0 && it->second.keeps == 0)
      FreeLocked(it);
    else
      it->second.superseded = true;
    it = next;
  }
}

void HotCache::AddValid(Window& w, uint64_t begin, uint64_t end) {
  w.valid.emplace_back(begin, end);
  std::sort(w.valid.begin(), w.valid.end());
  std::vector<std::pair<uint64_t, uint64_t>> merged;
  for (const auto& r : w.valid) {
    if (!merged.empty() && r.first <= merged.back().second) {
      merged.back().second = std::max(merged.back().second, r.second);
    } else {
      merged.push_back(r);
    }
  }
  w.valid = std::move(merged);
}

bool HotCache::NewerStepCachedLocked(const std::string& job, uint64_t step) const {
  // Only steps with bytes count: a pin alone (a load or a peer's FETCH asking for a step this
  // node does not hold) creates an empty entry, which must not make real bytes look stale.
  for (auto it = steps_.upper_bound({job, step}); it != steps_.end() && it->first.first == job;
       ++it) {
    if (!it->second.files.empty()) return true;
  }
  return false;
}

void HotCache::Adopt(const std::string& job, uint64_t step, const std::string& file,
                     uint64_t file_offset, uint64_t length, HostPool::SlotId slot) {
  MutexLock lock(mu_);
  // A newer step of this job is already cached: this one is stale on arrival, unless pinned
  // (a replication of it under way needs these bytes).
  auto self = steps_.find({job, step});
  const bool dropped = self != steps_.end() && self->second.dropped;  // goes when let go of
  const bool pinned =
      self != steps_.end() && !dropped && (self->second.pins > 0 || self->second.keeps > 0);
  if (dropped || (!pinned && NewerStepCachedLocked(job, step))) {
    pool_->Release(slot);
    return;
  }
  DropOlderLocked(job, step);
  StepEntry& e = steps_[{job, step}];
  e.last_use = ++clock_;
  auto& windows = e.files[file];
  auto [it, inserted] = windows.try_emplace(file_offset, Window{slot, {}});
  if (inserted) {
    ++resident_slots_;
  } else {  // a newer write of the same bytes (the step was saved again): it wins
    pool_->Release(it->second.slot);
    it->second = Window{slot, {}};
  }
  AddValid(it->second, 0, length);
  // An acquirer waiting for space may now reclaim this step.
  pool_->WakeAll();
}

void HotCache::InsertRead(const std::string& job, uint64_t step, const std::string& file,
                          uint64_t offset, const std::byte* data, uint64_t length) {
  const uint64_t window_size = pool_->slot_size();
  while (length > 0) {
    const uint64_t start = offset / window_size * window_size;
    const uint64_t n = std::min(length, start + window_size - offset);
    InsertWindow(job, step, file, offset, data, n);
    offset += n;
    data += n;
    length -= n;
  }
}

void HotCache::InsertWindow(const std::string& job, uint64_t step, const std::string& file,
                            uint64_t offset, const std::byte* data, uint64_t length) {
  const uint64_t window_size = pool_->slot_size();
  const uint64_t start = offset / window_size * window_size;
  MutexLock lock(mu_);
  if (NewerStepCachedLocked(job, step)) return;
  Window* window = nullptr;
  auto existing = steps_.find({job, step});
  if (existing != steps_.end()) {
    auto f = existing->second.files.find(file);
    if (f != existing->second.files.end()) {
      auto w = f->second.find(start);
      if (w != f->second.end()) window = &w->second;
    }
  }
  if (window == nullptr) {
    // Take a slot first, so that a full pool leaves no empty entry behind.
    auto slots = pool_->TryAcquireMany(1, /*reclaim=*/false);
    if (!slots) return;  // no room right now: the load still succeeds, just uncached
    DropOlderLocked(job, step);
    window = &steps_[{job, step}].files[file].emplace(start, Window{(*slots)[0], {}}).first->second;
    ++resident_slots_;
  }
  StepEntry& e = steps_[{job, step}];
  e.last_use = ++clock_;
  auto it = e.files[file].find(start);
  // Only into the gaps: bytes already valid may be in use by a reader that has verified them
  // (Find's pointer, under the step's pin), and must never change under it.
  Window& w = it->second;
  std::byte* slot = pool_->slot_data(w.slot);
  uint64_t pos = offset - start;
  const uint64_t end = pos + length;
  for (const auto& [vb, ve] : w.valid) {  // sorted, disjoint
    if (ve <= pos) continue;
    if (vb >= end) break;
    if (vb > pos) std::memcpy(slot + pos, data + (pos - (offset - start)), vb - pos);
    pos = std::max(pos, ve);
  }
  if (pos < end) std::memcpy(slot + pos, data + (pos - (offset - start)), end - pos);
  AddValid(w, offset - start, end);
}

const std::byte* HotCache::Find(const std::string& job, uint64_t step, const std::string& file,
                                uint64_t offset, uint64_t length) {
  const uint64_t window_size = pool_->slot_size();
  const uint64_t start = offset / window_size * window_size;
  if (offset + length > start + window_size) return nullptr;
  MutexLock lock(mu_);
  auto e = steps_.find({job, step});
  if (e == steps_.end() || e->second.dropped) return nullptr;
  auto f = e->second.files.find(file);
  if (f == e->second.files.end()) return nullptr;
  auto w = f->second.find(start);
  if (w == f->second.end()) return nullptr;
  const uint64_t begin = offset - start, end = begin + length;
  for (const auto& [b, en] : w->second.valid) {
    if (b <= begin && end <= en) {
      e->second.last_use = ++clock_;
      return pool_->slot_data(w->second.slot) + begin;
    }
  }
  return nullptr;
}

void HotCache::Pin(const std::string& job, uint64_t step) {
  MutexLock lock(mu_);
  ++steps_[{job, step}].pins;
}

void HotCache::Unpin(const std::string& job, uint64_t step) {
  MutexLock lock(mu_);
  auto it = steps_.find({job, step});
  if (it == steps_.end()) return;
  --it->second.pins;
  MaybeFreeLocked(it);
}

void HotCache::Keep(const std::string& job, uint64_t step) {
  MutexLock lock(mu_);
  ++steps_[{job, step}].keeps;
}

void HotCache::Unkeep(const std::string& job, uint64_t step) {
  MutexLock lock(mu_);
  auto it = steps_.find({job, step});
  if (it == steps_.end() || it->second.keeps == 0) return;
  --it->second.keeps;
  MaybeFreeLocked(it);
}

void HotCache::Drop(const std::string& job, uint64_t step) {
  MutexLock lock(mu_);
  auto it = steps_.find({job, step});
  if (it == steps_.end()) return;
  if (it->second.pins == 0 && it->second.keeps == 0) {
    FreeLocked(it);
    return;
  }
  it->second.dropped = true;
  // Kept (a replication not yet run): its bytes go now, its entry with the last Unkeep.
  if (it->second.pins == 0) ReleaseWindowsLocked(it);
}

bool HotCache::ReclaimOne() {
  MutexLock lock(mu_);
  auto victim = steps_.end();
  for (auto it = steps_.begin(); it != steps_.end(); ++it) {
    if (it->second.pins != 0 || it->second.files.empty()) continue;
    if (victim == steps_.end() || it->second.last_use < victim->second.last_use) victim = it;
  }
  if (victim == steps_.end()) return false;
  if (victim->second.keeps == 0) {
    FreeLocked(victim);
  } else {  // its replication finds the bytes gone; the entry goes with the last Unkeep
    ReleaseWindowsLocked(victim);
    victim->second.dropped = true;
  }
  return true;
}

uint64_t HotCache::resident_bytes() const {
  MutexLock lock(mu_);
  return resident_slots_ * pool_->slot_size();
}

}  // namespace ckpt
