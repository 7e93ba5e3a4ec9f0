// WriterPlanFilter: one job's side, on this node, of the coordinator's writer plan — the plan
// under which only one rank writes each exact replica (coordinator/writer_plan.h).
//
// The rule it owns: a rank applies skips only to the registration they were computed from.
//   * Register: each rank's registration (the capture plan of its tensors) is reported to the
//     coordinator with a fresh id whenever it changes — other tensors, another world size, or
//     another trainer session (a restarted trainer registers anew even with the same tensors).
//   * OnPlan: the coordinator pushes per rank the tensors it writes (older coordinators: the
//     ones it skips), each tagged with the registration id it was computed from.
//   * Apply: a save writes its registered plan cut down by the skips only when the tags match;
//     otherwise, and with no plan at all, the rank writes everything (the merge keeps one copy).
//     The cut-down plan has its own data-file layout and is cached until plan or registration
//     change.
//   * Withdraw: a rank's trainer session ended; its registration no longer holds, and the
//     coordinator revokes the plan until the rank registers again.
//   * OnReconnect: a restarted coordinator plans anew, maybe differently, so skips are dropped
//     until its plan arrives, and what it must know is reported again.
//
// Plain data on the node state's loop: no locks, no I/O; returns the reports for the caller to
// send.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "ckptd/v1/coordinator.pb.h"
#include "common/data_layout.h"
#include "common/status.h"
#include "daemon/capture_plan.h"

namespace ckpt {

class WriterPlanFilter {
 public:
  // `next_registration_id`: the daemon's id source (ids never repeat across its jobs); not
  // owned, outlives this.
  WriterPlanFilter(std::string job, LayoutOptions layout, uint64_t* next_registration_id);

  // The rank's registration for a save. Returns the report to send when it is new or changed.
  std::optional<ckptd::v1::ReportRegistrationRequest> Register(
      uint32_t rank, uint32_t world_size, uint64_t session_id,
      std::shared_ptr<const CapturePlan> plan);

  // What `rank` writes of `plan` (its current registration): all of it, or the subset the plan
  // leaves it.
  Result<std::shared_ptr<const CapturePlan>> Apply(uint32_t rank,
                                                   const std::shared_ptr<const CapturePlan>& plan);

  // The trainer session `session_id` of `rank` ended. If the rank's registration was that
  // session's, it is forgotten and `withdrawal` gets its world size and id; returns whether.
  bool Withdraw(uint32_t rank, uint64_t session_id,
                ckptd::v1::ReportRegistrationRequest* withdrawal);
  // A withdrawal sent for `rank` (registration, restore point or both), sent again after a
  // reconnect: the coordinator ignores one that no longer matches.
  void RememberWithdrawal(uint32_t rank, ckptd::v1::ReportRegistrationRequest withdrawal);

  // The coordinator's plan for this job's ranks on this node; replaces the previous one.
  void OnPlan(const ckptd::v1::WriterPlan& plan);

  // The coordinator (re)connected: drops every skip and returns what to report again — each
  // rank's last withdrawal, then each registration.
  std::vector<ckptd::v1::ReportRegistrationRequest> OnReconnect();

  // The skips in force for `rank` (those of its current registration), for tests and status.
  std::set<std::string> SkipsOf(uint32_t rank) const;

 private:
  struct Registration {
    uint32_t world_size = 0;
    std::shared_ptr<const CapturePlan> plan;
    uint64_t id = 0;          // ReportRegistrationRequest.registration_id
    uint64_t session_id = 0;  // of the trainer that registered it
  };
  struct Skips {
    uint64_t registration_id = 0;  // the registration they were computed from
    // The plan lists what the rank writes (`names` are written, everything else skipped), or,
    // from an older coordinator, what it skips (`names` are skipped).
    bool write_list = false;
    // The coordinator checks skips by registration (WriterPlan.checks_skipped_under).
    bool by_registration = false;
    std::set<std::string> names;
    bool Skipped(const std::string& name) const { return (names.count(name) != 0) != write_list; }
  };
  struct Subset {
    std::shared_ptr<const CapturePlan> registered;
    uint64_t plan_version = 0;
    std::shared_ptr<const CapturePlan> subset;
  };
  ckptd::v1::ReportRegistrationRequest RegistrationReport(uint32_t rank,
                                                          const Registration& reg) const;
  const Skips* SkipsInForce(uint32_t rank) const;

  const std::string job_;
  const LayoutOptions layout_;
  uint64_t* next_registration_id_;
  std::map<uint32_t, Registration> registered_;
  // A local count of plans received (a restarted coordinator numbers its plans anew).
  uint64_t plan_version_ = 0;
  std::map<uint32_t, Skips> skips_;
  std::map<uint32_t, Subset> subsets_;
  std::map<uint32_t, ckptd::v1::ReportRegistrationRequest> withdrawals_;
};

}  // namespace ckpt
