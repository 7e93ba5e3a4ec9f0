#include "daemon/load_service.h"

#include <algorithm>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <future>
#include <new>
#include <random>
#include <set>
#include <thread>
#include <tuple>
#include <utility>

#include "common/buffer_cache.h"
#include "common/logging.h"
#include "common/names.h"
#include "common/step_layout.h"

namespace ckpt {

namespace {
constexpr size_t kReadersKept = 8;
}

LoadService::LoadService(boost::asio::io_context& io, Config config, FileSystem* fs,
                         CommitEngine* commit, HotCache* hot)
    : io_(io),
      config_(std::move(config)),
      fs_(fs),
      commit_(commit),
      hot_(hot),
      pool_(config_.threads, 0, "load") {
  std::random_device random;
  instance_ = std::to_string(random()) + std::to_string(random());
}

LoadService::~LoadService() {
  *alive_ = false;
  Stop();
}

void LoadService::Start() { pool_.Start(); }
void LoadService::Stop() { pool_.Stop(); }

std::shared_ptr<Mutex> LoadService::StepLock(const std::string& job, uint64_t step) {
  MutexLock lock(mu_);
  auto& weak = step_locks_[{job, step}];
  auto strong = weak.lock();
  if (!strong) {
    strong = std::make_shared<Mutex>();
    weak = strong;
  }
  std::erase_if(step_locks_, [](const auto& kv) { return kv.second.expired(); });
  return strong;
}

Result<std::shared_ptr<CheckpointReader>> LoadService::ReaderFor(const std::string& job,
                                                                 uint64_t step, bool* memory_only) {
  {
    MutexLock lock(mu_);
    auto it = readers_.find({job, step});
    if (it != readers_.end()) {
      *memory_only = it->second.memory_only;
      return it->second.reader;
    }
  }
  const std::string step_dir = StepDir(config_.storage_root, job, step);
  auto opened = CheckpointReader::Open(fs_, step_dir, config_.reader);
  OpenReader entry;
  if (opened.ok()) {
    entry.reader = std::move(opened).value();
  } else {
    if (opened.status().code() != StatusCode::kNotFound || !config_.step_manifest) {
      return opened.status();
    }
    // Not committed: perhaps a memory-only step, whose manifest only the coordinator has.
    auto manifest = MemoryManifest(job, step);
    if (!manifest.ok()) {
      if (manifest.status().code() == StatusCode::kNotFound) return opened.status();
      return manifest.status();
    }
    entry.reader = std::make_shared<CheckpointReader>(fs_, step_dir, **manifest, config_.reader);
    entry.memory_only = true;
  }
  *memory_only = entry.memory_only;
  MutexLock lock(mu_);
  if (readers_.size() >= kReadersKept) readers_.erase(readers_.begin());
  readers_[{job, step}] = entry;
  return entry.reader;
}

Result<std::shared_ptr<const ckptd::v1::Manifest>> LoadService::MemoryManifest(
    const std::string& job, uint64_t step) {
  // On a load thread; the answer comes on the loop.
  constexpr auto kManifestWait = std::chrono::seconds(60);
  using Answer = Result<std::shared_ptr<const ckptd::v1::Manifest>>;
  auto promise = std::make_shared<std::promise<Answer>>();
  auto answer = promise->get_future();
  boost::asio::post(io_, [this, alive = alive_, job, step, promise] {
    if (!*alive) {
      promise->set_value(DaemonStopping("the manifest of job '" + job + "'"));
      return;
    }
    config_.step_manifest(job, step, [promise](Answer a) { promise->set_value(std::move(a)); });
  });
  if (answer.wait_for(kManifestWait) != std::future_status::ready) {
    return Unavailable("job '" + job + "' step " + std::to_string(step) +
                       ": the coordinator did not answer for its manifest within 60 s");
  }
  return answer.get();
}

struct LoadService::Prepared {
  LoadService* self = nullptr;
  // A load waiting for its plan sits in a timer's handler on the loop, which may outlive the
  // service (and the caches) at shutdown: then there is nothing left to unpin.
  std::shared_ptr<bool> alive;
  Request request;
  uint64_t step = 0;
  std::string ctx;
  std::shared_ptr<CheckpointReader> reader;
  std::vector<CheckpointReader::Request> requests;
  Outcome out;
  std::chrono::steady_clock::time_point first_ask{};
  bool heard_not_ready = false;  // the coordinator counted this rank and waits for others
  bool memory_only = false;      // a memory-only step: its bytes are in memory or nowhere
  bool pinned = false;
  std::shared_ptr<Staging> staging;  // while this load plans across nodes
  bool heard = false;                // its plan's answer came (Staging::pending counted down)
  ~Prepared() {
    if (!pinned || !*alive) return;
    if (staging != nullptr) self->LeaveStaging(staging, heard);
    self->hot_->Unpin(request.job, step);
    self->commit_->Unpin(request.job, step);
  }
};

void LoadService::Load(Request request, std::function<void(Result<Outcome>)> done) {
  const std::string what =
      "load of job '" + request.job + "' into rank " + std::to_string(request.rank);
  auto post_done = [this, alive = alive_, done](Result<Outcome> outcome) {
    boost::asio::post(io_, [alive, done, outcome = std::move(outcome)]() mutable {
      if (*alive) done(std::move(outcome));
    });
  };
  if (pool_.Post([this, alive = alive_, request = std::move(request), done, post_done] {
        auto prepared = Prepare(request);
        if (!prepared.ok()) return post_done(prepared.status());
        std::shared_ptr<Prepared> p = std::move(prepared).value();
        // Planned only where this node serves a data plane: a node without one could only
        // fetch, and where no node has one the plan's wait would buy nothing.
        const std::string address = config_.peer_address ? config_.peer_address() : "";
        if (!config_.plan_load || !config_.connect_peer || request.world_size == 0 ||
            address.empty()) {
          return Complete(std::move(p), nullptr, done);
        }
        // What this load would read from storage: the question for the plan.
        CheckpointReader::ReadHooks hooks;
        hooks.find_resident = [&](const std::string& file, uint64_t offset, uint64_t length) {
          return hot_->Find(request.job, p->step, file, offset, length);
        };
        auto needs = p->reader->StorageRanges(p->requests, &hooks);
        if (!needs.ok()) return Complete(std::move(p), nullptr, done);
        ckptd::v1::LoadPlanRequest ask;
        ask.set_node_id(config_.node_id);
        ask.set_job(request.job);
        ask.set_step(p->step);
        ask.set_rank(request.rank);
        ask.set_world_size(request.world_size);
        ask.set_peer_address(address);
        ask.set_session(config_.node_id + "/" + instance_ + "/" +
                        std::to_string(request.session_id));
        for (const auto& r : *needs) {
          auto* range = ask.add_needs();
          range->set_file(r.file);
          range->set_offset(r.offset);
          range->set_length(r.length);
        }
        if (needs->empty()) {
          // All in memory here: the round still counts this rank (so that ranks reading
          // storage do not wait for it), but this load does not wait for the answer.
          boost::asio::post(io_, [this, alive, ask = std::move(ask)]() mutable {
            if (*alive)
              config_.plan_load(std::move(ask), [](Result<ckptd::v1::LoadPlanResponse>) {});
          });
          return Complete(std::move(p), nullptr, done);
        }
        uint64_t bytes = 0;
        for (const auto& r : *needs) bytes += r.length;
        spdlog::info("{}: asking the coordinator who reads what ({} ranges, {} bytes)", p->ctx,
                     needs->size(), bytes);
        p->first_ask = std::chrono::steady_clock::now();
        p->staging = JoinStaging(request.job, p->step);
        boost::asio::post(io_, [this, alive, p, ask = std::move(ask), done]() mutable {
          if (*alive) AskPlan(std::move(p), std::move(ask), std::move(done));
        });
      })) {
    return;
  }
  // The load threads have stopped: the caller is told so, on the loop, instead of never.
  boost::asio::post(io_, [alive = alive_, done = std::move(done), what] {
    if (*alive) done(DaemonStopping(what));
  });
}

void LoadService::AskPlan(std::shared_ptr<Prepared> p, ckptd::v1::LoadPlanRequest ask,
                          std::function<void(Result<Outcome>)> done) {
  auto copy = ask;
  config_.plan_load(std::move(copy), [this, alive = alive_, p, ask = std::move(ask),
                                      done](Result<ckptd::v1::LoadPlanResponse> plan) mutable {
    if (!*alive) return;
    // The coordinator bounds how long a round waits for the job's ranks; this bound only
    // guards against one that keeps answering "not yet".
    constexpr auto kGiveUp = std::chrono::minutes(2);
    if (plan.ok() && !plan->ready() && std::chrono::steady_clock::now() - p->first_ask < kGiveUp) {
      if (!std::exchange(p->heard_not_ready, true)) {
        spdlog::info(
            "{}: the coordinator waits for the job's other ranks; asking again every {} ms", p->ctx,
            plan->retry_ms());
      }
      auto timer = std::make_shared<boost::asio::steady_timer>(
          io_, std::chrono::milliseconds(std::max<uint32_t>(plan->retry_ms(), 10)));
      timer->async_wait([this, alive, timer, p, ask = std::move(ask),
                         done](const boost::system::error_code& ec) mutable {
        if (!ec && *alive) AskPlan(std::move(p), std::move(ask), std::move(done));
      });
      return;
    }
    std::shared_ptr<const ckptd::v1::LoadPlanResponse> ready;
    if (plan.ok() && plan->ready()) {
      ready = std::make_shared<const ckptd::v1::LoadPlanResponse>(std::move(plan).value());
    } else {
      spdlog::warn("{}: no load plan across nodes ({}): reading from storage", p->ctx,
                   plan.ok() ? "the coordinator kept waiting" : plan.status().ToString());
    }
    if (ready != nullptr) {
      // Only data files of this step: a plan that names anything else is not followed.
      std::set<std::string, std::less<>> files;
      for (const auto& t : p->reader->manifest().tensors()) {
        for (const auto& shard : t.shards()) files.insert(shard.file());
      }
      const auto unknown = [&](const std::string& f) { return !files.contains(f); };
      const bool bad = std::any_of(ready->serve().begin(), ready->serve().end(),
                                   [&](const auto& r) { return unknown(r.file()); }) ||
                       std::any_of(ready->fetch().begin(), ready->fetch().end(),
                                   [&](const auto& f) { return unknown(f.range().file()); });
      if (bad) {
        spdlog::warn("{}: the load plan names files the step does not have: reading from storage",
                     p->ctx);
        ready = nullptr;
      }
    }
    Heard(*p->staging, ready.get());
    p->heard = true;
    const std::string what = p->ctx;
    // Moved, not copied: the last reference is Complete's, which unpins before replying.
    if (!pool_.Post([this, p = std::move(p), ready, done]() mutable {
          Complete(std::move(p), ready, done);
        })) {
      done(DaemonStopping(what));
    }
  });
}

void LoadService::Complete(std::shared_ptr<Prepared> p,
                           std::shared_ptr<const ckptd::v1::LoadPlanResponse> plan,
                           std::function<void(Result<Outcome>)> done) {
  auto outcome = Finish(*p, plan.get());
  p.reset();  // unpinned before the trainer hears of it
  boost::asio::post(io_, [alive = alive_, done, outcome = std::move(outcome)]() mutable {
    if (*alive) done(std::move(outcome));
  });
}

Result<LoadService::Outcome> LoadService::LoadNow(const Request& request) {
  ASSIGN_OR_RETURN(auto p, Prepare(request));
  return Finish(*p, nullptr);
}

Result<std::shared_ptr<LoadService::Prepared>> LoadService::Prepare(const Request& request) {
  if (request.plan == nullptr) {
    return FailedPrecondition("load: register the tensors to load into first");
  }
  auto p = std::make_shared<Prepared>();
  p->self = this;
  p->alive = alive_;
  p->request = request;
  if (request.step) {
    p->step = *request.step;
    commit_->Pin(request.job, p->step);
  } else {
    // Resolved and pinned at once: retention never removes the step between the two.
    ASSIGN_OR_RETURN(auto latest, commit_->PinLatest(request.job));
    if (!latest) return NotFound("job '" + request.job + "' has no committed checkpoint");
    p->step = *latest;
  }
  hot_->Pin(request.job, p->step);
  p->pinned = true;
  p->ctx = "load of job '" + request.job + "' step " + std::to_string(p->step) + " into rank " +
           std::to_string(request.rank);

  auto reader = ReaderFor(request.job, p->step, &p->memory_only);
  if (!reader.ok()) {
    if (reader.status().code() == StatusCode::kNotFound) {
      return NotFound(p->ctx +
                      ": the step is not committed (no MANIFEST), nor a replicated memory-only "
                      "step the coordinator knows of");
    }
    return reader.status().WithContext(p->ctx);
  }
  p->reader = std::move(reader).value();

  Outcome& out = p->out;
  out.step = p->step;
  p->requests.reserve(request.plan->tensors.size());
  for (const RegisteredTensor& t : request.plan->tensors) {
    if (p->reader->FindTensor(t.name) == nullptr) {
      out.missing.push_back(t.name);
      continue;
    }
    CheckpointReader::Request r{t.name, t.geometry, std::string(t.dtype.name), {}};
    r.sink = [memory = t.memory](uint64_t offset, const std::byte* src, uint64_t size) {
      return memory->CopyIn(offset, src, size);
    };
    p->requests.push_back(std::move(r));
  }
  if (request.strict && !out.missing.empty()) {
    std::string names;
    for (size_t i = 0; i < out.missing.size() && i < 10; ++i) {
      names += (i ? ", '" : "'") + EscapeForLog(out.missing[i]) + "'";
    }
    if (out.missing.size() > 10) names += ", ...";
    return NotFound(p->ctx + ": " + std::to_string(out.missing.size()) +
                    " registered tensors are not in the checkpoint: " + names);
  }
  return p;
}

std::shared_ptr<LoadService::Staging> LoadService::JoinStaging(const std::string& job,
                                                               uint64_t step) {
  MutexLock lock(mu_);
  auto& slot = staging_[{job, step}];
  if (slot == nullptr) slot = std::make_shared<Staging>();
  // Entries outlive their loads (a peer may still fetch a round's ranges after the loads here
  // moved on: it must find them served, not wait for the next round); the idle ones of the
  // oldest steps go once there are more than kStagingKept.
  constexpr size_t kStagingKept = 16;
  for (auto it = staging_.begin(); staging_.size() > kStagingKept && it != staging_.end();) {
    bool idle;
    {
      MutexLock inner(it->second->mu);
      idle = it->second->loads == 0;
    }
    it = idle ? staging_.erase(it) : std::next(it);
  }
  MutexLock inner(slot->mu);
  ++slot->loads;
  ++slot->pending;
  return slot;
}

void LoadService::Heard(Staging& s, const ckptd::v1::LoadPlanResponse* plan) {
  {
    MutexLock lock(s.mu);
    --s.pending;
    if (plan != nullptr && !plan->serve().empty()) {
      auto [it, fresh] = s.rounds.try_emplace(plan->round());
      if (fresh) {
        for (const auto& r : plan->serve()) {
          it->second.ranges.push_back({r.file(), r.offset(), r.length()});
        }
      }
    }
  }
  s.cv.NotifyAll();
}

void LoadService::LeaveStaging(const std::shared_ptr<Staging>& staging, bool heard) {
  {
    MutexLock lock(staging->mu);
    if (!heard) --staging->pending;
    --staging->loads;
  }
  staging->cv.NotifyAll();
}

void LoadService::WaitStaged(const std::string& job, uint64_t step, const std::string& file,
                             uint64_t offset, uint64_t length) {
  std::shared_ptr<Staging> staging;
  {
    MutexLock lock(mu_);
    auto it = staging_.find({job, step});
    if (it == staging_.end()) return;
    staging = it->second;
  }
  Staging& s = *staging;
  const uint64_t end = offset + length;
  MutexLock lock(s.mu);
  const auto until = std::chrono::steady_clock::now() + config_.staging_wait;
  while (true) {
    // A served range of a round heard here that holds the region: wait until it is read.
    const Staging::Round* in = nullptr;
    size_t index = 0;
    for (const auto& [id, round] : s.rounds) {
      for (size_t i = 0; i < round.ranges.size() && in == nullptr; ++i) {
        const auto& r = round.ranges[i];
        if (r.file == file && r.offset <= offset && end <= r.offset + r.length) {
          in = &round;
          index = i;
        }
      }
    }
    if (in != nullptr) {
      if (in->next > index || (in->next == index && in->at >= end) || s.loads == 0) return;
    } else if (s.pending == 0) {
      return;  // not served here, and no load here is about to hear a plan that might
    }
    if (!s.cv.WaitUntil(s.mu, until)) return;
  }
}

Status LoadService::Stage(Prepared& p, const ckptd::v1::LoadPlanResponse& plan,
                          uint64_t* bytes_read) {
  Staging& s = *p.staging;
  Staging::Round* round = nullptr;
  std::vector<CheckpointReader::FileRange> ranges;
  {
    MutexLock lock(s.mu);
    auto it = s.rounds.find(plan.round());
    if (it == s.rounds.end()) return Status::Ok();  // this node serves nothing in the round
    round = &it->second;  // map nodes are stable; the entry lives as long as the staging
    if (round->claimed) {
      // Another load here heard this round first and reads what the node serves: wait for it
      // (its bytes land in the hot cache this load reads from).
      const auto until = std::chrono::steady_clock::now() + config_.staging_wait;
      while (round->next < round->ranges.size()) {
        if (!s.cv.WaitUntil(s.mu, until)) break;
      }
      return Status::Ok();
    }
    round->claimed = true;
    ranges = round->ranges;
  }
  auto progress = [&](size_t next, uint64_t at) {
    {
      MutexLock lock(s.mu);
      round->next = next;
      round->at = at;
    }
    s.cv.NotifyAll();
  };
  Status status = Status::Ok();
  BorrowedBuffer buffer;
  const uint64_t window = hot_->window_size();
  const std::string& job = p.request.job;
  for (size_t i = 0; i < ranges.size() && status.ok(); ++i) {
    const auto& range = ranges[i];
    auto file = fs_->Open(JoinPath(p.reader->step_dir(), range.file), OpenOptions{});
    if (!file.ok()) {
      status = file.status().WithContext(p.ctx + ": the ranges it serves");
      break;
    }
    for (uint64_t pos = range.offset, end = range.offset + range.length; pos < end;) {
      const uint64_t n = std::min(end - pos, window - pos % window);
      if (hot_->Find(job, p.step, range.file, pos, n) == nullptr) {
        try {
          buffer.Reserve(n);
        } catch (const std::bad_alloc&) {
          status = ResourceExhausted(p.ctx + ": no memory for a read buffer of " +
                                     std::to_string(n) + " bytes");
          break;
        }
        status = (*file)->PReadAll(buffer.data(), n, pos);
        if (!status.ok()) break;
        *bytes_read += n;
        hot_->InsertRead(job, p.step, range.file, pos, buffer.data(), n);
      }
      pos += n;
      progress(pos < end ? i : i + 1, pos < end ? pos : 0);
    }
  }
  progress(ranges.size(), 0);  // also after an error: waiting fetches read storage instead
  return status;
}

std::vector<CheckpointReader::FileRange> LoadService::FetchFromPeers(
    Prepared& p, const ckptd::v1::LoadPlanResponse& plan) {
  // What is left to fetch of one planned range, and which of its sources comes next: 0 the
  // plan's peer, k its (k-1)-th alternate.
  struct Work {
    const ckptd::v1::LoadPlanResponse::Fetch* fetch;
    uint64_t from;
    int source = 0;
  };
  const auto address_of = [](const Work& w) -> const std::string& {
    return w.source == 0 ? w.fetch->peer_address()
                         : w.fetch->alternates(w.source - 1).peer_address();
  };
  const std::string self = config_.peer_address ? config_.peer_address() : "";
  Mutex mu;
  std::vector<CheckpointReader::FileRange> arrived;
  std::set<std::string> failed;  // peers that failed this load: not asked again
  std::vector<Work> left;        // what a failed peer did not deliver
  // Fetches `work` from `address`, in order, until it is done or the peer fails. A peer that
  // answers it lacks a range (no such step or file there, or the region runs past it) leaves
  // that range to its next source and goes on with the others.
  auto fetch_all = [&](const std::string& address, std::vector<Work> work) {
    std::unique_ptr<PeerFetch> client;  // connected at the first range not held here
    // One hot-cache window per FETCH, into one buffer borrowed for the whole range list: no
    // buffer longer than a window, and none faulted in afresh per load.
    const uint64_t window = hot_->window_size();
    BorrowedBuffer buffer;
    // Dead, stalled or wrong: not asked again by this load. What it did not deliver (from
    // range `i`, byte `pos` on) goes to each range's next source; a range with none left is
    // read from storage.
    auto give_up = [&](const Status& why, size_t i, uint64_t pos) {
      spdlog::warn(
          "{}: fetch from peer {} failed, leaving its ranges to their other holders or storage: {}",
          p.ctx, address, why.ToString());
      MutexLock lock(mu);
      failed.insert(address);
      work[i].from = pos;
      left.insert(left.end(), work.begin() + static_cast<ptrdiff_t>(i), work.end());
    };
    for (size_t i = 0; i < work.size(); ++i) {
      const auto& r = work[i].fetch->range();
      // A copy in memory that has other sources is checked before it enters the hot cache: a
      // bad one is left for the next source. (Bytes a node read from storage for the others
      // have only storage behind them, which Read falls back to when they fail there.)
      const bool check = work[i].fetch->alternates_size() > 0;
      for (uint64_t pos = work[i].from, end = r.offset() + r.length(); pos < end;) {
        const uint64_t n = std::min(end - pos, window - pos % window);
        buffer.Reserve(n);  // std::bad_alloc: see the thread below
        if (config_.read_held_copy &&
            config_.read_held_copy(p.request.job, p.step, r.file(), pos, n, buffer.data())) {
          // This node holds a copy of that file for its own node (its peer pool): no network.
          // Resident from here on, it counts as bytes from memory, not from peers.
          const Status held =
              check ? p.reader->VerifyRange(r.file(), pos, buffer.data(), n) : Status::Ok();
          if (held.ok()) {
            hot_->InsertRead(p.request.job, p.step, r.file(), pos, buffer.data(), n);
            pos += n;
            continue;
          }
          spdlog::warn("{}: this node's own copy is bad, fetching it instead: {}", p.ctx,
                       held.ToString());
          if (address == self) {
            // The plan names this node: its data plane would serve the same bad copy.
            give_up(held, i, pos);
            return;
          }
        }
        if (client == nullptr) client = config_.connect_peer(address);
        Status s = client->Fetch(p.request.job, p.step, r.file(), pos, n, buffer.data());
        if (s.ok() && check) s = p.reader->VerifyRange(r.file(), pos, buffer.data(), n);
        if (s.code() == StatusCode::kNotFound || s.code() == StatusCode::kOutOfRange) {
          spdlog::warn(
              "{}: peer {} lacks part of {}, leaving it to its other holders or storage: {}", p.ctx,
              address, r.file(), s.ToString());
          MutexLock lock(mu);
          left.push_back(Work{work[i].fetch, pos, work[i].source});
          break;  // the next range
        }
        if (!s.ok()) {
          give_up(s, i, pos);
          return;
        }
        hot_->InsertRead(p.request.job, p.step, r.file(), pos, buffer.data(), n);
        MutexLock lock(mu);
        arrived.push_back({r.file(), pos, n});
        pos += n;
      }
    }
  };
  // Rounds: the plan's peers, then, for what a peer left, each range's next alternate that has
  // not failed — one thread per peer in each round. Every round moves each range left to a later
  // source, so there are at most 1 + (the most alternates of a range) rounds; a round ends with
  // its slowest peer, so stalled holders cost up to one --peer-timeout per round.
  std::map<std::string, std::vector<Work>> by_peer;
  for (const auto& f : plan.fetch())
    by_peer[f.peer_address()].push_back(Work{&f, f.range().offset()});
  while (!by_peer.empty()) {
    {
      std::vector<std::jthread> threads;
      for (auto& [address, work] : by_peer) {
        threads.emplace_back([&, &address = address, &work = work] {
          try {
            fetch_all(address, std::move(work));
          } catch (const std::bad_alloc&) {
            // Out of memory mid-fetch (a buffer, the cache's bookkeeping): what did not arrive
            // is left unfetched (storage, where the step has it).
            spdlog::warn("{}: fetch from peer {} ran out of memory, leaving the rest unfetched",
                         p.ctx, address);
          }
        });
      }
    }
    by_peer.clear();
    for (Work& w : left) {
      do {
        ++w.source;
      } while (w.source <= w.fetch->alternates_size() && failed.contains(address_of(w)));
      if (w.source <= w.fetch->alternates_size()) by_peer[address_of(w)].push_back(w);
    }
    left.clear();
  }
  std::sort(arrived.begin(), arrived.end(), [](const auto& a, const auto& b) {
    return std::tie(a.file, a.offset) < std::tie(b.file, b.offset);
  });
  return arrived;
}

Result<LoadService::Outcome> LoadService::Finish(Prepared& p,
                                                 const ckptd::v1::LoadPlanResponse* plan) {
  const Request& request = p.request;
  const uint64_t step = p.step;
  Outcome& out = p.out;
  uint64_t staged = 0;
  std::vector<CheckpointReader::FileRange> fetched;
  if (plan != nullptr && p.staging != nullptr) {
    if (Status s = Stage(p, *plan, &staged); !s.ok()) {
      spdlog::warn("{}: {}", p.ctx, s.ToString());  // the peers read those from storage
    }
    fetched = FetchFromPeers(p, *plan);
  }
  // Resident bytes that arrived from peers for this load, counted as they are found.
  uint64_t from_peers = 0;
  auto fetched_here = [&](const std::string& file, uint64_t offset, uint64_t length) {
    auto it = std::upper_bound(fetched.begin(), fetched.end(), std::tie(file, offset),
                               [](const auto& key, const CheckpointReader::FileRange& r) {
                                 return key < std::tie(r.file, r.offset);
                               });
    if (it == fetched.begin()) return false;
    --it;
    return it->file == file && offset + length <= it->offset + it->length;
  };

  CheckpointReader::ReadHooks hooks;
  hooks.find_resident = [&](const std::string& file, uint64_t offset, uint64_t length) {
    const std::byte* bytes = hot_->Find(request.job, step, file, offset, length);
    if (bytes != nullptr && !fetched.empty() && fetched_here(file, offset, length)) {
      from_peers += length;
    }
    return bytes;
  };
  hooks.on_storage_piece = [this, &request, step](const std::string& file, uint64_t offset,
                                                  const std::byte* data, uint64_t length) {
    hot_->InsertRead(request.job, step, file, offset, data, length);
  };
  CheckpointReader::ReadStats stats;
  {
    auto lock = StepLock(request.job, step);
    MutexLock guard(*lock);
    Status read = p.reader->Read(p.requests, &hooks, &stats);
    if (!read.ok() && p.memory_only) {
      return read.WithContext(p.ctx +
                              ": the step is memory-only (saved with persist=False) and "
                              "some of its bytes are on no live daemon reached");
    }
    RETURN_IF_ERROR(read, p.ctx);
  }
  // What this load found resident came from peers, from its own staging (counted as storage),
  // or was in memory before: each byte restored counts once among memory, peers and storage.
  out.bytes_from_peers = std::min(from_peers, stats.bytes_from_memory);
  out.bytes_from_memory = stats.bytes_from_memory - out.bytes_from_peers -
                          std::min(staged, stats.bytes_from_memory - out.bytes_from_peers);
  out.bytes_from_storage = stats.bytes_from_storage + staged;
  // This rank's blob; a rank the step never had (the job grew) gets that of rank
  // (rank mod saved world size).
  const auto& manifest = p.reader->manifest();
  out.saved_world_size = manifest.world_size();
  out.extra_rank = manifest.world_size() == 0 || request.rank < manifest.world_size()
                       ? request.rank
                       : request.rank % manifest.world_size();
  for (const auto& r : manifest.ranks()) {
    if (r.rank() == out.extra_rank) out.extra = r.extra();
  }
  spdlog::info("{}: {} tensors, {} bytes from memory, {} from peers, {} from storage{}", p.ctx,
               p.requests.size(), out.bytes_from_memory, out.bytes_from_peers,
               out.bytes_from_storage,
               out.missing.empty() ? "" : ", " + std::to_string(out.missing.size()) + " missing");
  return std::move(out);
}

}  // namespace ckpt
