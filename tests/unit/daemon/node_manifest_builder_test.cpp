// BuildNodeManifest (daemon/node_manifest_builder.h): the node manifest lists each tensor once
// with every persisted rank's shard (file, offset, length, checksums, writer), each rank's extra
// state, and what each rank skipped by the writer plan; ranks that disagree on a tensor's dtype
// or global shape fail it, naming both.
#include "daemon/node_manifest_builder.h"

#include <string>
#include <vector>

#include "common/step_layout.h"
#include "tests/test_util.h"
#include "tests/unit/daemon/test_registrations.h"

namespace ckpt {
namespace {

using Catch::Matchers::Contains;

// A finished capture of `plan`, with a distinct checksum per chunk.
std::shared_ptr<const CaptureJob> Captured(uint32_t rank, std::shared_ptr<const CapturePlan> plan) {
  auto job = std::make_shared<CaptureJob>();
  job->rank = rank;
  job->plan = plan;
  for (size_t i = 0; i < plan->tensors.size(); ++i) {
    job->checksums.push_back({uint64_t{rank} * 1000 + i});
  }
  return job;
}

TEST_CASE("node manifest: every persisted rank's shards, extras and skips",
          "[daemon][node_manifest]") {
  TestRegistrations regs;
  auto whole = regs.Plan({"w", "bias"});
  // Rank 1 writes only "w": "bias" is left to rank 0 by the writer plan.
  auto cut = std::make_shared<CapturePlan>(*regs.Plan({"w", "bias"}));
  cut->skipped = {cut->tensors[1]};
  cut->skipped_under = 77;
  cut->tensors.erase(cut->tensors.begin() + 1, cut->tensors.end());
  cut->layout.shard_offsets.resize(1);

  auto m =
      BuildNodeManifest("job", 42, 4, "node-a",
                        {{0, Captured(0, whole), "extra-0"}, {1, Captured(1, cut), "extra-1"}});
  REQUIRE(m.ok());
  CHECK(m->job() == "job");
  CHECK(m->step() == 42);
  CHECK(m->world_size() == 4);
  CHECK(m->node_id() == "node-a");
  REQUIRE(m->tensors_size() == 2);
  const auto& w = m->tensors(0);
  CHECK(w.name() == "w");
  CHECK(w.dtype() == "float32");
  REQUIRE(w.shards_size() == 2);  // both ranks wrote it
  CHECK(w.shards(0).file() == DataFileName(0));
  CHECK(w.shards(1).file() == DataFileName(1));
  CHECK(w.shards(1).writer_rank() == 1);
  CHECK(w.shards(1).length() == 4096);
  REQUIRE(w.shards(1).chunk_xxh3_size() == 1);
  CHECK(w.shards(1).chunk_xxh3(0) == 1000);
  const auto& bias = m->tensors(1);
  REQUIRE(bias.shards_size() == 1);
  CHECK(bias.shards(0).writer_rank() == 0);
  CHECK(bias.shards(0).offset() == whole->layout.shard_offsets[1]);
  CHECK(bias.shards(0).chunk_xxh3(0) == 1);
  REQUIRE(m->skipped_size() == 1);
  CHECK(m->skipped(0).name() == "bias");
  CHECK(m->skipped(0).rank() == 1);
  // Rank 1 names the registration it skipped under; rank 0 skipped nothing.
  REQUIRE(m->skipped_under_size() == 1);
  CHECK(m->skipped_under(0).rank() == 1);
  CHECK(m->skipped_under(0).registration_id() == 77);
  CHECK(m->skipped_under(0).shards() == 1);
  REQUIRE(m->ranks_size() == 2);
  CHECK(m->ranks(0).extra() == "extra-0");
  CHECK(m->ranks(1).extra() == "extra-1");
  CHECK(m->ranks(1).node_id() == "node-a");

  // The coordinator hears everything but the skipped list: O(ranks), not O(ranks × tensors).
  const ckptd::v1::NodeManifest report = NodeManifestForReport(*m);
  CHECK(report.skipped_size() == 0);
  REQUIRE(report.skipped_under_size() == 1);
  CHECK(report.skipped_under(0).registration_id() == 77);
  ckptd::v1::NodeManifest without = *m;
  without.clear_skipped();
  CHECK(report.SerializeAsString() == without.SerializeAsString());
  // Listed (a memory-only step's report after a reconnect): the lists, and no registration.
  const ckptd::v1::NodeManifest listed = NodeManifestForReport(*m, SkippedShards::kListed);
  CHECK(listed.skipped_under_size() == 0);
  REQUIRE(listed.skipped_size() == 1);
  CHECK(listed.skipped(0).name() == "bias");
  CHECK(listed.skipped(0).rank() == 1);
  CHECK(listed.ranks_size() == 2);

  // Under an older coordinator's plan a rank names no registration, and its list is reported.
  auto old_plan = std::make_shared<CapturePlan>(*cut);
  old_plan->skipped_under = 0;
  auto mixed = BuildNodeManifest("job", 42, 4, "node-a",
                                 {{1, Captured(1, cut), ""}, {2, Captured(2, old_plan), ""}});
  REQUIRE(mixed.ok());
  CHECK(mixed->skipped_size() == 2);
  const ckptd::v1::NodeManifest mixed_report = NodeManifestForReport(*mixed);
  REQUIRE(mixed_report.skipped_under_size() == 1);
  CHECK(mixed_report.skipped_under(0).rank() == 1);
  REQUIRE(mixed_report.skipped_size() == 1);
  CHECK(mixed_report.skipped(0).rank() == 2);
}

TEST_CASE("node manifest: ranks disagreeing on a tensor's dtype fail it, naming both",
          "[daemon][node_manifest]") {
  TestRegistrations regs;
  auto plan0 = regs.Plan({"w"});
  auto plan1 = std::make_shared<CapturePlan>(*regs.Plan({"w"}));
  plan1->tensors[0].dtype = *LookupDType("int32");
  auto m = BuildNodeManifest("job", 1, 2, "node-a",
                             {{0, Captured(0, plan0), ""}, {1, Captured(1, plan1), ""}});
  REQUIRE_FALSE(m.ok());
  CHECK(m.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(m.status().message(), Contains("'w'") && Contains("rank 0") && Contains("rank 1"));
}

}  // namespace
}  // namespace ckpt
