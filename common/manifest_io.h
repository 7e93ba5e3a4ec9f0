// Manifest files: encoding, validation, conversion to geometry (merging node manifests is in
// common/manifest_merge.h).
//
// A manifest file (MANIFEST, node-*.nmf) is a 32-byte header followed by a protobuf payload:
//   bytes 0..7   magic "CKPTMAN\0" (MANIFEST) or "CKPTNMF\0" (node manifest)
//   bytes 8..11  format version, u32 little-endian (1)
//   bytes 12..15 reserved, zero
//   bytes 16..23 payload length, u64 little-endian
//   bytes 24..31 XXH3-64 of the payload, u64 little-endian
// A truncated or altered file is detected before any field is trusted.
#pragma once

#include <string>
#include <string_view>

#include "ckptd/v1/manifest.pb.h"
#include "common/file_system.h"
#include "common/geometry.h"

namespace ckpt {

inline constexpr uint32_t kFormatVersion = 1;

std::string EncodeManifest(const ckptd::v1::Manifest& m);
std::string EncodeNodeManifest(const ckptd::v1::NodeManifest& m);
Result<ckptd::v1::Manifest> DecodeManifest(std::string_view bytes, std::string_view what);
Result<ckptd::v1::NodeManifest> DecodeNodeManifest(std::string_view bytes, std::string_view what);

// Reads <step_dir>/MANIFEST, decodes and validates it. kNotFound when the step has no MANIFEST
// (it is not committed), kDataLoss when the file is damaged.
Result<ckptd::v1::Manifest> ReadManifest(FileSystem* fs, const std::string& step_dir);
Result<ckptd::v1::NodeManifest> ReadNodeManifest(FileSystem* fs, const std::string& path);

// Checks everything a reader relies on: known version and dtypes, valid names, geometry inside
// the global shape, length == numel * element size, 4 KiB-aligned offsets, checksum counts,
// no partly overlapping shards, rank numbers below world_size. Messages name the tensor.
Status ValidateManifest(const ckptd::v1::Manifest& m);

// What a commit requires beyond ValidateManifest: every tensor's stored shards cover its global
// shape (CheckCoverage), except tensors marked partial (saved in part on purpose). kNotFound naming
// the tensor, the first uncovered coordinates and the ranks that saved it. Not a reader's check: a
// reader may load what a checkpoint does hold.
Status CheckManifestCoverage(const ckptd::v1::Manifest& m);
// ValidateManifest and CheckManifestCoverage in one pass, each shard's geometry converted once:
// what a commit checks.
Status ValidateManifestForCommit(const ckptd::v1::Manifest& m);

Result<ShardGeometry> GeometryFromProto(const ckptd::v1::ShardGeometry& g,
                                        const Shape& global_shape);
ckptd::v1::ShardGeometry GeometryToProto(const ShardGeometry& g);

// The newest committed step of a job whose MANIFEST reads and validates: LATEST (or the newest
// MANIFEST), falling back step by step past damaged ones (logged, and appended to `damaged`
// when given). What latest() and load(step=None) restore: a name that restores. nullopt when no
// committed step reads.
Result<std::optional<uint64_t>> ResolveReadableLatest(FileSystem* fs, const std::string& job_dir,
                                                      std::vector<uint64_t>* damaged = nullptr);

}  // namespace ckpt
