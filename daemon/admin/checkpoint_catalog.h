// The committed checkpoints under a storage root, as the Admin API shows them: the list of a
// job's committed steps (and which are operator-pinned) and one step's MANIFEST. Shared by the node
// daemon and the coordinator (both read the same root). Synchronous file I/O: call it on a storage
// thread, never on a loop or in a gRPC reactor. Job names are validated first, so a request cannot
// leave the root.
#pragma once

#include <cstdint>
#include <string>

#include "ckptd/v1/admin.pb.h"
#include "common/file_system.h"
#include "common/status.h"
#include "daemon/coordinator/commit_engine.h"

namespace ckpt {

Result<ckptd::v1::ListCheckpointsResponse> ListCommittedCheckpoints(FileSystem* fs,
                                                                    const std::string& root,
                                                                    const std::string& job);

// kNotFound when the step is not committed (no MANIFEST).
Result<ckptd::v1::DescribeCheckpointResponse> DescribeCommittedCheckpoint(FileSystem* fs,
                                                                          const std::string& root,
                                                                          const std::string& job,
                                                                          uint64_t step);

// The operator operations (CommitEngine::PinForOperator, UnpinForOperator, DeleteCommitted)
// with the answers the Admin API gives; the same synchronous-I/O rule as above.
Result<ckptd::v1::PinCheckpointResponse> PinCheckpoint(CommitEngine* commit, const std::string& job,
                                                       uint64_t step);
Result<ckptd::v1::UnpinCheckpointResponse> UnpinCheckpoint(CommitEngine* commit,
                                                           const std::string& job, uint64_t step);
Result<ckptd::v1::DeleteCheckpointResponse> DeleteCheckpoint(CommitEngine* commit,
                                                             const std::string& job, uint64_t step);

}  // namespace ckpt
