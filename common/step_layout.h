// Names on disk (docs/design.md §5.1):
//   <root>/<job>/LATEST                      decimal step of the newest committed checkpoint
//   <root>/<job>/step-<step:010d>/MANIFEST   global manifest; exists iff the step is committed
//   <root>/<job>/step-<step:010d>/rank-<rank:05d>.data     raw tensor bytes of one rank
//   <root>/<job>/step-<step:010d>/node-<node id>.nmf       node manifest
// Temporary files end in ".tmp" and never count.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/file_system.h"

namespace ckpt {

inline constexpr std::string_view kManifestFileName = "MANIFEST";
inline constexpr std::string_view kLatestFileName = "LATEST";
// The operator pin's marker in a step directory: present = pinned (retention keeps the step).
// Its contents (when and by what it was pinned) are for people; only its presence counts.
inline constexpr std::string_view kPinnedFileName = "PINNED";

std::string StepDirName(uint64_t step);  // "step-0000000042"
std::optional<uint64_t> ParseStepDirName(std::string_view name);
std::string JobDir(const std::string& root, std::string_view job);
std::string StepDir(const std::string& root, std::string_view job, uint64_t step);
std::string DataFileName(uint32_t rank);                     // "rank-00003.data"
std::string NodeManifestFileName(std::string_view node_id);  // "node-<id>.nmf"

// Steps of a job that have a MANIFEST, ascending. An absent job directory gives {}.
Result<std::vector<uint64_t>> ListCommittedSteps(FileSystem* fs, const std::string& job_dir);
// Whether the step directory holds the operator pin's marker.
Result<bool> IsPinnedStep(FileSystem* fs, const std::string& step_dir);
// Step directories without a MANIFEST (in flight, or leftovers of a crash), ascending.
Result<std::vector<uint64_t>> ListUncommittedSteps(FileSystem* fs, const std::string& job_dir);
// The step LATEST names, if LATEST exists and names a committed step; otherwise the newest
// committed step; nullopt when there is none.
Result<std::optional<uint64_t>> ResolveLatest(FileSystem* fs, const std::string& job_dir);

}  // namespace ckpt
