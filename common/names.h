// Validation of the names that reach file paths or logs: job ids and tensor names.
//
// Job ids become directory names under the storage root, so they must be a single safe path
// component: 1–128 bytes of [A-Za-z0-9._-], not "." or "..". Tensor names are stored only
// inside manifests, never as paths, so they may hold any printable UTF-8 except control
// characters, up to 1024 bytes. Errors quote the offending name (escaped) and say why.
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"

namespace ckpt {

inline constexpr size_t kMaxJobNameLength = 128;
inline constexpr size_t kMaxTensorNameLength = 1024;
inline constexpr size_t kMaxNodeIdLength = 128;

Status ValidateJobName(std::string_view job);
Status ValidateTensorName(std::string_view name);
// Node ids name files (node-<id>.nmf): same rules as job ids.
Status ValidateNodeId(std::string_view node_id);
// A data file of a step directory as other processes name it (the data plane, a load plan):
// 1–128 bytes of [A-Za-z0-9._-], not starting with '.', ending in ".data" — one component
// inside the step directory, never a path out of it.
inline constexpr size_t kMaxDataFileNameLength = 128;
Status ValidateDataFileName(std::string_view file);

// The name with control and non-ASCII bytes escaped as \xNN, cut to 80 bytes: safe for logs.
std::string EscapeForLog(std::string_view s);

}  // namespace ckpt
