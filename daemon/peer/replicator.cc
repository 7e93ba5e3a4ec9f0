#include "daemon/peer/replicator.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include <spdlog/spdlog.h>

namespace ckpt::peer {

Replicator::Replicator(Config config, HotCache* hot, TokenBucket* bandwidth, PeerObserver* observer)
    : config_(config),
      hot_(hot),
      bandwidth_(bandwidth),
      observer_(observer),
      thread_(1, config.nice, "replicate") {}

Replicator::~Replicator() { Stop(); }

void Replicator::Start() { thread_.Start(); }

void Replicator::Stop() {
  stopping_ = true;
  thread_.Stop();
}

void Replicator::ForgetJob(const std::string& job, uint64_t through_step) {
  // Not posted while stopping: the record goes with the replicator.
  (void)thread_.Post([this, job, through_step] {
    for (auto it = sent_.lower_bound({job, std::string()});
         it != sent_.end() && it->first.first == job;) {
      for (auto h = it->second.begin(); h != it->second.end();) {
        std::erase_if(h->second, [through_step](uint64_t step) { return step <= through_step; });
        h = h->second.empty() ? it->second.erase(h) : std::next(h);
      }
      it = it->second.empty() ? sent_.erase(it) : std::next(it);
    }
  });
}

void Replicator::Replicate(Request request, Done done) {
  auto shared = std::make_shared<std::pair<Request, Done>>(std::move(request), std::move(done));
  auto finish = [shared](Status st, std::vector<std::string> held) {
    shared->first.keep.reset();  // the step may leave the hot cache now
    shared->second(std::move(st), std::move(held));
  };
  const bool posted = thread_.Post([this, shared, finish] {
    const Request& request = shared->first;
    std::vector<std::string> held;
    for (const Holder& holder : request.holders) {
      bool sent_any = false;
      Status st = Send(request, holder, &sent_any);
      if (!st.ok()) {
        Forget(request, holder, sent_any);  // half a copy is no copy
        finish(std::move(st), std::move(held));
        return;
      }
      Retain(request, holder);
      held.push_back(holder.node_id);
    }
    finish(Status::Ok(), std::move(held));
  });
  if (!posted) finish(Unavailable("the daemon is stopping; nothing replicated"), {});
}

void Replicator::Forget(const Request& request, const Holder& holder, bool sent_any) {
  auto& steps = sent_[{request.job, request.file}][holder.address];
  auto it = std::find(steps.begin(), steps.end(), request.step);
  const bool was_whole = it != steps.end();
  if (was_whole) steps.erase(it);
  // While stopping, no more requests: the holder's own limit per file reclaims it later.
  if ((sent_any || was_whole) && !stopping_) {
    DropOnHolder(holder.address, request.job, request.step, request.file);
  }
}

void Replicator::Retain(const Request& request, const Holder& holder) {
  auto& by_holder = sent_[{request.job, request.file}];
  auto& steps = by_holder[holder.address];  // in the order they were sent, oldest first
  std::erase(steps, request.step);
  steps.push_back(request.step);  // never dropped below: the newest copy
  const size_t keep = std::max<size_t>(config_.keep_steps, 1);
  while (steps.size() > keep) {
    DropOnHolder(holder.address, request.job, steps.front(), request.file);
    steps.pop_front();
  }
  for (auto it = by_holder.begin(); it != by_holder.end();) {
    const bool assigned = std::any_of(request.holders.begin(), request.holders.end(),
                                      [&](const Holder& h) { return h.address == it->first; });
    if (assigned) {
      ++it;
      continue;
    }
    for (uint64_t step : it->second) DropOnHolder(it->first, request.job, step, request.file);
    it = by_holder.erase(it);
  }
}

void Replicator::DropOnHolder(const std::string& address, const std::string& job, uint64_t step,
                              const std::string& file) {
  if (Status st = ClientFor(address).Drop(job, step, file); !st.ok()) {
    spdlog::warn("replication: dropping job '{}' step {} file {} on {}: {}", job, step, file,
                 address, st.ToString());
  }
}

PeerClient& Replicator::ClientFor(const std::string& address) {
  auto& client = clients_[address];
  if (client == nullptr) {
    client = std::make_unique<PeerClient>(
        PeerClient::Config{address, config_.timeout, kMaxChunkBytes}, bandwidth_, observer_);
  }
  return *client;
}

Status Replicator::Send(const Request& request, const Holder& holder, bool* sent_any) {
  PeerClient& client = ClientFor(holder.address);
  for (const auto& [offset, length] : request.ranges) {
    if (stopping_) return Unavailable("the daemon is stopping; not replicated");
    Region region{request.job, request.step, request.file, offset, length};
    if (length > kMaxChunkBytes) {
      return InvalidArgument(DescribeRegion(region) + " is over one PUT (slot size over " +
                             std::to_string(kMaxChunkBytes >> 20) + " MiB); not replicated");
    }
    // Copied out under a pin: once unpinned, the window may be reclaimed and its slot reused.
    buffer_.resize(length);
    hot_->Pin(request.job, request.step);
    const std::byte* bytes = hot_->Find(request.job, request.step, request.file, offset, length);
    if (bytes != nullptr) std::memcpy(buffer_.data(), bytes, length);
    hot_->Unpin(request.job, request.step);
    if (bytes == nullptr) {
      return FailedPrecondition(DescribeRegion(region) +
                                " is no longer in this daemon's memory (the pool needed it for a "
                                "capture); not replicated");
    }
    *sent_any = true;  // from here on the holder may hold part of it, even on failure
    if (Status st = client.Put(region, buffer_.data()); !st.ok()) {
      return Status(st.code(), "replicating to node '" + holder.node_id + "' (" + holder.address +
                                   "): " + st.message());
    }
  }
  return Status::Ok();
}

}  // namespace ckpt::peer
