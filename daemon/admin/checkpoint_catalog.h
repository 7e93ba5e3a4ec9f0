// The committed checkpoints under a storage root, as the Admin API shows them: the list of a
// job's committed steps and one step's MANIFEST. Shared by the node daemon and the coordinator
// (both read the same root). Synchronous file I/O: call it on a storage thread, never on a loop
// or in a gRPC reactor. Job names are validated first, so a request cannot leave the root.
#pragma once

#include <cstdint>
#include <string>

#include "ckptd/v1/admin.pb.h"
#include "common/file_system.h"
#include "common/status.h"

namespace ckpt {

Result<ckptd::v1::ListCheckpointsResponse> ListCommittedCheckpoints(FileSystem* fs,
                                                                    const std::string& root,
                                                                    const std::string& job);

// kNotFound when the step is not committed (no MANIFEST).
Result<ckptd::v1::DescribeCheckpointResponse> DescribeCommittedCheckpoint(FileSystem* fs,
                                                                          const std::string& root,
                                                                          const std::string& job,
                                                                          uint64_t step);

}  // namespace ckpt
