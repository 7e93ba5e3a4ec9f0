// The node manifest of a step: what this node's persisted ranks wrote — for each tensor its
// dtype, global shape and the shards in each rank's data file (offset, length, chunk checksums)
// — and what each rank left to another rank by the writer plan (NodeManifest.skipped, which the
// commit checks someone wrote). The coordinator merges every node's manifest into the step's
// MANIFEST (common/manifest_io.h).
//
// A pure function of the ranks' finished captures: no I/O, no clock, no daemon state. The node
// state runs it on the storage thread, since its cost grows with the number of tensors (tens of
// milliseconds for 10,000), which must not hold up the loop's replies.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ckptd/v1/manifest.pb.h"
#include "common/status.h"
#include "daemon/capture_job.h"

namespace ckpt {

// One rank of the step whose data file is written and synced (its capture job finished).
struct PersistedRank {
  uint32_t rank = 0;
  std::shared_ptr<const CaptureJob> capture;
  std::string extra;  // the trainer's opaque extra state (SaveRequest.extra)
};

// Fails, naming the tensor and both ranks, when two ranks register one tensor with different
// dtypes or global shapes.
// What the coordinator hears of `m` (ReportRanksRequest.node_manifest): all of it but the
// skipped shards of ranks that `skipped_under` names by registration instead (under a plan from
// a coordinator that checks them so: WriterPlan.checks_skipped_under). At 16,384 nodes of 8
// ranks × 2,000 tensors the lists would be ~32 M entries per step, sent again with each
// growing report; the file keeps them for the coordinator's recovery scan.
// `SkippedShards::kListed` keeps every list instead: a memory-only step has no file, and a
// coordinator that restarted may hear the step before it holds the registrations again. (Only
// the memory-only steps a node held at a reconnect are reported so: at most the newest two.)
enum class SkippedShards { kUnderRegistration, kListed };
ckptd::v1::NodeManifest NodeManifestForReport(
    const ckptd::v1::NodeManifest& m, SkippedShards skips = SkippedShards::kUnderRegistration);

Result<ckptd::v1::NodeManifest> BuildNodeManifest(const std::string& job, uint64_t step,
                                                  uint32_t world_size, const std::string& node_id,
                                                  const std::vector<PersistedRank>& ranks);

}  // namespace ckpt
