#include "daemon/node_manifest_builder.h"

#include <algorithm>
#include <map>
#include <set>

#include "common/manifest_io.h"
#include "common/step_layout.h"

namespace ckpt {
namespace {

void DescribeTensor(const RegisteredTensor& t, ckptd::v1::SkippedShard* k, uint32_t rank) {
  k->set_name(t.name);
  k->set_dtype(std::string(t.dtype.name));
  for (uint64_t d : t.geometry.global_shape()) k->add_global_shape(d);
  *k->mutable_geometry() = GeometryToProto(t.geometry);
  k->set_rank(rank);
}

}  // namespace

Result<ckptd::v1::NodeManifest> BuildNodeManifest(const std::string& job, uint64_t step,
                                                  uint32_t world_size, const std::string& node_id,
                                                  const std::vector<PersistedRank>& ranks) {
  ckptd::v1::NodeManifest m;
  m.set_format_version(kFormatVersion);
  m.set_job(job);
  m.set_step(step);
  m.set_world_size(world_size);
  m.set_node_id(node_id);
  std::map<std::string, ckptd::v1::TensorEntry*> by_name;
  std::map<std::string, uint32_t> first_rank;
  for (const PersistedRank& pr : ranks) {
    const uint32_t rank = pr.rank;
    const CaptureJob& capture = *pr.capture;
    const CapturePlan& plan = *capture.plan;
    for (size_t i = 0; i < plan.tensors.size(); ++i) {
      const RegisteredTensor& t = plan.tensors[i];
      auto [it, inserted] = by_name.try_emplace(t.name, nullptr);
      if (inserted) {
        it->second = m.add_tensors();
        it->second->set_name(t.name);
        it->second->set_dtype(std::string(t.dtype.name));
        it->second->set_partial(t.partial);
        for (uint64_t d : t.geometry.global_shape()) it->second->add_global_shape(d);
        first_rank[t.name] = rank;
      } else {
        const auto& e = *it->second;
        const Shape& shape = t.geometry.global_shape();
        if (e.dtype() != t.dtype.name ||
            !std::equal(e.global_shape().begin(), e.global_shape().end(), shape.begin(),
                        shape.end())) {
          return InvalidArgument("tensor '" + t.name + "' is registered as " + e.dtype() +
                                 " by rank " + std::to_string(first_rank[t.name]) + " but as " +
                                 std::string(t.dtype.name) + " " + t.geometry.ToString() +
                                 " by rank " + std::to_string(rank) +
                                 " (dtype and global shape must agree)");
        }
        if (t.partial) it->second->set_partial(true);
      }
      auto* shard = it->second->add_shards();
      *shard->mutable_geometry() = GeometryToProto(t.geometry);
      shard->set_file(DataFileName(rank));
      shard->set_offset(plan.layout.shard_offsets[i]);
      shard->set_length(t.bytes());
      shard->set_chunk_size(plan.layout.checksum_chunk);
      for (uint64_t c : capture.checksums[i]) shard->add_chunk_xxh3(c);
      shard->set_writer_rank(rank);
    }
    for (const RegisteredTensor& t : plan.skipped) DescribeTensor(t, m.add_skipped(), rank);
    if (!plan.skipped.empty() && plan.skipped_under != 0) {
      auto* under = m.add_skipped_under();
      under->set_rank(rank);
      under->set_registration_id(plan.skipped_under);
      under->set_shards(static_cast<uint32_t>(plan.skipped.size()));
    }
    auto* r = m.add_ranks();
    r->set_rank(rank);
    r->set_extra(pr.extra);
    r->set_node_id(node_id);
  }
  return m;
}

ckptd::v1::NodeManifest NodeManifestForReport(const ckptd::v1::NodeManifest& m,
                                              SkippedShards skips) {
  ckptd::v1::NodeManifest report;
  report.set_format_version(m.format_version());
  report.set_job(m.job());
  report.set_step(m.step());
  report.set_world_size(m.world_size());
  report.set_node_id(m.node_id());
  *report.mutable_tensors() = m.tensors();
  *report.mutable_ranks() = m.ranks();
  if (skips == SkippedShards::kListed) {
    *report.mutable_skipped() = m.skipped();
    return report;
  }
  *report.mutable_skipped_under() = m.skipped_under();
  // A rank that skipped under an older coordinator's plan names no registration: its list stays.
  std::set<uint32_t> named;
  for (const auto& under : m.skipped_under()) named.insert(under.rank());
  for (const auto& k : m.skipped()) {
    if (named.count(k.rank()) == 0) *report.add_skipped() = k;
  }
  return report;
}

}  // namespace ckpt
