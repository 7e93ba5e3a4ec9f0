// Writing a committed checkpoint without a daemon: what ckptd.offline.from_torch_save uses to turn
// a torch.save file into a step a daemon can load.
//
// The result is laid out exactly as a daemon lays out one rank's save: one data file
// (rank-00000.data) planned by PlanDataFile and written slot by slot through DataFileWriter, with
// zero padding and an XXH3 per checksum piece; a MANIFEST with world size 1, validated and checked
// for coverage like a commit; then LATEST. The durability order is the daemon's commit order:
// data file fdatasync'd, step directory synced, MANIFEST written to a temp file, synced, renamed
// and the directory synced (the commit marker, last of the step's files), job directory synced,
// LATEST moved forward. A crash before the MANIFEST rename leaves an uncommitted directory, which
// readers ignore and a daemon removes at start.
//
// Steps are never written twice (proto/README.md §1.2): a step at or below the job's newest
// committed step is refused, and so is a step whose directory exists without a MANIFEST (another
// writer's save in flight, or a leftover that a daemon has not removed yet).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "common/file_system.h"
#include "common/geometry.h"

namespace ckpt::python {

// One whole tensor in memory: `nbytes` bytes at `data`, row-major, little-endian.
struct OfflineTensor {
  std::string name;
  std::string dtype;  // ckptd name: "float32", "bfloat16", ...
  Shape shape;
  const std::byte* data = nullptr;
  uint64_t nbytes = 0;
};

// Writes <root>/<job>/step-<step>/ with every tensor stored whole by rank 0, and `extra` as rank
// 0's extra blob; `writer` goes into the manifest's writer field. On an error before the commit
// the step directory is removed again.
Status WriteOfflineCheckpoint(FileSystem* fs, const std::string& root, const std::string& job,
                              uint64_t step, std::span<const OfflineTensor> tensors,
                              const std::string& extra, const std::string& writer);

}  // namespace ckpt::python
