// InProcessCoordinator: the single-node default ("embedded coordinator") — CoordinatorCore run
// inside the daemon, behind the same CoordinatorPort as the gRPC link to ckpt-coordinator.
// There is one implementation of every commit rule (step order, timeouts, missing ranks, the
// writer plan, the commit itself, recovery, restore points), whichever way a daemon runs; the
// node state (node_state.h) only reports and applies decisions.
//
// Threads: calls arrive on the daemon's loop and are run, in order, on this adapter's own
// thread (the core reads the storage root for some of them: never on the loop), which yields to
// the loop and the trainers like the core's commit thread (CoordinatorCore::Config::nice). The
// core's events and answers are posted back onto the loop. The core commits on its own commit
// thread through the daemon's CommitEngine (shared, so the pins of loads keep retention away).
// Start runs the core's recovery scan of the storage root before anything is served: a step
// whose node manifest covers every rank is committed, any other leftover removed.
#pragma once

#include <boost/asio/io_context.hpp>
#include <memory>
#include <string>
#include <vector>

#include "daemon/coordinator/coordinator_core.h"
#include "daemon/coordinator/coordinator_port.h"
#include "daemon/task_pool.h"

namespace ckpt {

class InProcessCoordinator final : public CoordinatorPort {
 public:
  InProcessCoordinator(boost::asio::io_context& io, std::string node_id,
                       CoordinatorCore::Config config, FileSystem* fs, CommitEngine* commit);
  ~InProcessCoordinator() override;

  // The recovery scan (one line per step it committed or removed).
  Result<std::vector<std::string>> Recover();
  // Registers this node and attaches `handler` (called on the loop; must outlive Stop()).
  Status Start(Handler* handler);
  // Runs what was reported until now, then stops the core (its commit in flight completes).
  void Stop();

  // CoordinatorPort
  void ReportRanks(ckptd::v1::ReportRanksRequest request) override;
  void ReportRegistration(ckptd::v1::ReportRegistrationRequest request) override;
  void Latest(const std::string& job, std::optional<RestoreQuery> restore_point,
              LatestDone done) override;
  void StepManifest(const std::string& job, uint64_t step, StepManifestDone done) override;

 private:
  class LoopSink;
  void PostToLoop(std::function<void()> f);

  boost::asio::io_context& io_;
  const std::string node_id_;
  const int nice_;  // CoordinatorCore::Config::nice, for worker_ too
  CoordinatorCore core_;
  TaskPool worker_;
  Handler* handler_ = nullptr;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);  // guards posts after Stop
};

}  // namespace ckpt
