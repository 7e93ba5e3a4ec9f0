// The commit primitive: a small file replaced atomically and durably.
// Writes `path`.tmp, fdatasyncs it, renames it over `path`, then fsyncs the directory. A crash at
// any point leaves either the old file (or none) or the complete new one — never a torn one.
#pragma once

#include <string>
#include <string_view>

#include "common/file_system.h"

namespace ckpt {

Status WriteFileAtomically(FileSystem* fs, const std::string& path, std::string_view contents);

}  // namespace ckpt
