#include "daemon/session.h"

#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>
#include <chrono>

#include "common/logging.h"
#include "common/mutex.h"
#include "common/names.h"
#include "daemon/load_service.h"

namespace ckpt {

// One registration handed to the register pool. The loop fills in the request before posting
// (the pool's queue orders that before the worker reads it); the outcome goes back under `mu`,
// which also settles who releases the session's backends when the session closes meanwhile:
// Close finding `built` releases them itself, else it sets `abandoned` and the worker, finding
// that, releases them when it is done with them. Either way exactly one thread touches them at a
// time, and nothing the plan opened outlives the session.
struct Session::InFlightRegistration {
  uint64_t request_id = 0;
  std::vector<ckptd::v1::TensorSpec> specs;
  std::vector<UniqueFd> fds;
  std::chrono::steady_clock::time_point started;

  Mutex mu;
  bool built GUARDED_BY(mu) = false;      // the worker is done with the backends
  bool abandoned GUARDED_BY(mu) = false;  // the session closed first; the worker cleans up
  std::optional<Result<std::shared_ptr<const CapturePlan>>> plan GUARDED_BY(mu);
};

namespace {
// The newest local protocol this daemon speaks, and the oldest client it still accepts (the
// previous release's): a daemon upgraded under running jobs keeps serving their clients.
constexpr uint32_t kProtocolVersion = 3;
constexpr uint32_t kOldestProtocolVersion = 1;
}  // namespace

Session::Session(boost::asio::local::stream_protocol::socket socket, uint64_t id, int32_t peer_pid,
                 uint32_t peer_uid, SessionServices* services)
    : socket_(std::move(socket)),
      id_(id),
      peer_pid_(peer_pid),
      peer_uid_(peer_uid),
      services_(services) {}

Session::~Session() = default;

void Session::Start() {
  socket_.non_blocking(true);
  spdlog::debug("session {}: connected (pid {}, uid {})", id_, peer_pid_, peer_uid_);
  ArmRead();
}

void Session::ArmRead() {
  // Not while a registration is in flight: what the trainer sends meanwhile waits in the socket
  // (FinishRegistration reads it and arms again).
  if (closed_ || registering_ != nullptr || read_armed_) return;
  read_armed_ = true;
  socket_.async_wait(boost::asio::socket_base::wait_read,
                     [self = shared_from_this()](const boost::system::error_code& ec) {
                       self->read_armed_ = false;
                       if (ec) {
                         self->Close(ec.message());
                         return;
                       }
                       self->OnReadable();
                     });
}

void Session::OnReadable() {
  DrainInput();
  ArmRead();
}

void Session::DrainInput() {
  // What is there, one frame at a time; never blocks (the socket is non-blocking). A frame that
  // starts a registration ends the loop: the frames after it are its to wait for.
  while (!closed_ && registering_ == nullptr) {
    auto frame = reader_.ReadSome(socket_.native_handle());
    if (!frame.ok()) {
      if (frame.status().code() != StatusCode::kUnavailable) {
        SendError(0, frame.status().WithContext("protocol error"));
      }
      Close(frame.status().message());
      return;
    }
    if (!frame->has_value()) return;
    Dispatch(std::move(**frame));
  }
}

void Session::SyncInput(std::function<void()> caught_up) {
  if (registering_ == nullptr) DrainInput();
  if (registering_ != nullptr && !closed_) {
    // Unread input waits behind the registration; so does this capture's sync.
    deferred_syncs_.push_back(std::move(caught_up));
    return;
  }
  caught_up();
}

void Session::Dispatch(Frame frame) {
  ckptd::v1::ClientMessage m;
  if (!m.ParseFromString(frame.payload)) {
    SendError(0,
              InvalidArgument("protocol error: a frame of " + std::to_string(frame.payload.size()) +
                              " bytes is not a ClientMessage"));
    Close("unparseable frame");
    return;
  }
  if (!hello_ && m.body_case() != ckptd::v1::ClientMessage::kHello) {
    SendError(m.request_id(),
              FailedPrecondition("protocol error: the first message must be Hello"));
    Close("no hello");
    return;
  }
  Handle(m, std::move(frame.fds));
}

void Session::Handle(const ckptd::v1::ClientMessage& m, std::vector<UniqueFd> fds) {
  const uint64_t id = m.request_id();
  switch (m.body_case()) {
    case ckptd::v1::ClientMessage::kHello:
      HandleHello(id, m.hello());
      return;
    case ckptd::v1::ClientMessage::kRegister:
      HandleRegister(id, m.register_(), std::move(fds));
      return;
    case ckptd::v1::ClientMessage::kSave:
      HandleSave(id, m.save());
      return;
    case ckptd::v1::ClientMessage::kWaitSnapshot:
      if (!last_saved_step_) {
        ckptd::v1::DaemonMessage reply;
        reply.set_request_id(id);
        reply.mutable_wait()->set_state(ckptd::v1::STEP_STATE_CAPTURED);
        Send(reply);
        return;
      }
      HandleWait(id, *last_saved_step_, ckptd::v1::STEP_STATE_CAPTURED);
      return;
    case ckptd::v1::ClientMessage::kWait:
      HandleWait(id, m.wait().step(), m.wait().state());
      return;
    case ckptd::v1::ClientMessage::kLatest: {
      auto reply = [self = shared_from_this(), id](Result<std::optional<uint64_t>> latest) {
        if (self->closed_) return;
        if (!latest.ok()) {
          self->SendError(id, latest.status());
          return;
        }
        ckptd::v1::DaemonMessage reply;
        reply.set_request_id(id);
        reply.mutable_latest()->set_has_step(latest->has_value());
        if (latest->has_value()) reply.mutable_latest()->set_step(**latest);
        self->Send(reply);
      };
      if (m.latest().restore_point()) {
        services_->node->RestorePoint(job_, rank_, world_size_, id_, std::move(reply));
      } else {
        services_->node->Latest(job_, std::move(reply));
      }
      return;
    }
    case ckptd::v1::ClientMessage::kLoad:
      HandleLoad(id, m.load());
      return;
    case ckptd::v1::ClientMessage::kPing: {
      ckptd::v1::DaemonMessage reply;
      reply.set_request_id(id);
      reply.mutable_pong();
      Send(reply);
      return;
    }
    case ckptd::v1::ClientMessage::kAbandon: {
      const bool aborted = services_->node->Abandon(job_, m.abandon().step(), rank_, id_,
                                                    EscapeForLog(m.abandon().reason()));
      ckptd::v1::DaemonMessage reply;
      reply.set_request_id(id);
      reply.mutable_abandon()->set_step(m.abandon().step());
      reply.mutable_abandon()->set_aborted(aborted);
      Send(reply);
      return;
    }
    case ckptd::v1::ClientMessage::kConfirmSave:
      // One-way: a confirm that finds nothing held (the step ended meanwhile) changes nothing.
      if (!services_->node->ConfirmSave(job_, m.confirm_save().step(), rank_, id_)) {
        spdlog::debug("session {}: confirm of step {} found no held save", id_,
                      m.confirm_save().step());
      }
      return;
    default:
      SendError(id, InvalidArgument("unknown request type " + std::to_string(m.body_case())));
      return;
  }
}

void Session::HandleHello(uint64_t id, const ckptd::v1::Hello& hello) {
  if (hello_) {
    SendError(id, FailedPrecondition("Hello sent twice on one connection"));
    return;
  }
  Status st = ValidateJobName(hello.job());
  if (hello.protocol_version() < kOldestProtocolVersion) {
    st = FailedPrecondition(
        "client speaks protocol version " + std::to_string(hello.protocol_version()) +
        "; this daemon speaks " + std::to_string(kOldestProtocolVersion) + " to " +
        std::to_string(kProtocolVersion) + " (daemon version " + services_->version + ")");
  } else if (st.ok() && (hello.world_size() == 0 || hello.rank() >= hello.world_size())) {
    st = InvalidArgument("rank " + std::to_string(hello.rank()) + " is not below world size " +
                         std::to_string(hello.world_size()));
  }
  if (!st.ok()) {
    SendError(id, st);
    Close("bad hello: " + st.message());
    return;
  }
  hello_ = true;
  protocol_ = std::min(hello.protocol_version(), kProtocolVersion);
  job_ = hello.job();
  rank_ = hello.rank();
  world_size_ = hello.world_size();
  services_->node->AddSink(job_, weak_from_this());
  if (hello.has_lost_step()) {
    services_->node->OnSaveLost(job_, hello.lost_step(), rank_, world_size_);
  }
  spdlog::info("session {}: job '{}' rank {}/{} (pid {}, client {}, protocol {}{})", id_, job_,
               rank_, world_size_, peer_pid_, EscapeForLog(hello.client_version()), protocol_,
               hello.reattach() > 0 ? ", re-attach " + std::to_string(hello.reattach()) : "");
  if (services_->observer != nullptr) {
    services_->observer->OnClientConnected(
        {id_, job_, rank_, world_size_, peer_pid_, peer_uid_, hello.reattach() > 0});
  }
  ckptd::v1::DaemonMessage reply;
  reply.set_request_id(id);
  auto* r = reply.mutable_hello();
  r->set_protocol_version(protocol_);
  r->set_daemon_version(services_->version);
  r->set_node_id(services_->node_id);
  r->set_session_id(id_);
  Send(reply);
}

void Session::HandleRegister(uint64_t id, const ckptd::v1::Register& reg,
                             std::vector<UniqueFd> fds) {
  // Accumulate; descriptor indexes are rebased onto the whole registration's list.
  const uint32_t base = static_cast<uint32_t>(pending_fds_.size());
  if (pending_error_.ok()) {
    if (pending_specs_.size() + reg.tensors_size() > kMaxTensorsPerRegistration ||
        pending_fds_.size() + fds.size() > kMaxFdsPerRegistration) {
      pending_error_ = InvalidArgument(
          "registration is over the limits of " + std::to_string(kMaxTensorsPerRegistration) +
          " tensors and " + std::to_string(kMaxFdsPerRegistration) + " descriptors");
    } else {
      for (const auto& spec : reg.tensors()) {
        pending_specs_.push_back(spec);
        auto& added = pending_specs_.back();
        const bool host = added.has_host();
        const bool vmm = added.has_cuda() && added.cuda().has_vmm_fd_index();
        if (host || vmm) {
          const uint32_t index = host ? added.host().fd_index() : added.cuda().vmm_fd_index();
          if (index >= fds.size()) {
            pending_error_ = InvalidArgument(
                "tensor '" + EscapeForLog(spec.name()) + "' names descriptor " +
                std::to_string(index) + " but its frame carried " + std::to_string(fds.size()));
            break;
          }
          if (host) {
            added.mutable_host()->set_fd_index(base + index);
          } else {
            added.mutable_cuda()->set_vmm_fd_index(base + index);
          }
        }
      }
      for (auto& f : fds) pending_fds_.push_back(std::move(f));
    }
  }
  if (reg.more()) return;  // answered with the last frame

  auto specs = std::move(pending_specs_);
  auto received = std::move(pending_fds_);
  Status error = std::move(pending_error_);
  pending_specs_.clear();
  pending_fds_.clear();
  pending_error_ = Status::Ok();
  if (!error.ok()) {
    SendError(id, error.WithContext("register"));
    return;
  }
  ckptd::v1::DaemonMessage reply;
  reply.set_request_id(id);
  auto* r = reply.mutable_register_();
  if (plan_ != nullptr) {
    auto fp = RegistrationFingerprint(specs, received);
    if (fp.ok() && *fp == plan_->fingerprint) {
      r->set_tensors(static_cast<uint32_t>(plan_->tensors.size()));
      r->set_bytes(plan_->total_bytes);
      r->set_unchanged(true);
      Send(reply);
      return;
    }
  }
  // Created here, on the loop, so that the pointer never changes while a worker uses it.
  if (cuda_memory_ == nullptr && services_->cuda != nullptr) {
    for (const auto& spec : specs) {
      if (spec.has_cuda()) {
        cuda_memory_ = std::make_unique<device::CudaBackend>(services_->cuda);
        break;
      }
    }
  }
  auto registration = std::make_shared<InFlightRegistration>();
  registration->request_id = id;
  registration->specs = std::move(specs);
  registration->fds = std::move(received);
  registration->started = std::chrono::steady_clock::now();
  if (services_->registrations == nullptr) {
    BuildRegistration(*registration);
    FinishRegistration(registration);
    return;
  }
  // From here until FinishRegistration the worker alone uses host_memory_ and cuda_memory_:
  // registering_ stops the reading of frames, the only other way to reach them (file comment).
  registering_ = registration;
  const bool posted = services_->registrations->Post([self = shared_from_this(), registration,
                                                      executor = socket_.get_executor()] {
    self->BuildRegistration(*registration);
    // The session is released on the loop too (its socket belongs to it).
    boost::asio::post(executor, [self, registration] { self->FinishRegistration(registration); });
  });
  if (!posted) {
    registering_.reset();
    SendError(id, Unavailable("register: the daemon is stopping"));
  }
}

void Session::BuildRegistration(InFlightRegistration& registration) {
  std::optional<Result<std::shared_ptr<const CapturePlan>>> plan;
  plan.emplace(BuildCapturePlan(registration.specs, registration.fds,
                                MemoryBackends{&host_memory_, cuda_memory_.get()},
                                services_->layout));
  // The descriptors are closed here too, off the loop: the mappings keep the objects alive.
  registration.fds.clear();
  {
    MutexLock lock(registration.mu);
    registration.built = true;
    if (!registration.abandoned) {
      registration.plan = std::move(plan);
      return;
    }
  }
  // The session closed while this ran and left the backends to us (Close): the plan goes
  // first, then everything the caches still hold.
  plan.reset();
  ReleaseBackends();
}

void Session::FinishRegistration(const std::shared_ptr<InFlightRegistration>& registration) {
  if (registering_ == registration) registering_.reset();
  std::optional<Result<std::shared_ptr<const CapturePlan>>> plan;
  {
    MutexLock lock(registration->mu);
    plan = std::move(registration->plan);
  }
  // Closed meanwhile: Close or the worker released everything; the outcome is dropped.
  if (closed_ || !plan.has_value()) return;
  const uint64_t id = registration->request_id;
  auto drop_unused = [this] {
    host_memory_.DropUnused();
    if (cuda_memory_ != nullptr) cuda_memory_->DropUnused();
  };
  if (!plan->ok()) {
    SendError(id, plan->status().WithContext("register (job '" + job_ + "' rank " +
                                             std::to_string(rank_) + ")"));
    drop_unused();
  } else {
    // The old plan goes first, so that mappings only it used are closed now (re-registration).
    plan_ = std::move(*plan).value();
    drop_unused();
    ckptd::v1::DaemonMessage reply;
    reply.set_request_id(id);
    auto* r = reply.mutable_register_();
    r->set_tensors(static_cast<uint32_t>(plan_->tensors.size()));
    r->set_bytes(plan_->total_bytes);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - registration->started)
            .count();
    spdlog::info(
        "session {}: job '{}' rank {} registered {} tensors, {} bytes, {} mappings ({:.3f} s)", id_,
        job_, rank_, plan_->tensors.size(), plan_->total_bytes,
        host_memory_.cached() + (cuda_memory_ ? cuda_memory_->cached() : 0), seconds);
    Send(reply);
  }
  if (services_->registrations == nullptr) return;  // built inline: the caller reads on
  // What the trainer sent meanwhile, in order; it may start the next registration.
  DrainInput();
  if (registering_ == nullptr && !closed_) {
    auto syncs = std::move(deferred_syncs_);
    deferred_syncs_.clear();
    for (auto& caught_up : syncs) caught_up();
  }
  ArmRead();
}

