#include "daemon/admin/admin_service.h"

#include <chrono>
#include <deque>
#include <map>

#include "common/logging.h"
#include "common/mutex.h"
#include "daemon/rpc/grpc_status.h"

namespace ckpt {

namespace {

// Finishes a unary RPC with the provider's answer, copied into the response gRPC owns.
template <typename T>
AdminProvider::Reply<T> FinishWith(grpc::ServerUnaryReactor* reactor, T* response) {
  return [reactor, response](Result<T> result) {
    if (!result.ok()) {
      reactor->Finish(ToGrpcStatus(result.status()));
      return;
    }
    *response = std::move(result).value();
    reactor->Finish(grpc::Status::OK);
  };
}

// One WatchEvents stream: a bounded queue between the hub (any thread) and gRPC's writes.
class WatchReactor final : public grpc::ServerWriteReactor<ckptd::v1::WatchEventsResponse> {
 public:
  WatchReactor(WatchHub& hub, const ckptd::v1::WatchEventsRequest& request)
      : hub_(hub),
        interval_(request.progress_interval_ms() == 0 ? 1000 : request.progress_interval_ms()) {
    if (interval_ < std::chrono::milliseconds(100)) interval_ = std::chrono::milliseconds(100);
    id_ = hub_.Subscribe(
        request.job(), [this](const ckptd::v1::WatchEventsResponse& e) { Deliver(e); },
        [this] {
          MutexLock lock(mu_);
          FinishLocked(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the server is shutting down"));
        });
    // After subscribing: a client whose WaitForInitialMetadata returned is sure to get every
    // later event (tests and scripts use it as "subscribed"). Events that arrived meanwhile
    // waited in the queue; writes start only now, after the metadata.
    MutexLock lock(mu_);
    if (finished_) return;
    StartSendInitialMetadata();
    subscribed_ = true;
    WriteNextLocked();
  }

  void OnWriteDone(bool ok) override {
    MutexLock lock(mu_);
    writing_ = false;
    if (!ok) {  // the client went away; OnCancel or OnDone follows
      FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "write failed"));
      return;
    }
    queue_.pop_front();
    WriteNextLocked();
  }
  void OnCancel() override {
    MutexLock lock(mu_);
    FinishLocked(grpc::Status::CANCELLED);
  }
  void OnDone() override {
    hub_.Unsubscribe(id_);  // after this, Deliver is never called again
    delete this;
  }

 private:
  void Deliver(const ckptd::v1::WatchEventsResponse& e) {
    MutexLock lock(mu_);
    if (finished_) return;
    if (e.has_progress()) {
      const auto key = std::make_pair(e.progress().job(), e.progress().step());
      const auto now = std::chrono::steady_clock::now();
      auto [it, fresh] = last_progress_.try_emplace(key, now);
      if (!fresh && now - it->second < interval_) return;
      it->second = now;
      if (last_progress_.size() > 1024) last_progress_.clear();  // bounded; only throttling state
    }
    if (queue_.size() >= AdminService::kMaxQueuedEvents) {
      FinishLocked(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                                "watch: the client read too slowly; " +
                                    std::to_string(queue_.size()) + " events were queued"));
      return;
    }
    queue_.push_back(e);
    WriteNextLocked();
  }
  void WriteNextLocked() REQUIRES(mu_) {
    if (!subscribed_ || writing_ || finished_ || queue_.empty()) return;
    writing_ = true;
    StartWrite(&queue_.front());
  }
  void FinishLocked(const grpc::Status& status) REQUIRES(mu_) {
    if (finished_) return;
    finished_ = true;
    Finish(status);
  }

  WatchHub& hub_;
  std::chrono::milliseconds interval_;
  uint64_t id_ = 0;
  Mutex mu_;
  std::deque<ckptd::v1::WatchEventsResponse> queue_ GUARDED_BY(mu_);  // front is being written
  bool writing_ GUARDED_BY(mu_) = false;
  bool subscribed_ GUARDED_BY(mu_) = false;
  bool finished_ GUARDED_BY(mu_) = false;
  std::map<std::pair<std::string, uint64_t>, std::chrono::steady_clock::time_point> last_progress_
      GUARDED_BY(mu_);
};

}  // namespace

