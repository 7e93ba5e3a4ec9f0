#include "daemon/rpc/coordinator_link.h"

#include <unistd.h>

#include <boost/asio/post.hpp>
#include <random>

#include "common/layout_fingerprint.h"
#include "common/logging.h"

namespace ckpt {

CoordinatorLink::CoordinatorLink(boost::asio::io_context& io, Config config)
    : io_(io), config_(std::move(config)) {
  std::random_device rd;
  std::mt19937_64 gen((static_cast<uint64_t>(rd()) << 32) ^ rd() ^
                      static_cast<uint64_t>(::getpid()));
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(gen()));
  instance_ = buf;
}

CoordinatorLink::~CoordinatorLink() {
  Stop();
  *alive_ = false;
}

Status CoordinatorLink::Start(Handler* handler) {
  handler_ = handler;
  ASSIGN_OR_RETURN(auto creds,
                   MakeChannelCredentials(config_.address, config_.tls, config_.allow_plaintext));
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 2000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 2000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, static_cast<int>(config_.backoff_min.count()));
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, static_cast<int>(config_.backoff_max.count()));
  args.SetMaxReceiveMessageSize(1 << 30);
  args.SetMaxSendMessageSize(1 << 30);
  if (!config_.tls.server_name.empty()) args.SetSslTargetNameOverride(config_.tls.server_name);
  channel_ = grpc::CreateCustomChannel(config_.address, creds, args);
  stub_ = ckptd::v1::Coordinator::NewStub(channel_);
  watch_thread_ = std::thread([this] { WatchLoop(); });
  send_thread_ = std::thread([this] { SendLoop(); });
  spdlog::info("coordinator link: node '{}' (instance {}) → {}{}", config_.node_id, instance_,
               config_.address, config_.tls.enabled() ? " (TLS)" : " (plaintext)");
  return Status::Ok();
}

void CoordinatorLink::Stop() {
  {
    MutexLock lock(mu_);
    if (stopping_) return;
    stopping_ = true;
    if (watch_ctx_ != nullptr) watch_ctx_->TryCancel();
  }
  cv_.NotifyAll();
  if (watch_thread_.joinable()) watch_thread_.join();
  if (send_thread_.joinable()) send_thread_.join();
}

void CoordinatorLink::Deadline(grpc::ClientContext& ctx) const {
  ctx.set_deadline(std::chrono::system_clock::now() + config_.rpc_deadline);
}

void CoordinatorLink::PostToLoop(std::function<void()> f) {
  boost::asio::post(io_, [alive = alive_, f = std::move(f)] {
    if (*alive) f();
  });
}

void CoordinatorLink::WatchLoop() {
  auto backoff = config_.backoff_min;
  bool warned = false;
  while (true) {
    {
      MutexLock lock(mu_);
      if (stopping_) return;
    }
    ckptd::v1::RegisterNodeRequest req;
    req.set_node_id(config_.node_id);
    req.set_admin_address(config_.admin_address);
    req.set_version(config_.version);
    req.set_peer_address(peer_address_);
    req.set_failure_domain(config_.failure_domain);
    req.set_peer_pool_bytes(config_.peer_pool_bytes);
    req.set_replicas(config_.replicas);
    if (held_jobs_) {
      for (auto& [job, newest] : held_jobs_()) {
        auto* held = req.add_held_jobs();
        held->set_job(std::move(job));
        held->set_newest_step(newest);
      }
    }
    req.set_instance(instance_);
    ckptd::v1::RegisterNodeResponse resp;
    grpc::Status st;
    {
      grpc::ClientContext ctx;
      // Short: Stop() waits for this call, and an unreachable coordinator is retried anyway.
      ctx.set_deadline(
          std::chrono::system_clock::now() +
          std::min<std::chrono::milliseconds>(config_.rpc_deadline, std::chrono::seconds(3)));
      st = stub_->RegisterNode(&ctx, req, &resp);
    }
    if (st.ok()) {
      spdlog::info("coordinator {}: registered node '{}' (coordinator incarnation {}, lease {} ms)",
                   config_.address, config_.node_id, resp.incarnation(), resp.lease_ms());
      warned = false;
      backoff = config_.backoff_min;
      grpc::ClientContext ctx;
      {
        MutexLock lock(mu_);
        if (stopping_) return;
        watch_ctx_ = &ctx;
        epoch_ = resp.epoch();
      }
      ckptd::v1::WatchRequest w;
      w.set_node_id(config_.node_id);
      auto reader = stub_->Watch(&ctx, w);
      // Re-report after the stream is open, so decisions about re-reported steps reach us.
      PostToLoop([this, r = Registration{resp.epoch(), resp.fenced()}] {
        handler_->OnCoordinatorConnected(r);
      });
      ckptd::v1::CoordinatorEvent event;
      while (reader->Read(&event)) {
        if (event.has_layout()) {
          ResendLayout(event.layout());  // the link's own business: the node state never sees it
          continue;
        }
        PostToLoop([this, e = event] { handler_->OnCoordinatorEvent(e); });
      }
      st = reader->Finish();
      {
        MutexLock lock(mu_);
        watch_ctx_ = nullptr;
        if (stopping_) return;
      }
      spdlog::warn("coordinator {}: event stream ended ({}); reconnecting", config_.address,
                   st.error_message().empty() ? "closed" : st.error_message());
    } else if (!warned) {
      spdlog::warn("coordinator {}: cannot register: {}; retrying with backoff", config_.address,
                   st.error_message());
      warned = true;
    }
    MutexLock lock(mu_);
    cv_.WaitFor(mu_, backoff, [&]() REQUIRES(mu_) { return stopping_; });
    backoff = std::min(backoff * 2, config_.backoff_max);
  }
}

