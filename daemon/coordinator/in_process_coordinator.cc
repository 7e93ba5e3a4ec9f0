#include "daemon/coordinator/in_process_coordinator.h"

#include <boost/asio/post.hpp>

#include "common/logging.h"

namespace ckpt {

// The core's events for this node, posted onto the loop (the core calls Send with its mutex
// held: only queue here).
class InProcessCoordinator::LoopSink final : public NodeSink {
 public:
  explicit LoopSink(InProcessCoordinator* owner) : owner_(owner) {}
  void Send(const ckptd::v1::CoordinatorEvent& event) override {
    owner_->PostToLoop([owner = owner_, event] { owner->handler_->OnCoordinatorEvent(event); });
  }

 private:
  InProcessCoordinator* owner_;
};

InProcessCoordinator::InProcessCoordinator(boost::asio::io_context& io, std::string node_id,
                                           CoordinatorCore::Config config, FileSystem* fs,
                                           CommitEngine* commit)
    : io_(io),
      node_id_(std::move(node_id)),
      nice_(config.nice),
      core_(std::move(config), fs, commit),
      worker_(1, nice_, "coord-report") {}

InProcessCoordinator::~InProcessCoordinator() { Stop(); }

Result<std::vector<std::string>> InProcessCoordinator::Recover() { return core_.Start(); }

Status InProcessCoordinator::Start(Handler* handler) {
  handler_ = handler;
  ckptd::v1::RegisterNodeRequest node;
  node.set_node_id(node_id_);
  node.set_instance("in-process");
  RETURN_IF_ERROR(core_.RegisterNode(node, "in-process").status(), "embedded coordinator");
  RETURN_IF_ERROR(core_.AttachNode(node_id_, std::make_shared<LoopSink>(this)),
                  "embedded coordinator");
  worker_.Start();
  return Status::Ok();
}

void InProcessCoordinator::Stop() {
  worker_.Stop();
  *alive_ = false;
  core_.Stop();
}

void InProcessCoordinator::PostToLoop(std::function<void()> f) {
  boost::asio::post(io_, [alive = alive_, f = std::move(f)] {
    if (*alive) f();
  });
}

void InProcessCoordinator::ReportRanks(ckptd::v1::ReportRanksRequest request) {
  request.set_node_id(node_id_);
  const std::string job = request.job();
  const uint64_t step = request.step();
  const bool posted = worker_.Post([this, request = std::move(request)] {
    auto resp = core_.ReportRanks(request);
    if (!resp.ok()) {
      spdlog::warn("embedded coordinator: report of job '{}' step {}: {}", request.job(),
                   request.step(), resp.status().ToString());
      return;
    }
    if (resp->has_decision()) {
      // The step already ended (e.g. a report after its abort): the same as its event.
      ckptd::v1::CoordinatorEvent e;
      *e.mutable_step() = resp->decision();
      PostToLoop([this, e] { handler_->OnCoordinatorEvent(e); });
    }
  });
  // Stopped: the core has stopped too, and the next start's recovery scan decides the step.
  if (!posted) {
    spdlog::warn("embedded coordinator: report of job '{}' step {} after it stopped: dropped", job,
                 step);
  }
}

void InProcessCoordinator::ReportRegistration(ckptd::v1::ReportRegistrationRequest request) {
  request.set_node_id(node_id_);
  const std::string job = request.job();
  const uint32_t rank = request.rank();
  const bool posted = worker_.Post([this, request = std::move(request)] {
    // The full layout always (no wire to save): the core never answers need_layout to it.
    if (auto st = core_.ReportRegistration(request); !st.ok()) {
      spdlog::warn("embedded coordinator: registration of job '{}' rank {}: {}", request.job(),
                   request.rank(), st.status().ToString());
    }
  });
  // Stopped: registrations live in memory only, and this memory goes with the process.
  if (!posted) {
    spdlog::warn("embedded coordinator: registration of job '{}' rank {} after it stopped: dropped",
                 job, rank);
  }
}

void InProcessCoordinator::Latest(const std::string& job, std::optional<RestoreQuery> restore_point,
                                  LatestDone done) {
  if (worker_.Post([this, job, restore_point, done]() mutable {
        auto latest = restore_point
                          ? core_.RestorePoint(job, restore_point->rank, restore_point->world_size,
                                               restore_point->session)
                          : core_.Latest(job);
        PostToLoop([done = std::move(done), latest = std::move(latest)]() mutable {
          done(std::move(latest));
        });
      })) {
    return;
  }
  // Stopped: the caller still hears, on the loop (not through PostToLoop: it drops everything
  // after Stop, and `done` does not reach the handler).
  boost::asio::post(
      io_, [done = std::move(done), job] { done(DaemonStopping("LATEST of job '" + job + "'")); });
}

void InProcessCoordinator::StepManifest(const std::string& job, uint64_t step,
                                        StepManifestDone done) {
  if (worker_.Post([this, job, step, done]() mutable {
        auto manifest = core_.StepManifest(job, step);
        PostToLoop([done = std::move(done), manifest = std::move(manifest)]() mutable {
          done(std::move(manifest));
        });
      })) {
    return;
  }
  boost::asio::post(io_, [done = std::move(done), job, step] {
    done(DaemonStopping("the manifest of job '" + job + "' step " + std::to_string(step)));
  });
}

}  // namespace ckpt