void Session::ReleaseBackends() {
  host_memory_.Clear();
  if (cuda_memory_ != nullptr) cuda_memory_->Clear();
}

void Session::HandleSave(uint64_t id, const ckptd::v1::Save& save) {
  // The client recorded these events before sending the Save: make each GPU's copy stream wait
  // for them now, before any copy of this step can be enqueued (cuda_backend.h).
  if (save.cuda_events_size() > 0) {
    if (cuda_memory_ == nullptr) {
      SendError(id,
                FailedPrecondition(
                    "save of step " + std::to_string(save.step()) +
                    " carries CUDA events but no CUDA memory is registered" +
                    (services_->cuda == nullptr ? " (and this daemon has no CUDA backend)" : "")));
      return;
    }
    for (const auto& event : save.cuda_events()) {
      Status st = cuda_memory_->WaitForClientEvent(event);
      if (!st.ok()) {
        SendError(id, st.WithContext("save of step " + std::to_string(save.step()) + " (job '" +
                                     job_ + "' rank " + std::to_string(rank_) + ")"));
        return;
      }
    }
  }
  NodeState::SaveRequest req;
  req.job = job_;
  req.step = save.step();
  req.rank = rank_;
  req.world_size = world_size_;
  req.session_id = id_;
  req.pid = peer_pid_;
  req.plan = plan_;
  req.extra = save.extra();
  req.on_full = save.on_full();
  req.memory_only = save.memory_only();
  // Held saves are protocol 3: an older client never asks for one.
  req.hold = protocol_ >= 3 && save.hold();
  req.replace_held = protocol_ >= 3 && save.replace_held();
  // Before this rank's capture counts as complete, everything the trainer sent until then is
  // read: an Abandon written before the trainer touched the memory is seen in time.
  req.sync_input = [weak = weak_from_this()](std::function<void()> caught_up) {
    if (auto self = weak.lock()) {
      self->SyncInput(std::move(caught_up));
    } else {
      caught_up();
    }
  };
  auto outcome = services_->node->StartSave(std::move(req));
  if (!outcome.ok()) {
    SendError(id, outcome.status());
    return;
  }
  if (!outcome->skipped) last_saved_step_ = save.step();
  ckptd::v1::DaemonMessage reply;
  reply.set_request_id(id);
  reply.mutable_save()->set_step(save.step());
  reply.mutable_save()->set_skipped(outcome->skipped);
  reply.mutable_save()->set_reason(outcome->reason);
  reply.mutable_save()->set_held(outcome->held);
  Send(reply);
}