void CoordinatorLink::SendLoop() {
  while (true) {
    std::function<void()> task;
    {
      MutexLock lock(mu_);
      while (!stopping_ && (task = NextTask()) == nullptr) {
        if (std::optional<ReportRetries::Clock::time_point> due = retries_.NextDue()) {
          cv_.WaitUntil(mu_, *due);
        } else {
          cv_.Wait(mu_);
        }
      }
      if (stopping_) return;
    }
    task();
  }
}

std::function<void()> CoordinatorLink::NextTask() {
  if (!queue_.empty()) {  // what is queued goes first: it may replace a waiting retry
    std::function<void()> task = std::move(queue_.front());
    queue_.pop_front();
    return task;
  }
  return retries_.TakeDue(ReportRetries::Clock::now());
}

bool CoordinatorLink::Enqueue(std::function<void()> task) {
  return EnqueueReport("", [task = std::move(task)](uint64_t) { task(); });
}

bool CoordinatorLink::EnqueueReport(const std::string& key, std::function<void(uint64_t)> send) {
  {
    MutexLock lock(mu_);
    if (stopping_) return false;
    if (queue_.size() >= kMaxQueued) {
      spdlog::warn("coordinator link: {} reports queued; dropping one (re-reported on reconnect)",
                   queue_.size());
      return false;
    }
    // Numbered as it is queued: numbers follow the queue's order, whichever thread reports.
    const uint64_t seq = retries_.Queued(key);
    queue_.push_back([seq, send = std::move(send)] { send(seq); });
  }
  cv_.NotifyAll();
  return true;
}

namespace {

std::string RegistrationKey(const ckptd::v1::ReportRegistrationRequest& req) {
  return req.job() + '\0' + std::to_string(req.rank());
}

// ReportRetries keys: a rank's newer registration replaces its older one; a step's newer
// PERSISTED report replaces the older (its node manifest holds every rank the older did, and
// the coordinator keeps a node's last manifest, so an older one arriving later would shrink
// it); other reports replace nothing (repeats of them change nothing, in any order).
std::string RetryKey(const ckptd::v1::ReportRegistrationRequest& req) {
  return "registration " + RegistrationKey(req);
}
std::string RetryKey(const ckptd::v1::ReportRanksRequest& req) {
  if (req.state() != ckptd::v1::STEP_STATE_PERSISTED) return "";
  return "persisted " + req.job() + '\0' + std::to_string(req.step());
}

// A call the coordinator did not answer, or could not take now, rather than refused: worth
// sending again. A refusal (a stale epoch, a bad layout, an unknown node) is not: what the
// node still holds is registered again after its next reconnect instead.
bool WorthRetrying(const grpc::Status& st) {
  switch (st.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
    case grpc::StatusCode::ABORTED:
    case grpc::StatusCode::CANCELLED:
    case grpc::StatusCode::UNKNOWN:
      return true;
    default:
      return false;
  }
}

}  // namespace

void CoordinatorLink::ReportRanks(ckptd::v1::ReportRanksRequest request) {
  request.set_node_id(config_.node_id);
  std::string key = RetryKey(request);
  EnqueueReport(key, [this, key, req = std::move(request)](uint64_t seq) mutable {
    ReportAttempt attempt;
    attempt.key = std::move(key);
    attempt.seq = seq;
    attempt.backoff = config_.backoff_min;
    SendReport(std::move(attempt), std::move(req));
  });
}