grpc::ServerUnaryReactor* AdminService::GetStatus(grpc::CallbackServerContext* ctx,
                                                  const ckptd::v1::GetStatusRequest*,
                                                  ckptd::v1::GetStatusResponse* response) {
  auto* reactor = ctx->DefaultReactor();
  provider_->GetStatus(FinishWith(reactor, response));
  return reactor;
}

grpc::ServerUnaryReactor* AdminService::ListCheckpoints(
    grpc::CallbackServerContext* ctx, const ckptd::v1::ListCheckpointsRequest* request,
    ckptd::v1::ListCheckpointsResponse* response) {
  auto* reactor = ctx->DefaultReactor();
  provider_->ListCheckpoints(request->job(), FinishWith(reactor, response));
  return reactor;
}

grpc::ServerUnaryReactor* AdminService::DescribeCheckpoint(
    grpc::CallbackServerContext* ctx, const ckptd::v1::DescribeCheckpointRequest* request,
    ckptd::v1::DescribeCheckpointResponse* response) {
  auto* reactor = ctx->DefaultReactor();
  provider_->DescribeCheckpoint(request->job(), request->step(), FinishWith(reactor, response));
  return reactor;
}

Status AdminService::CheckWritable(const std::string& what) const {
  if (!read_only_) return Status::Ok();
  return PermissionDenied(what + ": this admin endpoint is read-only (admin-read-only: true)");
}

template <typename Request, typename Response, typename Operation>
grpc::ServerUnaryReactor* AdminService::StepOperation(grpc::CallbackServerContext* ctx,
                                                      const char* verb, const Request* request,
                                                      Response* response, Operation operation) {
  auto* reactor = ctx->DefaultReactor();
  auto reply = FinishWith(reactor, response);
  Status allowed = CheckWritable(std::string(verb) + " of job '" + request->job() + "' step " +
                                 std::to_string(request->step()));
  if (!allowed.ok()) {
    reply(allowed);
  } else {
    (provider_->*operation)(request->job(), request->step(), std::move(reply));
  }
  return reactor;
}

grpc::ServerUnaryReactor* AdminService::PinCheckpoint(
    grpc::CallbackServerContext* ctx, const ckptd::v1::PinCheckpointRequest* request,
    ckptd::v1::PinCheckpointResponse* response) {
  return StepOperation(ctx, "pin", request, response, &AdminProvider::PinCheckpoint);
}

grpc::ServerUnaryReactor* AdminService::UnpinCheckpoint(
    grpc::CallbackServerContext* ctx, const ckptd::v1::UnpinCheckpointRequest* request,
    ckptd::v1::UnpinCheckpointResponse* response) {
  return StepOperation(ctx, "unpin", request, response, &AdminProvider::UnpinCheckpoint);
}

grpc::ServerUnaryReactor* AdminService::DeleteCheckpoint(
    grpc::CallbackServerContext* ctx, const ckptd::v1::DeleteCheckpointRequest* request,
    ckptd::v1::DeleteCheckpointResponse* response) {
  return StepOperation(ctx, "delete", request, response, &AdminProvider::DeleteCheckpoint);
}

grpc::ServerUnaryReactor* AdminService::ReleaseJob(grpc::CallbackServerContext* ctx,
                                                   const ckptd::v1::ReleaseJobRequest* request,
                                                   ckptd::v1::ReleaseJobResponse* response) {
  auto* reactor = ctx->DefaultReactor();
  auto reply = FinishWith(reactor, response);
  Status allowed = CheckWritable("release of job '" + request->job() + "'");
  if (!allowed.ok()) {
    reply(allowed);
  } else {
    provider_->ReleaseJob(request->job(), std::move(reply));
  }
  return reactor;
}

grpc::ServerWriteReactor<ckptd::v1::WatchEventsResponse>* AdminService::WatchEvents(
    grpc::CallbackServerContext*, const ckptd::v1::WatchEventsRequest* request) {
  return new WatchReactor(provider_->watch_hub(), *request);
}

}  // namespace ckpt
