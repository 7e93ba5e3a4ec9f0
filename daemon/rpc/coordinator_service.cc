#include "daemon/rpc/coordinator_service.h"

#include <deque>

#include "common/logging.h"
#include "common/mutex.h"
#include "daemon/rpc/grpc_status.h"

namespace ckpt {

namespace {

template <typename T>
grpc::ServerUnaryReactor* FinishWith(grpc::CallbackServerContext* ctx, const Result<T>& r,
                                     T* resp) {
  auto* reactor = ctx->DefaultReactor();
  if (r.ok()) *resp = *r;
  reactor->Finish(ToGrpcStatus(r.status()));
  return reactor;
}

// One node's event stream. The reactor deletes itself in OnDone; the core holds the Channel,
// whose pointer to the reactor is cleared (under its mutex) before that happens.
class WatchReactor final : public grpc::ServerWriteReactor<ckptd::v1::CoordinatorEvent> {
 public:
  class Channel final : public NodeSink {
   public:
    explicit Channel(WatchReactor* r) : reactor_(r) {}
    void Send(const ckptd::v1::CoordinatorEvent& e) override {
      MutexLock lock(mu_);
      if (reactor_ != nullptr) reactor_->Enqueue(e);
    }
    void Clear() {
      MutexLock lock(mu_);
      reactor_ = nullptr;
    }

   private:
    Mutex mu_;
    WatchReactor* reactor_ GUARDED_BY(mu_);
  };

  WatchReactor(CoordinatorCore* core, std::string node_id)
      : core_(core), node_id_(std::move(node_id)), channel_(std::make_shared<Channel>(this)) {
    Status st = core_->AttachNode(node_id_, channel_);
    if (!st.ok()) {
      attached_ = false;
      // Under the lock and marked, like every Finish here: a cancellation arriving now must
      // not finish the call a second time.
      MutexLock lock(mu_);
      finished_ = true;
      Finish(ToGrpcStatus(st));
    }
  }

  void Enqueue(const ckptd::v1::CoordinatorEvent& e) {
    MutexLock lock(mu_);
    if (finished_) return;
    if (queue_.size() >= kMaxQueued) {
      // A node that does not read its events is treated as gone; it reconnects and re-reports.
      finished_ = true;
      Finish(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                          "node '" + node_id_ + "' is not reading its events"));
      return;
    }
    queue_.push_back(e);
    if (!writing_) {
      writing_ = true;
      StartWrite(&queue_.front());
    }
  }

  void OnWriteDone(bool ok) override {
    MutexLock lock(mu_);
    writing_ = false;
    if (!ok) {
      if (!finished_) {
        finished_ = true;
        Finish(grpc::Status::CANCELLED);
      }
      return;
    }
    queue_.pop_front();
    if (!queue_.empty() && !finished_) {
      writing_ = true;
      StartWrite(&queue_.front());
    }
  }

  void OnCancel() override {
    MutexLock lock(mu_);
    if (!finished_) {
      finished_ = true;
      Finish(grpc::Status::CANCELLED);
    }
  }

  void OnDone() override {
    channel_->Clear();
    if (attached_) core_->DetachNode(node_id_, channel_.get());
    delete this;
  }

 private:
  static constexpr size_t kMaxQueued = 100'000;
  CoordinatorCore* core_;
  std::string node_id_;
  std::shared_ptr<Channel> channel_;
  bool attached_ = true;
  Mutex mu_;
  std::deque<ckptd::v1::CoordinatorEvent> queue_ GUARDED_BY(mu_);  // front is being written
  bool writing_ GUARDED_BY(mu_) = false;
  bool finished_ GUARDED_BY(mu_) = false;
};

}  // namespace

grpc::ServerUnaryReactor* CoordinatorService::RegisterNode(
    grpc::CallbackServerContext* ctx, const ckptd::v1::RegisterNodeRequest* req,
    ckptd::v1::RegisterNodeResponse* resp) {
  return FinishWith(ctx, core_->RegisterNode(*req, incarnation_), resp);
}

grpc::ServerWriteReactor<ckptd::v1::CoordinatorEvent>* CoordinatorService::Watch(
    grpc::CallbackServerContext*, const ckptd::v1::WatchRequest* req) {
  return new WatchReactor(core_, req->node_id());
}

grpc::ServerUnaryReactor* CoordinatorService::ReportRanks(grpc::CallbackServerContext* ctx,
                                                          const ckptd::v1::ReportRanksRequest* req,
                                                          ckptd::v1::ReportRanksResponse* resp) {
  return FinishWith(ctx, core_->ReportRanks(*req), resp);
}

grpc::ServerUnaryReactor* CoordinatorService::ReportRegistration(
    grpc::CallbackServerContext* ctx, const ckptd::v1::ReportRegistrationRequest* req,
    ckptd::v1::ReportRegistrationResponse* resp) {
  auto* reactor = ctx->DefaultReactor();
  auto answer = core_->ReportRegistration(*req);
  if (answer.ok()) *resp = std::move(answer).value();
  reactor->Finish(ToGrpcStatus(answer.status()));
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::Latest(grpc::CallbackServerContext* ctx,
                                                     const ckptd::v1::JobRequest* req,
                                                     ckptd::v1::LatestResponse* resp) {
  auto latest = req->restore_point() ? core_->RestorePoint(req->job(), req->rank(),
                                                           req->world_size(), req->session())
                                     : core_->Latest(req->job());
  auto* reactor = ctx->DefaultReactor();
  if (latest.ok() && latest->has_value()) {
    resp->set_has_step(true);
    resp->set_step(**latest);
  }
  reactor->Finish(ToGrpcStatus(latest.status()));
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::ListSteps(grpc::CallbackServerContext* ctx,
                                                        const ckptd::v1::JobRequest* req,
                                                        ckptd::v1::ListStepsResponse* resp) {
  auto list = core_->List(req->job());
  auto* reactor = ctx->DefaultReactor();
  if (list.ok()) {
    for (uint64_t s : *list) resp->add_steps(s);
  }
  reactor->Finish(ToGrpcStatus(list.status()));
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::PlanLoad(grpc::CallbackServerContext* ctx,
                                                       const ckptd::v1::LoadPlanRequest* req,
                                                       ckptd::v1::LoadPlanResponse* resp) {
  return FinishWith(ctx, core_->PlanLoad(*req), resp);
}

grpc::ServerUnaryReactor* CoordinatorService::StepManifest(
    grpc::CallbackServerContext* ctx, const ckptd::v1::StepManifestRequest* req,
    ckptd::v1::Manifest* resp) {
  auto manifest = core_->StepManifest(req->job(), req->step());
  auto* reactor = ctx->DefaultReactor();
  if (manifest.ok()) *resp = **manifest;
  reactor->Finish(ToGrpcStatus(manifest.status()));
  return reactor;
}

}  // namespace ckpt