void CoordinatorLink::SendReport(ReportAttempt attempt, ckptd::v1::ReportRanksRequest req) {
  ++attempt.tries;
  grpc::ClientContext ctx;
  Deadline(ctx);
  ckptd::v1::ReportRanksResponse resp;
  grpc::Status st = stub_->ReportRanks(&ctx, req, &resp);
  if (st.ok()) {
    ReportDone(attempt.key, attempt.seq);
    if (resp.has_decision()) {
      ckptd::v1::CoordinatorEvent e;
      *e.mutable_step() = resp.decision();
      PostToLoop([this, e] { handler_->OnCoordinatorEvent(e); });
    }
    return;
  }
  const auto now = ReportRetries::Clock::now();
  if (attempt.tries == 1) attempt.give_up_at = now + kReportRetryWindow;
  // Not for ever: a report the coordinator cannot take for so long is re-reported after the
  // node's next reconnect, and one that arrived after the coordinator forgot the step (64
  // finished steps later) would start it anew.
  const bool worth = WorthRetrying(st);
  const bool again = worth && now + attempt.backoff < attempt.give_up_at;
  // The first failure and a refusal warn; giving up after the window is an error (the step may
  // wait for the node's next reconnect or its timeout); failures between are debug.
  const auto level = worth && !again                ? spdlog::level::err
                     : !again || attempt.tries == 1 ? spdlog::level::warn
                                                    : spdlog::level::debug;
  spdlog::log(level, "coordinator: report of job '{}' step {} ranks ({}) {} (attempt {}): {}{}",
              req.job(), req.step(), req.ranks_size(), ckptd::v1::StepState_Name(req.state()),
              attempt.tries, st.error_message(),
              again   ? fmt::format("; sent again in {} ms", attempt.backoff.count())
              : worth ? fmt::format("; given up after {} s: re-reported after the node's next "
                                    "reconnect, or the step ends by its timeout",
                                    kReportRetryWindow.count())
                      : std::string("; not sent again (re-reported after the next reconnect)"));
  if (!again) {
    ReportDone(attempt.key, attempt.seq);
    return;
  }
  const std::string key = attempt.key;
  const uint64_t seq = attempt.seq;
  const std::chrono::milliseconds backoff = attempt.backoff;
  attempt.backoff = std::min(backoff * 2, config_.backoff_max);
  ScheduleRetry(key, seq, backoff,
                [this, attempt = std::move(attempt), req = std::move(req)]() mutable {
                  SendReport(std::move(attempt), std::move(req));
                });
}

void CoordinatorLink::ScheduleRetry(const std::string& key, uint64_t seq,
                                    std::chrono::milliseconds after, std::function<void()> send) {
  {
    MutexLock lock(mu_);
    if (stopping_) return;
    if (retries_.waiting() >= kMaxQueued) {
      spdlog::warn("coordinator link: {} reports wait to be sent again; dropping one",
                   retries_.waiting());
      return;
    }
    // Not kept when a newer report under the key was queued since: that one counts.
    retries_.Schedule(key, seq, ReportRetries::Clock::now() + after, std::move(send));
  }
  cv_.NotifyAll();
}

void CoordinatorLink::ReportDone(const std::string& key, uint64_t seq) {
  MutexLock lock(mu_);
  retries_.Done(key, seq);
}

void CoordinatorLink::ReportRegistration(ckptd::v1::ReportRegistrationRequest request) {
  request.set_node_id(config_.node_id);
  {
    // This one replaces a registration the coordinator holds as pending: a layout asked for
    // that one must not be sent after this. (A retry of it waiting is dropped as this one is
    // queued.)
    MutexLock lock(mu_);
    pending_layouts_.erase(RegistrationKey(request));
  }
  const std::string key = RetryKey(request);  // before the request is moved below
  EnqueueReport(key, [this, req = std::move(request)](uint64_t seq) mutable {
    RegistrationAttempt attempt;
    attempt.seq = seq;
    attempt.backoff = config_.backoff_min;
    SendRegistration(attempt, std::move(req));
  });
}

grpc::Status CoordinatorLink::CallReportRegistration(
    const ckptd::v1::ReportRegistrationRequest& req, ckptd::v1::ReportRegistrationResponse* resp) {
  grpc::ClientContext ctx;
  Deadline(ctx);
  return stub_->ReportRegistration(&ctx, req, resp);
}

