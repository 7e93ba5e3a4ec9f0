#include "daemon/peer/peer_store.h"

#include <cstring>
#include <tuple>
#include <vector>

#include <spdlog/spdlog.h>

#include "common/units.h"

namespace ckpt::peer {

PeerStore::Reservation::Reservation(PeerStore* store, Region region)
    : store_(store),
      region_(std::move(region)),
      data_(new std::byte[std::max<uint64_t>(region_.length, 1)]) {}

PeerStore::Reservation::~Reservation() {
  if (!committed_) store_->Unreserve(region_.length);
}

void PeerStore::Unreserve(uint64_t bytes) {
  MutexLock lock(mu_);
  reserved_ -= bytes;
}

Result<std::unique_ptr<PeerStore::Reservation>> PeerStore::Reserve(const Region& region) {
  {
    MutexLock lock(mu_);
    if (held_ + reserved_ + region.length > budget_) {
      return ResourceExhausted("peer pool full: cannot hold " + DescribeRegion(region) + " (" +
                               FormatBytes(region.length) + "): " + FormatBytes(held_ + reserved_) +
                               " of " + FormatBytes(budget_) +
                               " in use (--peer-pool); nothing was evicted");
    }
    reserved_ += region.length;
  }
  // Allocated outside the lock; the budget already counts it.
  return std::unique_ptr<Reservation>(new Reservation(this, region));
}

void PeerStore::Commit(Reservation& r) {
  if (r.committed_) return;
  Held held{Buffer(std::move(r.data_)), r.region_.length};
  MutexLock lock(mu_);
  r.committed_ = true;
  reserved_ -= held.length;
  held_ += held.length;
  auto& regions = steps_[{r.region_.job, r.region_.step}][r.region_.file];
  auto [it, inserted] = regions.try_emplace(r.region_.offset, held);
  if (!inserted) {
    held_ -= it->second.length;
    it->second = std::move(held);
  } else {
    ++regions_;
  }
  DropSupersededLocked(r.region_.job, r.region_.step, r.region_.file);
}

void PeerStore::DropSupersededLocked(const std::string& job, uint64_t step,
                                     const std::string& file) {
  if (max_steps_per_file_ == 0) return;
  std::vector<uint64_t> with_file;  // ascending
  for (auto it = steps_.lower_bound({job, 0}); it != steps_.end() && it->first.first == job; ++it) {
    if (it->second.count(file) != 0) with_file.push_back(it->first.second);
  }
  for (size_t i = 0; with_file.size() - i > max_steps_per_file_; ++i) {
    if (with_file[i] == step) continue;  // the copy arriving now is never the one to go
    const uint64_t freed = DropFileLocked(job, with_file[i], file);
    spdlog::info(
        "peer pool: job '{}' step {} file {}: dropped ({} bytes), {} newer steps of it "
        "are held (its sender no longer manages it: it restarted or moved)",
        job, with_file[i], file, freed, max_steps_per_file_);
  }
}

bool PeerStore::Cover(const Region& region,
                      std::vector<std::tuple<Buffer, uint64_t, uint64_t>>* pieces) const {
  MutexLock lock(mu_);
  auto step = steps_.find({region.job, region.step});
  if (step == steps_.end()) return false;
  auto file = step->second.find(region.file);
  if (file == step->second.end()) return false;
  const auto& regions = file->second;
  uint64_t pos = region.offset;
  const uint64_t end = region.offset + region.length;
  while (pos < end) {
    auto it = regions.upper_bound(pos);
    if (it == regions.begin()) return false;
    --it;
    const uint64_t region_end = it->first + it->second.length;
    if (region_end <= pos) return false;
    const uint64_t n = std::min(end, region_end) - pos;
    if (pieces != nullptr) pieces->emplace_back(it->second.data, pos - it->first, n);
    pos += n;
  }
  return true;
}

bool PeerStore::Read(const Region& region, std::byte* out) const {
  std::vector<std::tuple<Buffer, uint64_t, uint64_t>> pieces;
  if (!Cover(region, &pieces)) return false;
  // The copies run without the lock: each piece's buffer is kept alive by its shared_ptr.
  for (const auto& [buffer, from, n] : pieces) {
    std::memcpy(out, buffer.get() + from, n);
    out += n;
  }
  return true;
}

bool PeerStore::Holds(const Region& region) const { return Cover(region, nullptr); }

uint64_t PeerStore::DropStep(const std::string& job, uint64_t step) {
  MutexLock lock(mu_);
  auto it = steps_.find({job, step});
  if (it == steps_.end()) return 0;
  return DropStepLocked(it);
}

uint64_t PeerStore::DropJob(const std::string& job, uint64_t through_step) {
  MutexLock lock(mu_);
  uint64_t freed = 0;
  for (auto it = steps_.lower_bound({job, 0});
       it != steps_.end() && it->first.first == job && it->first.second <= through_step;) {
    freed += DropStepLocked(it++);
  }
  return freed;
}

std::vector<std::pair<std::string, uint64_t>> PeerStore::Jobs() const {
  MutexLock lock(mu_);
  std::vector<std::pair<std::string, uint64_t>> jobs;
  for (const auto& [key, files] : steps_) {  // (job, step) order: a job's newest step is last
    if (jobs.empty() || jobs.back().first != key.first) jobs.emplace_back(key.first, 0);
    jobs.back().second = key.second;
  }
  return jobs;
}

uint64_t PeerStore::DropStepLocked(std::map<Key, Files>::iterator it) {
  uint64_t freed = 0;
  for (const auto& [file, regions] : it->second) {
    for (const auto& [offset, held] : regions) {
      freed += held.length;
      --regions_;
    }
  }
  held_ -= freed;
  steps_.erase(it);
  return freed;
}

uint64_t PeerStore::DropFile(const std::string& job, uint64_t step, const std::string& file) {
  MutexLock lock(mu_);
  return DropFileLocked(job, step, file);
}

uint64_t PeerStore::DropFileLocked(const std::string& job, uint64_t step, const std::string& file) {
  auto it = steps_.find({job, step});
  if (it == steps_.end()) return 0;
  auto f = it->second.find(file);
  if (f == it->second.end()) return 0;
  uint64_t freed = 0;
  for (const auto& [offset, held] : f->second) {
    freed += held.length;
    --regions_;
  }
  held_ -= freed;
  it->second.erase(f);
  if (it->second.empty()) steps_.erase(it);
  return freed;
}

uint64_t PeerStore::used() const {
  MutexLock lock(mu_);
  return held_ + reserved_;
}

uint64_t PeerStore::held_bytes() const {
  MutexLock lock(mu_);
  return held_;
}

size_t PeerStore::region_count() const {
  MutexLock lock(mu_);
  return regions_;
}

}  // namespace ckpt::peer