std::function<void(Status)> Session::WaitReplier(uint64_t id, uint64_t step,
                                                 ckptd::v1::StepState state) {
  return [self = shared_from_this(), id, step, state](Status st) {
    if (self->closed_) return;
    if (!st.ok()) {
      self->SendError(id, st);
      return;
    }
    ckptd::v1::DaemonMessage reply;
    reply.set_request_id(id);
    reply.mutable_wait()->set_step(step);
    reply.mutable_wait()->set_state(state);
    self->Send(reply);
  };
}

void Session::HandleWait(uint64_t id, uint64_t step, ckptd::v1::StepState state) {
  switch (state) {
    case ckptd::v1::STEP_STATE_CAPTURED:
      services_->node->WaitCaptured(job_, step, rank_, WaitReplier(id, step, state));
      return;
    case ckptd::v1::STEP_STATE_PERSISTED:
    case ckptd::v1::STEP_STATE_COMMITTED:
    case ckptd::v1::STEP_STATE_REPLICATED:
      services_->node->WaitState(job_, step, state, WaitReplier(id, step, state));
      return;
    default:
      SendError(
          id, InvalidArgument("wait: state must be captured, persisted, committed or replicated"));
  }
}

void Session::HandleLoad(uint64_t id, const ckptd::v1::Load& load) {
  if (services_->loads == nullptr) {
    SendError(id, Unimplemented("load is not supported by this daemon"));
    return;
  }
  // Access: a session loads its own job's checkpoints, or those of a job shared by config.
  const std::string& source = load.job().empty() ? job_ : load.job();
  if (source != job_) {
    if (Status st = ValidateJobName(source); !st.ok()) {
      SendError(id, st.WithContext("load"));
      return;
    }
    if (services_->shared_jobs.count(source) == 0) {
      SendError(id, PermissionDenied("load: job '" + job_ + "' may not load checkpoints of job '" +
                                     source + "' (it is not in the daemon's shared-jobs)"));
      return;
    }
  }
  LoadService::Request req;
  req.job = source;
  if (load.has_step()) req.step = load.step();
  req.strict = load.strict();
  req.rank = rank_;
  // Planned across nodes with the job's other ranks: only a load of the session's own job
  // (a shared job's ranks are not this job's).
  req.world_size = source == job_ ? world_size_ : 0;
  req.session_id = id_;
  req.plan = plan_;
  // A load of "the latest" of the session's own job restores the job's restore point: the same
  // step on every rank of a restart (restore_points.h). Set before `start` runs.
  auto restore_point = std::make_shared<std::optional<uint64_t>>();
  auto start = [self = shared_from_this(), id, plan = plan_, restore_point,
                req = std::move(req)](Status captured) mutable {
    if (self->closed_) return;
    if (*restore_point) req.step = **restore_point;
    if (!captured.ok()) {
      // The previous save failed; its capture no longer reads the memory, so loading is safe.
      spdlog::debug("session {}: load after a failed save: {}", self->id_, captured.ToString());
    }
    const auto load_started = std::chrono::steady_clock::now();
    self->services_->loads->Load(std::move(req), [self, id, plan,
                                                  load_started](Result<LoadService::Outcome> out) {
      if (out.ok() && self->services_->observer != nullptr) {
        self->services_->observer->OnLoad(
            self->job_, out->step, out->bytes_from_memory, out->bytes_from_storage,
            std::chrono::duration<double>(std::chrono::steady_clock::now() - load_started).count());
      }
      if (self->closed_) return;
      if (!out.ok()) {
        self->SendError(id, out.status());
        return;
      }
      ckptd::v1::DaemonMessage reply;
      if (self->cuda_memory_ != nullptr && plan != nullptr) {
        // Every H2D copy of the load is done; the events let the client's stream order after
        // them without a host synchronize of its own.
        std::vector<const ShardMemory*> memories;
        for (const auto& t : plan->tensors) memories.push_back(t.memory.get());
        auto events = device::CudaBackend::SignalLoaded(memories);
        if (!events.ok()) {
          self->SendError(id, events.status().WithContext("load into GPU memory"));
          return;
        }
        for (auto& e : *events) *reply.mutable_load()->add_cuda_events() = std::move(e);
      }
      reply.set_request_id(id);
      auto* r = reply.mutable_load();
      r->set_step(out->step);
      r->set_extra(out->extra);
      r->set_extra_rank(out->extra_rank);
      r->set_saved_world_size(out->saved_world_size);
      r->set_bytes_from_memory(out->bytes_from_memory);
      r->set_bytes_from_storage(out->bytes_from_storage);
      r->set_bytes_from_peers(out->bytes_from_peers);
      for (auto& m : out->missing) r->add_missing(m);
      self->Send(reply);
    });
  };
  // A load writes into the registered memory: never while this rank's last save still reads it.
  auto after_capture = [self = shared_from_this(), start = std::move(start)]() mutable {
    if (self->last_saved_step_) {
      self->services_->node->WaitCaptured(self->job_, *self->last_saved_step_, self->rank_,
                                          std::move(start));
    } else {
      start(Status::Ok());
    }
  };
  if (load.has_step() || source != job_) {
    after_capture();
    return;
  }
  services_->node->RestorePoint(
      job_, rank_, world_size_, id_,
      [self = shared_from_this(), id, restore_point,
       after_capture = std::move(after_capture)](Result<std::optional<uint64_t>> point) mutable {
        if (self->closed_) return;
        if (!point.ok()) {
          self->SendError(id, point.status().WithContext("load: the job's restore point"));
          return;
        }
        if (!point->has_value()) {
          self->SendError(id, NotFound("job '" + self->job_ + "' has no committed checkpoint"));
          return;
        }
        *restore_point = **point;
        after_capture();
      });
}