void CoordinatorLink::RetryRegistration(RegistrationAttempt attempt,
                                        ckptd::v1::ReportRegistrationRequest full,
                                        const grpc::Status& st) {
  const bool again = WorthRetrying(st);
  // A first failure and a registration given up are told; a retry that fails again only at
  // debug level (a coordinator that is down fails them all until the node reconnects and
  // registers anew).
  const auto level = !again || attempt.tries == 1 ? spdlog::level::warn : spdlog::level::debug;
  spdlog::log(level, "coordinator: registration of job '{}' rank {}{} (attempt {}): {}{}",
              full.job(), full.rank(), full.withdrawn() ? " (withdrawal)" : "", attempt.tries,
              st.error_message(),
              again ? fmt::format("; sent again in {} ms", attempt.backoff.count())
                    : std::string("; not sent again (the node registers it anew after its next "
                                  "reconnect)"));
  if (!again) {
    if (full.withdrawn()) ReportDone(RetryKey(full), attempt.seq);
    return;
  }
  const std::string key = RetryKey(full);
  const std::chrono::milliseconds backoff = attempt.backoff;
  attempt.backoff = std::min(backoff * 2, config_.backoff_max);
  ScheduleRetry(key, attempt.seq, backoff, [this, attempt, full = std::move(full)]() mutable {
    SendRegistration(attempt, std::move(full));
  });
}

void CoordinatorLink::SendRegistration(RegistrationAttempt attempt,
                                       ckptd::v1::ReportRegistrationRequest full) {
  ++attempt.tries;
  const std::string key = RegistrationKey(full);
  ckptd::v1::ReportRegistrationResponse resp;
  if (full.withdrawn()) {
    {
      MutexLock lock(mu_);
      pending_layouts_.erase(key);  // one an older registration's answer stored meanwhile
    }
    grpc::Status st = CallReportRegistration(full, &resp);
    if (!st.ok()) {
      RetryRegistration(attempt, std::move(full), st);
      return;
    }
    // The rank is done here (nothing older of it is queued or waiting: the sender thread sends
    // in order).
    ReportDone(RetryKey(full), attempt.seq);
    return;
  }
  // By fingerprint first: a data-parallel replica of a rank registered before sends 16 bytes
  // instead of its layout (proto/README.md, "Registration by fingerprint").
  full.set_layout_fingerprint(FingerprintLayout(full.shards()).ToBytes());
  // The brief copy without copying the shards: they are swapped out and back.
  google::protobuf::RepeatedPtrField<ckptd::v1::ShardKey> shards;
  shards.Swap(full.mutable_shards());
  const ckptd::v1::ReportRegistrationRequest brief = full;
  full.mutable_shards()->Swap(&shards);
  // Once the coordinator asked for the layout, a retry sends it at once.
  grpc::Status st;
  if (!attempt.layout_asked) {
    st = CallReportRegistration(brief, &resp);
    attempt.layout_asked = st.ok() && resp.need_layout();
    if (attempt.layout_asked) resp.Clear();
  }
  if (attempt.layout_asked) st = CallReportRegistration(full, &resp);
  if (!st.ok()) {
    RetryRegistration(attempt, std::move(full), st);
    return;
  }
  MutexLock lock(mu_);
  if (!retries_.IsNewest(RetryKey(full), attempt.seq)) {
    return;  // a newer registration or withdrawal of the rank is queued: it alone counts
  }
  if (resp.layout_pending()) {
    pending_layouts_[key] = std::move(full);  // sent again if the coordinator asks for it
  } else {
    pending_layouts_.erase(key);
  }
}

void CoordinatorLink::ResendLayout(const ckptd::v1::LayoutRequest& ask) {
  const std::string key = ask.job() + '\0' + std::to_string(ask.rank());
  ckptd::v1::ReportRegistrationRequest full;
  {
    MutexLock lock(mu_);
    auto it = pending_layouts_.find(key);
    if (it == pending_layouts_.end() || it->second.registration_id() != ask.registration_id()) {
      return;  // a registration since replaced: the coordinator hears the new one
    }
    full = it->second;
    // Still this node's registration of the rank: current in this epoch, whichever it was
    // first sent in (after a fence, the old epoch's copy would be refused).
    if (full.epoch() != 0) full.set_epoch(epoch_);
  }
  spdlog::info("coordinator: sends the layout of job '{}' rank {} again, as asked", ask.job(),
               ask.rank());
  Enqueue([this, full = std::move(full)]() mutable {
    // With its shards at once: the coordinator asked for them.
    const std::string key = RegistrationKey(full);
    ckptd::v1::ReportRegistrationResponse resp;
    if (grpc::Status st = CallReportRegistration(full, &resp); !st.ok()) {
      spdlog::warn("coordinator: layout of job '{}' rank {}, sent again as asked: {}", full.job(),
                   full.rank(), st.error_message());
      return;  // the coordinator asks once more if it still holds the registration
    }
    MutexLock lock(mu_);
    auto it = pending_layouts_.find(key);
    if (it != pending_layouts_.end() && it->second.registration_id() == full.registration_id()) {
      pending_layouts_.erase(it);
    }
  });
}

