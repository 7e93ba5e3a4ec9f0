#include "daemon/load_service.h"

#include <boost/asio/post.hpp>

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
      pool_(config_.threads, 0, "load") {}

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
                                                                 uint64_t step) {
  {
    MutexLock lock(mu_);
    auto it = readers_.find({job, step});
    if (it != readers_.end()) return it->second;
  }
  ASSIGN_OR_RETURN(auto opened, CheckpointReader::Open(
                                    fs_, StepDir(config_.storage_root, job, step), config_.reader));
  std::shared_ptr<CheckpointReader> reader = std::move(opened);
  MutexLock lock(mu_);
  if (readers_.size() >= kReadersKept) readers_.erase(readers_.begin());
  readers_[{job, step}] = reader;
  return reader;
}

void LoadService::Load(Request request, std::function<void(Result<Outcome>)> done) {
  const std::string what =
      "load of job '" + request.job + "' into rank " + std::to_string(request.rank);
  if (pool_.Post([this, alive = alive_, request = std::move(request), done] {
        auto outcome = LoadNow(request);
        boost::asio::post(io_, [alive, done, outcome = std::move(outcome)]() mutable {
          if (*alive) done(std::move(outcome));
        });
      })) {
    return;
  }
  // The load threads have stopped: the caller is told so, on the loop, instead of never.
  boost::asio::post(io_, [alive = alive_, done = std::move(done), what] {
    if (*alive) done(DaemonStopping(what));
  });
}

Result<LoadService::Outcome> LoadService::LoadNow(const Request& request) {
  if (request.plan == nullptr) {
    return FailedPrecondition("load: register the tensors to load into first");
  }
  uint64_t step;
  if (request.step) {
    step = *request.step;
    commit_->Pin(request.job, step);
  } else {
    // Resolved and pinned at once: retention never removes the step between the two.
    ASSIGN_OR_RETURN(auto latest, commit_->PinLatest(request.job));
    if (!latest) return NotFound("job '" + request.job + "' has no committed checkpoint");
    step = *latest;
  }
  const std::string ctx = "load of job '" + request.job + "' step " + std::to_string(step) +
                          " into rank " + std::to_string(request.rank);

  hot_->Pin(request.job, step);
  struct Unpin {
    LoadService* self;
    const std::string& job;
    uint64_t step;
    ~Unpin() {
      self->hot_->Unpin(job, step);
      self->commit_->Unpin(job, step);
    }
  } unpin{this, request.job, step};

  auto reader = ReaderFor(request.job, step);
  if (!reader.ok()) {
    if (reader.status().code() == StatusCode::kNotFound) {
      return NotFound(ctx + ": the step is not committed (no MANIFEST)");
    }
    return reader.status().WithContext(ctx);
  }

  Outcome out;
  out.step = step;
  std::vector<CheckpointReader::Request> requests;
  requests.reserve(request.plan->tensors.size());
  for (const RegisteredTensor& t : request.plan->tensors) {
    if ((*reader)->FindTensor(t.name) == nullptr) {
      out.missing.push_back(t.name);
      continue;
    }
    CheckpointReader::Request r{t.name, t.geometry, std::string(t.dtype.name), {}};
    r.sink = [memory = t.memory](uint64_t offset, const std::byte* src, uint64_t size) {
      return memory->CopyIn(offset, src, size);
    };
    requests.push_back(std::move(r));
  }
  if (request.strict && !out.missing.empty()) {
    std::string names;
    for (size_t i = 0; i < out.missing.size() && i < 10; ++i) {
      names += (i ? ", '" : "'") + EscapeForLog(out.missing[i]) + "'";
    }
    if (out.missing.size() > 10) names += ", ...";
    return NotFound(ctx + ": " + std::to_string(out.missing.size()) +
                    " registered tensors are not in the checkpoint: " + names);
  }

  CheckpointReader::ReadHooks hooks;
  hooks.find_resident = [this, &request, step](const std::string& file, uint64_t offset,
                                               uint64_t length) {
    return hot_->Find(request.job, step, file, offset, length);
  };
  hooks.on_storage_piece = [this, &request, step](const std::string& file, uint64_t offset,
                                                  const std::byte* data, uint64_t length) {
    hot_->InsertRead(request.job, step, file, offset, data, length);
  };
  CheckpointReader::ReadStats stats;
  {
    auto lock = StepLock(request.job, step);
    MutexLock guard(*lock);
    RETURN_IF_ERROR((*reader)->Read(requests, &hooks, &stats), ctx);
  }
  out.bytes_from_memory = stats.bytes_from_memory;
  out.bytes_from_storage = stats.bytes_from_storage;
  // This rank's blob; a rank the step never had (the job grew) gets that of rank
  // (rank mod saved world size).
  const auto& manifest = (*reader)->manifest();
  out.saved_world_size = manifest.world_size();
  out.extra_rank = manifest.world_size() == 0 || request.rank < manifest.world_size()
                       ? request.rank
                       : request.rank % manifest.world_size();
  for (const auto& r : manifest.ranks()) {
    if (r.rank() == out.extra_rank) out.extra = r.extra();
  }
  spdlog::info("{}: {} tensors, {} bytes from memory, {} from storage{}", ctx, requests.size(),
               out.bytes_from_memory, out.bytes_from_storage,
               out.missing.empty() ? "" : ", " + std::to_string(out.missing.size()) + " missing");
  return out;
}

}  // namespace ckpt