void Session::OnEvent(const ckptd::v1::Event& event) {
  if (closed_) return;
  ckptd::v1::DaemonMessage m;
  m.set_request_id(0);
  *m.mutable_event() = event;
  Send(m);
}

void Session::SendError(uint64_t request_id, const Status& status) {
  ckptd::v1::DaemonMessage m;
  m.set_request_id(request_id);
  m.mutable_error()->set_code(static_cast<uint32_t>(status.code()));
  m.mutable_error()->set_message(status.message());
  spdlog::debug("session {}: error to client: {}", id_, status.ToString());
  Send(m);
}

void Session::Send(const ckptd::v1::DaemonMessage& m) {
  if (closed_) return;
  std::string frame = EncodeFrame(m.SerializeAsString());
  out_bytes_ += frame.size();
  out_.push_back(std::move(frame));
  if (out_bytes_ > services_->max_queued_reply_bytes) {
    Close("client does not read its replies");
    return;
  }
  if (!writing_) WriteNext();
}

void Session::WriteNext() {
  if (out_.empty() || closed_) {
    writing_ = false;
    return;
  }
  writing_ = true;
  boost::asio::async_write(
      socket_, boost::asio::buffer(out_.front()),
      [self = shared_from_this()](const boost::system::error_code& ec, size_t) {
        self->writing_ = false;
        if (self->closed_) {
          // Close ran while this write was in flight: it left the queue
          // (and the buffer being written) to us.
          self->out_.clear();
          return;
        }
        if (ec) {
          self->Close("write: " + ec.message());
          return;
        }
        self->out_bytes_ -= self->out_.front().size();
        self->out_.pop_front();
        self->WriteNext();
      });
}

