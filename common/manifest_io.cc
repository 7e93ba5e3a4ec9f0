#include "common/manifest_io.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

#include "common/checksum.h"
#include "common/data_layout.h"
#include "common/dtype.h"
#include "common/logging.h"
#include "common/names.h"
#include "common/step_layout.h"

namespace ckpt {
namespace {

constexpr size_t kHeaderSize = 32;
constexpr char kManifestMagic[8] = {'C', 'K', 'P', 'T', 'M', 'A', 'N', '\0'};
constexpr char kNodeMagic[8] = {'C', 'K', 'P', 'T', 'N', 'M', 'F', '\0'};
// A manifest larger than this is refused before parsing (1,024 ranks × 100,000 tensors of
// metadata fit well below it).
constexpr uint64_t kMaxManifestBytes = 4ull << 30;

void PutLe(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t GetLe(std::string_view in, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) {
    v |= uint64_t{static_cast<unsigned char>(in[at + i])} << (8 * i);
  }
  return v;
}

std::string Encode(const char (&magic)[8], const google::protobuf::MessageLite& m) {
  std::string payload;
  m.SerializeToString(&payload);
  std::string out;
  out.reserve(kHeaderSize + payload.size());
  out.append(magic, 8);
  PutLe(out, kFormatVersion, 4);
  PutLe(out, 0, 4);
  PutLe(out, payload.size(), 8);
  PutLe(out, Xxh3(payload.data(), payload.size()), 8);
  out += payload;
  return out;
}

Status Decode(const char (&magic)[8], std::string_view bytes, std::string_view what,
              google::protobuf::MessageLite* m) {
  if (bytes.size() < kHeaderSize) {
    return DataLoss(std::string(what) + ": " + std::to_string(bytes.size()) +
                    " bytes is shorter than the 32-byte header (truncated?)");
  }
  if (std::memcmp(bytes.data(), magic, 8) != 0) {
    return DataLoss(std::string(what) + ": bad magic (not a ckptd manifest)");
  }
  const uint64_t version = GetLe(bytes, 8, 4);
  if (version == 0 || version > kFormatVersion) {
    return FailedPrecondition(std::string(what) + ": format version " + std::to_string(version) +
                              " is not supported by this reader (knows 1.." +
                              std::to_string(kFormatVersion) + ")");
  }
  const uint64_t length = GetLe(bytes, 16, 8);
  const uint64_t checksum = GetLe(bytes, 24, 8);
  if (length > kMaxManifestBytes || length != bytes.size() - kHeaderSize) {
    return DataLoss(std::string(what) + ": header says " + std::to_string(length) +
                    " payload bytes, file has " + std::to_string(bytes.size() - kHeaderSize) +
                    " (truncated?)");
  }
  std::string_view payload = bytes.substr(kHeaderSize);
  if (Xxh3(payload.data(), payload.size()) != checksum) {
    return DataLoss(std::string(what) + ": payload checksum mismatch");
  }
  if (!m->ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
    return DataLoss(std::string(what) + ": payload does not parse");
  }
  return Status::Ok();
}

// Everything ValidateManifest checks of one tensor but the overlap of its shards, whose
// geometries it leaves in `geoms` for that check (or the commit's coverage check): converting
// each shard once serves both.
Status ValidateTensorShards(const ckptd::v1::TensorEntry& t, uint32_t world_size,
                            std::vector<ShardGeometry>* geoms) {
  RETURN_IF_ERROR(ValidateTensorName(t.name()));
  // Error contexts are built only on an error: this runs for every shard of every commit.
  const auto ctx = [&] { return "tensor '" + EscapeForLog(t.name()) + "'"; };
  ASSIGN_OR_RETURN(DTypeInfo dtype, LookupDType(t.dtype()), ctx());
  Shape shape(t.global_shape().begin(), t.global_shape().end());
  ASSIGN_OR_RETURN(const uint64_t numel, ShapeNumel(shape), ctx());
  // The whole tensor's bytes must be countable too (a 2^62-element float32 is not).
  RETURN_IF_ERROR(ByteSize(numel, dtype).status(), ctx());
  geoms->clear();
  geoms->reserve(t.shards_size());
  for (int i = 0; i < t.shards_size(); ++i) {
    const auto& s = t.shards(i);
    const auto sctx = [&] { return ctx() + " shard " + std::to_string(i); };
    ASSIGN_OR_RETURN(ShardGeometry g, GeometryFromProto(s.geometry(), shape), sctx());
    ASSIGN_OR_RETURN(const uint64_t expect, ByteSize(g.numel(), dtype), sctx());
    if (s.length() != expect) {
      return InvalidArgument(sctx() + ": length " + std::to_string(s.length()) + " but " +
                             g.ToString() + " of " + std::string(dtype.name) + " is " +
                             std::to_string(expect) + " bytes");
    }
    if (s.offset() % kIoAlignment != 0) {
      return InvalidArgument(sctx() + ": offset " + std::to_string(s.offset()) +
                             " is not 4096-aligned");
    }
    if (s.chunk_size() == 0 || s.chunk_size() % kIoAlignment != 0) {
      return InvalidArgument(sctx() + ": chunk size " + std::to_string(s.chunk_size()) +
                             " is not a positive multiple of 4096");
    }
    if (static_cast<uint64_t>(s.chunk_xxh3_size()) != ChunkCount(s.length(), s.chunk_size())) {
      return InvalidArgument(sctx() + ": " + std::to_string(s.chunk_xxh3_size()) +
                             " checksums for " + std::to_string(s.length()) + " bytes in " +
                             std::to_string(s.chunk_size()) + "-byte chunks");
    }
    const std::string& file = s.file();
    if (file.empty() || file.find('/') != std::string::npos || file == "." || file == ".." ||
        file.find('\0') != std::string::npos) {
      return InvalidArgument(sctx() + ": data file name '" + EscapeForLog(file) +
                             "' is not a plain file name");
    }
    if (world_size != 0 && s.writer_rank() >= world_size) {
      return InvalidArgument(sctx() + ": writer rank " + std::to_string(s.writer_rank()) +
                             " is not below world size " + std::to_string(world_size));
    }
    geoms->push_back(std::move(g));
  }
  return Status::Ok();
}

// CheckCoverage of one tensor, its error naming the ranks that saved the tensor.
Status CheckTensorCoverage(const ckptd::v1::TensorEntry& t, std::span<const ShardGeometry> geoms) {
  Status covered = CheckCoverage(EscapeForLog(t.name()), geoms);
  if (covered.ok()) return covered;
  std::set<uint32_t> writers;
  for (const auto& s : t.shards()) writers.insert(s.writer_rank());
  std::string ranks;
  for (uint32_t r : writers) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  return Status(covered.code(), covered.message() + "; its shards were saved by rank" +
                                    (writers.size() == 1 ? " " : "s ") + ranks +
                                    ". A checkpoint that cannot be restored is not committed");
}

// ValidateManifest, and with `coverage` CheckManifestCoverage too, in one pass.
Status ValidateManifestImpl(const ckptd::v1::Manifest& m, bool coverage) {
  if (m.format_version() == 0 || m.format_version() > kFormatVersion) {
    return FailedPrecondition("manifest format version " + std::to_string(m.format_version()) +
                              " is not supported");
  }
  RETURN_IF_ERROR(ValidateJobName(m.job()));
  if (m.world_size() == 0) return InvalidArgument("manifest world size is 0");
  std::vector<std::string_view> names;
  names.reserve(m.tensors_size());
  std::vector<ShardGeometry> geoms;
  for (const auto& t : m.tensors()) {
    RETURN_IF_ERROR(ValidateTensorShards(t, m.world_size(), &geoms));
    if (coverage && !t.partial()) {
      RETURN_IF_ERROR(CheckTensorCoverage(t, geoms));  // no partial overlap, and no hole
    } else {
      RETURN_IF_ERROR(CheckNoPartialOverlap(t.name(), geoms));
    }
    names.push_back(t.name());
  }
  std::sort(names.begin(), names.end());
  auto dup = std::adjacent_find(names.begin(), names.end());
  if (dup != names.end()) {
    return InvalidArgument("tensor '" + EscapeForLog(*dup) + "' is listed twice");
  }
  for (const auto& r : m.ranks()) {
    if (r.rank() >= m.world_size()) {
      return InvalidArgument("rank " + std::to_string(r.rank()) + " is not below world size " +
                             std::to_string(m.world_size()));
    }
  }
  return Status::Ok();
}

}  // namespace

std::string EncodeManifest(const ckptd::v1::Manifest& m) { return Encode(kManifestMagic, m); }
std::string EncodeNodeManifest(const ckptd::v1::NodeManifest& m) { return Encode(kNodeMagic, m); }

Result<ckptd::v1::Manifest> DecodeManifest(std::string_view bytes, std::string_view what) {
  ckptd::v1::Manifest m;
  RETURN_IF_ERROR(Decode(kManifestMagic, bytes, what, &m));
  return m;
}

Result<ckptd::v1::NodeManifest> DecodeNodeManifest(std::string_view bytes, std::string_view what) {
  ckptd::v1::NodeManifest m;
  RETURN_IF_ERROR(Decode(kNodeMagic, bytes, what, &m));
  return m;
}

Result<ckptd::v1::Manifest> ReadManifest(FileSystem* fs, const std::string& step_dir) {
  const std::string path = JoinPath(step_dir, std::string(kManifestFileName));
  auto bytes = fs->ReadFile(path);
  if (!bytes.ok()) {
    if (bytes.status().code() == StatusCode::kNotFound) {
      return NotFound(path + " does not exist: the step is not committed");
    }
    return bytes.status();
  }
  ASSIGN_OR_RETURN(auto m, DecodeManifest(*bytes, path));
  RETURN_IF_ERROR(ValidateManifest(m), path);
  return m;
}

Result<ckptd::v1::NodeManifest> ReadNodeManifest(FileSystem* fs, const std::string& path) {
  ASSIGN_OR_RETURN(std::string bytes, fs->ReadFile(path));
  return DecodeNodeManifest(bytes, path);
}

Status ValidateManifest(const ckptd::v1::Manifest& m) {
  return ValidateManifestImpl(m, /*coverage=*/false);
}

Status ValidateManifestForCommit(const ckptd::v1::Manifest& m) {
  return ValidateManifestImpl(m, /*coverage=*/true);
}

Status CheckManifestCoverage(const ckptd::v1::Manifest& m) {
  std::vector<ShardGeometry> geoms;
  for (const auto& t : m.tensors()) {
    if (t.partial()) continue;  // saved in part on purpose
    const Shape shape(t.global_shape().begin(), t.global_shape().end());
    geoms.clear();
    geoms.reserve(t.shards_size());
    for (const auto& s : t.shards()) {
      ASSIGN_OR_RETURN(ShardGeometry g, GeometryFromProto(s.geometry(), shape),
                       "tensor '" + EscapeForLog(t.name()) + "'");
      geoms.push_back(std::move(g));
    }
    RETURN_IF_ERROR(CheckTensorCoverage(t, geoms));
  }
  return Status::Ok();
}

Result<ShardGeometry> GeometryFromProto(const ckptd::v1::ShardGeometry& g,
                                        const Shape& global_shape) {
  switch (g.kind_case()) {
    case ckptd::v1::ShardGeometry::kBox:
      return ShardGeometry::Box(global_shape,
                                Shape(g.box().offsets().begin(), g.box().offsets().end()),
                                Shape(g.box().lengths().begin(), g.box().lengths().end()));
    case ckptd::v1::ShardGeometry::kFlat:
      return ShardGeometry::Flat(global_shape, g.flat().flat_offset(), g.flat().numel());
    default:
      return InvalidArgument("shard geometry is neither box nor flat");
  }
}

ckptd::v1::ShardGeometry GeometryToProto(const ShardGeometry& g) {
  ckptd::v1::ShardGeometry out;
  if (g.kind() == ShardGeometry::Kind::kBox) {
    auto* box = out.mutable_box();
    for (uint64_t o : g.offsets()) box->add_offsets(o);
    for (uint64_t l : g.lengths()) box->add_lengths(l);
  } else {
    auto* flat = out.mutable_flat();
    flat->set_flat_offset(g.flat_offset());
    flat->set_numel(g.numel());
  }
  return out;
}

Result<std::optional<uint64_t>> ResolveReadableLatest(FileSystem* fs, const std::string& job_dir,
                                                      std::vector<uint64_t>* damaged) {
  ASSIGN_OR_RETURN(std::optional<uint64_t> candidate, ResolveLatest(fs, job_dir));
  if (!candidate) return candidate;
  ASSIGN_OR_RETURN(std::vector<uint64_t> committed, ListCommittedSteps(fs, job_dir));
  // Newest first, from the LATEST candidate down.
  auto end = std::upper_bound(committed.begin(), committed.end(), *candidate);
  for (auto it = std::make_reverse_iterator(end); it != committed.rend(); ++it) {
    auto m = ReadManifest(fs, JoinPath(job_dir, StepDirName(*it)));
    if (m.ok()) return std::optional<uint64_t>(*it);
    if (m.status().code() == StatusCode::kNotFound) continue;  // removed meanwhile
    spdlog::warn(
        "{}: step {} is committed but its MANIFEST cannot be read ({}); falling back "
        "to an older step",
        job_dir, *it, m.status().ToString());
    if (damaged != nullptr) damaged->push_back(*it);
  }
  return std::optional<uint64_t>();
}

}  // namespace ckpt
