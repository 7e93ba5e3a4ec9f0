#include "daemon/writer_plan_filter.h"

#include "common/logging.h"
#include "common/manifest_io.h"

namespace ckpt {

WriterPlanFilter::WriterPlanFilter(std::string job, LayoutOptions layout,
                                   uint64_t* next_registration_id)
    : job_(std::move(job)), layout_(layout), next_registration_id_(next_registration_id) {}

std::optional<ckptd::v1::ReportRegistrationRequest> WriterPlanFilter::Register(
    uint32_t rank, uint32_t world_size, uint64_t session_id,
    std::shared_ptr<const CapturePlan> plan) {
  Registration& reg = registered_[rank];
  if (reg.plan == plan && reg.world_size == world_size && reg.session_id == session_id) {
    return std::nullopt;
  }
  reg = Registration{world_size, std::move(plan), (*next_registration_id_)++, session_id};
  return RegistrationReport(rank, reg);
}

ckptd::v1::ReportRegistrationRequest WriterPlanFilter::RegistrationReport(
    uint32_t rank, const Registration& reg) const {
  ckptd::v1::ReportRegistrationRequest req;
  req.set_job(job_);
  req.set_rank(rank);
  req.set_world_size(reg.world_size);
  req.set_registration_id(reg.id);
  for (const RegisteredTensor& t : reg.plan->tensors) {
    auto* k = req.add_shards();
    k->set_name(t.name);
    k->set_dtype(std::string(t.dtype.name));
    for (uint64_t d : t.geometry.global_shape()) k->add_global_shape(d);
    *k->mutable_geometry() = GeometryToProto(t.geometry);
    k->set_bytes(t.bytes());
  }
  return req;
}

const WriterPlanFilter::Skips* WriterPlanFilter::SkipsInForce(uint32_t rank) const {
  auto reg = registered_.find(rank);
  auto skips = skips_.find(rank);
  // Skips computed from another registration (this rank's trainer registered anew since) do
  // not apply: the rank writes everything until the plan for this registration arrives.
  if (reg == registered_.end() || skips == skips_.end() ||
      (!skips->second.write_list && skips->second.names.empty()) ||
      skips->second.registration_id != reg->second.id) {
    return nullptr;
  }
  return &skips->second;
}

std::set<std::string> WriterPlanFilter::SkipsOf(uint32_t rank) const {
  const Skips* skips = SkipsInForce(rank);
  std::set<std::string> out;
  if (skips == nullptr) return out;
  for (const RegisteredTensor& t : registered_.at(rank).plan->tensors) {
    if (skips->Skipped(t.name)) out.insert(t.name);
  }
  return out;
}

Result<std::shared_ptr<const CapturePlan>> WriterPlanFilter::Apply(
    uint32_t rank, const std::shared_ptr<const CapturePlan>& plan) {
  const Skips* skips = SkipsInForce(rank);
  auto reg = registered_.find(rank);
  if (skips == nullptr || reg->second.plan != plan) return plan;
  Subset& cached = subsets_[rank];
  if (cached.subset && cached.registered == plan && cached.plan_version == plan_version_) {
    return cached.subset;
  }
  auto subset = std::make_shared<CapturePlan>();
  std::vector<uint64_t> sizes;
  for (const RegisteredTensor& t : plan->tensors) {
    if (skips->Skipped(t.name)) {
      subset->skipped.push_back(t);
      continue;
    }
    subset->tensors.push_back(t);
    sizes.push_back(t.bytes());
    subset->total_bytes += t.bytes();
  }
  ASSIGN_OR_RETURN(subset->layout, PlanDataFile(sizes, layout_));
  // Named in the node manifest's reports instead of the skipped list, where the coordinator
  // checks it; reg->second.id == skips->registration_id (SkipsInForce).
  if (skips->by_registration) subset->skipped_under = reg->second.id;
  subset->fingerprint = plan->fingerprint + "|writer plan " + std::to_string(plan_version_);
  spdlog::info("job '{}' rank {}: writes {} of {} registered tensors ({} of {} bytes; writer plan)",
               job_, rank, subset->tensors.size(), plan->tensors.size(), subset->total_bytes,
               plan->total_bytes);
  cached = Subset{plan, plan_version_, subset};
  return cached.subset;
}

bool WriterPlanFilter::Withdraw(uint32_t rank, uint64_t session_id,
                                ckptd::v1::ReportRegistrationRequest* withdrawal) {
  auto reg = registered_.find(rank);
  if (reg == registered_.end() || reg->second.session_id != session_id) return false;
  withdrawal->set_world_size(reg->second.world_size);
  withdrawal->set_registration_id(reg->second.id);
  registered_.erase(reg);
  subsets_.erase(rank);
  return true;
}

void WriterPlanFilter::RememberWithdrawal(uint32_t rank,
                                          ckptd::v1::ReportRegistrationRequest withdrawal) {
  withdrawals_[rank] = std::move(withdrawal);
}

void WriterPlanFilter::OnPlan(const ckptd::v1::WriterPlan& plan) {
  ++plan_version_;
  skips_.clear();
  subsets_.clear();
  for (const auto& r : plan.ranks()) {
    Skips& k = skips_[r.rank()];
    k.registration_id = r.registration_id();
    k.write_list = r.write_listed();
    k.by_registration = plan.checks_skipped_under();
    if (k.write_list) {
      k.names.insert(r.write().begin(), r.write().end());
    } else {
      k.names.insert(r.skip().begin(), r.skip().end());
    }
  }
  spdlog::info("job '{}': writer plan v{} from the coordinator ({} ranks here)", job_,
               plan.version(), plan.ranks_size());
}

std::vector<ckptd::v1::ReportRegistrationRequest> WriterPlanFilter::OnReconnect() {
  skips_.clear();
  subsets_.clear();
  std::vector<ckptd::v1::ReportRegistrationRequest> reports;
  for (const auto& [rank, w] : withdrawals_) reports.push_back(w);
  for (const auto& [rank, reg] : registered_) {
    if (reg.plan) reports.push_back(RegistrationReport(rank, reg));
  }
  return reports;
}

}  // namespace ckpt