void Session::Close(const std::string& why) {
  if (closed_) return;
  // Flush what is queued (an Error explaining the close) on a best-effort basis: the socket is
  // non-blocking, so this never stalls the loop.
  for (const auto& frame : out_) {
    if (writing_) break;  // an async write owns the head of the queue
    ::send(socket_.native_handle(), frame.data(), frame.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  }
  closed_ = true;
  boost::system::error_code ignored;
  socket_.shutdown(boost::asio::socket_base::shutdown_both, ignored);
  socket_.close(ignored);
  // A write in flight still owns the queue's head; its completion clears the queue.
  if (!writing_) out_.clear();
  spdlog::info("session {}: closed ({}){}", id_, why,
               hello_ ? " job '" + job_ + "' rank " + std::to_string(rank_) : std::string());
  if (hello_) services_->node->OnSessionClosed(id_, job_, rank_, peer_pid_);
  if (hello_ && services_->observer != nullptr) services_->observer->OnClientDisconnected(id_);
  plan_.reset();
  // Captures whose sync waited for a registration: their steps were just aborted if this rank
  // had not captured them; let NodeState see that after this handler (Close may run inside one
  // of its callbacks).
  for (auto& caught_up : deferred_syncs_)
    boost::asio::post(socket_.get_executor(), std::move(caught_up));
  deferred_syncs_.clear();
  if (registering_ != nullptr) {
    // A worker may still be building with the backends: whoever finishes last releases them.
    std::optional<Result<std::shared_ptr<const CapturePlan>>> built_plan;
    bool built = false;
    {
      MutexLock lock(registering_->mu);
      registering_->abandoned = true;
      built = registering_->built;
      built_plan = std::move(registering_->plan);
    }
    registering_.reset();
    if (!built) return;  // BuildRegistration releases them when it is done
  }
  ReleaseBackends();
}

}  // namespace ckpt