void CoordinatorLink::Latest(const std::string& job, std::optional<RestoreQuery> restore_point,
                             LatestDone done) {
  // A question that cannot be queued is answered at once (a load waits for it, with no deadline
  // of its own).
  auto answer = std::make_shared<LatestDone>(std::move(done));
  const bool queued = Enqueue([this, job, restore_point, answer]() mutable {
    grpc::ClientContext ctx;
    Deadline(ctx);
    ckptd::v1::JobRequest req;
    req.set_job(job);
    if (restore_point) {
      req.set_restore_point(true);
      req.set_rank(restore_point->rank);
      req.set_world_size(restore_point->world_size);
      req.set_session(restore_point->session);
    }
    ckptd::v1::LatestResponse resp;
    grpc::Status st = stub_->Latest(&ctx, req, &resp);
    Result<std::optional<uint64_t>> out =
        st.ok() ? Result<std::optional<uint64_t>>(
                      resp.has_step() ? std::optional<uint64_t>(resp.step()) : std::nullopt)
                : Result<std::optional<uint64_t>>(Unavailable("coordinator " + config_.address +
                                                              ": latest of job '" + job +
                                                              "': " + st.error_message()));
    PostToLoop([answer, out = std::move(out)]() mutable { (*answer)(std::move(out)); });
  });
  if (!queued) {
    PostToLoop([answer, job, address = config_.address] {
      (*answer)(Unavailable("coordinator " + address + ": latest of job '" + job +
                            "': the link is stopping or its queue is full"));
    });
  }
}

void CoordinatorLink::StepManifest(const std::string& job, uint64_t step, StepManifestDone done) {
  auto answer = std::make_shared<StepManifestDone>(std::move(done));
  const std::string what = "coordinator " + config_.address + ": the manifest of job '" + job +
                           "' step " + std::to_string(step);
  const bool queued = Enqueue([this, job, step, answer, what] {
    grpc::ClientContext ctx;
    Deadline(ctx);
    ckptd::v1::StepManifestRequest req;
    req.set_job(job);
    req.set_step(step);
    auto manifest = std::make_shared<ckptd::v1::Manifest>();
    grpc::Status st = stub_->StepManifest(&ctx, req, manifest.get());
    Result<std::shared_ptr<const ckptd::v1::Manifest>> out =
        st.ok() ? Result<std::shared_ptr<const ckptd::v1::Manifest>>(std::move(manifest))
        : st.error_code() == grpc::StatusCode::NOT_FOUND
            ? Result<std::shared_ptr<const ckptd::v1::Manifest>>(NotFound(st.error_message()))
            : Result<std::shared_ptr<const ckptd::v1::Manifest>>(
                  Unavailable(what + ": " + st.error_message()));
    PostToLoop([answer, out = std::move(out)]() mutable { (*answer)(std::move(out)); });
  });
  if (!queued) {
    PostToLoop([answer, what] {
      (*answer)(Unavailable(what + ": the link is stopping or its queue is full"));
    });
  }
}

void CoordinatorLink::PlanLoad(ckptd::v1::LoadPlanRequest request, PlanLoadDone done) {
  auto answer = std::make_shared<PlanLoadDone>(std::move(done));
  const std::string what = "coordinator " + config_.address + ": load plan of job '" +
                           request.job() + "' step " + std::to_string(request.step());
  const bool queued = Enqueue([this, request = std::move(request), answer, what]() mutable {
    grpc::ClientContext ctx;
    Deadline(ctx);
    ckptd::v1::LoadPlanResponse resp;
    grpc::Status st = stub_->PlanLoad(&ctx, request, &resp);
    Result<ckptd::v1::LoadPlanResponse> out =
        st.ok()
            ? Result<ckptd::v1::LoadPlanResponse>(std::move(resp))
            : Result<ckptd::v1::LoadPlanResponse>(Unavailable(what + ": " + st.error_message()));
    PostToLoop([answer, out = std::move(out)]() mutable { (*answer)(std::move(out)); });
  });
  if (!queued) {
    PostToLoop([answer, what] {
      (*answer)(Unavailable(what + ": the link is stopping or its queue is full"));
    });
  }
}

}  // namespace ckpt
