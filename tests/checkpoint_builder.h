// Writing whole checkpoints for tests, the way the daemon lays them out: one data file per rank
// (WriteTestDataFile: common/data_writer.h's WriteDataFileFromMemory), a MANIFEST committed with
// WriteFileAtomically. Also a reference implementation of "the bytes of a shard" that does not use
// ShardGeometry::Runs, so tests of the planner and the reader compare against something
// independent.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <map>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "ckptd/v1/manifest.pb.h"
#include "common/atomic_file.h"
#include "common/checksum.h"
#include "common/data_layout.h"
#include "common/data_writer.h"
#include "common/dtype.h"
#include "common/file_system.h"
#include "common/geometry.h"
#include "common/manifest_io.h"
#include "common/step_layout.h"

namespace ckpt::testing {

using ckpt::ShardSource;
using ckpt::WrittenShard;
// The data file of one rank, as the daemon lays it out (common/data_writer.h).
inline Result<std::vector<WrittenShard>> WriteTestDataFile(FileSystem* fs, const std::string& path,
                                                           std::span<const ShardSource> shards,
                                                           const LayoutOptions& options) {
  return WriteDataFileFromMemory(fs, path, shards, options);
}

struct TestShard {
  ShardGeometry geometry;
  uint32_t rank = 0;  // writer rank: which data file holds it
};

struct TestTensor {
  std::string name;
  std::string dtype = "float32";
  Shape shape;
  std::vector<std::byte> data;  // the full tensor, row-major
  std::vector<TestShard> shards;
};

// The POSIX filesystem minus durability: DataSync and SyncDir succeed without syncing. For
// tests that write thousands of small checkpoints and check contents, not crash safety — an
// fdatasync costs milliseconds on the CI disk. O_DIRECT and everything else are real.
class NoSyncFileSystem : public FileSystem {
 public:
  explicit NoSyncFileSystem(FileSystem* base = PosixFileSystem()) : base_(base) {}

  Result<std::unique_ptr<File>> Open(const std::string& path, const OpenOptions& options) override {
    ASSIGN_OR_RETURN(std::unique_ptr<File> file, base_->Open(path, options));
    return std::unique_ptr<File>(new NoSyncFile(std::move(file)));
  }
  Status CreateDirs(const std::string& path) override { return base_->CreateDirs(path); }
  Status Rename(const std::string& from, const std::string& to) override {
    return base_->Rename(from, to);
  }
  Status SyncDir(const std::string&) override { return Status::Ok(); }
  Status Remove(const std::string& path) override { return base_->Remove(path); }
  Status RemoveAll(const std::string& path) override { return base_->RemoveAll(path); }
  Result<std::vector<std::string>> ListDir(const std::string& path) override {
    return base_->ListDir(path);
  }
  Result<bool> Exists(const std::string& path) override { return base_->Exists(path); }

 private:
  class NoSyncFile : public File {
   public:
    explicit NoSyncFile(std::unique_ptr<File> f) : f_(std::move(f)) {}
    Result<size_t> PWrite(const void* data, size_t size, uint64_t offset) override {
      return f_->PWrite(data, size, offset);
    }
    Result<size_t> PRead(void* data, size_t size, uint64_t offset) override {
      return f_->PRead(data, size, offset);
    }
    Status DataSync() override { return Status::Ok(); }
    Status Truncate(uint64_t size) override { return f_->Truncate(size); }
    Status Allocate(uint64_t size) override { return f_->Allocate(size); }
    Result<uint64_t> Size() override { return f_->Size(); }
    Status Close() override { return f_->Close(); }
    bool direct() const override { return f_->direct(); }
    const std::string& path() const override { return f_->path(); }

   private:
    std::unique_ptr<File> f_;
  };
  FileSystem* base_;
};

inline std::vector<std::byte> RandomBytes(std::mt19937_64& rng, size_t n) {
  std::vector<std::byte> out(n);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const uint64_t v = rng();
    std::memcpy(out.data() + i, &v, 8);
  }
  for (; i < n; ++i) out[i] = static_cast<std::byte>(rng() & 0xff);
  return out;
}

// The shard's bytes in its own order, cut out of the full row-major tensor element by element.
inline std::vector<std::byte> ExtractShard(const std::vector<std::byte>& full,
                                           const ShardGeometry& g, uint32_t element_size) {
  std::vector<std::byte> out(g.numel() * element_size);
  if (g.numel() == 0) return out;
  if (g.kind() == ShardGeometry::Kind::kFlat) {
    std::memcpy(out.data(), full.data() + g.flat_offset() * element_size, out.size());
    return out;
  }
  const Shape& shape = g.global_shape();
  const size_t dims = shape.size();
  std::vector<uint64_t> stride(dims, 1);
  for (size_t d = dims; d-- > 1;) stride[d - 1] = stride[d] * shape[d];
  std::vector<uint64_t> index(dims, 0);  // inside the box
  for (uint64_t e = 0; e < g.numel(); ++e) {
    uint64_t flat = 0;
    for (size_t d = 0; d < dims; ++d) flat += (g.offsets()[d] + index[d]) * stride[d];
    std::memcpy(out.data() + e * element_size, full.data() + flat * element_size, element_size);
    for (size_t d = dims; d-- > 0;) {
      if (++index[d] < g.lengths()[d]) break;
      index[d] = 0;
    }
  }
  return out;
}

inline uint32_t ElementSize(const std::string& dtype) { return LookupDType(dtype)->element_size; }

// Writes rank-<r>.data for every rank that holds a shard, then <step_dir>/MANIFEST. Returns the
// manifest it committed.
inline Result<ckptd::v1::Manifest> WriteTestCheckpoint(FileSystem* fs, const std::string& step_dir,
                                                       const std::string& job, uint64_t step,
                                                       uint32_t world_size,
                                                       const std::vector<TestTensor>& tensors,
                                                       const LayoutOptions& layout) {
  RETURN_IF_ERROR(fs->CreateDirs(step_dir));
  ckptd::v1::Manifest m;
  m.set_format_version(kFormatVersion);
  m.set_job(job);
  m.set_step(step);
  m.set_world_size(world_size);
  m.set_writer("ckptd tests");
  m.set_created_unix_ms(1700000000000);

  struct Pending {
    std::vector<std::byte> bytes;
    ckptd::v1::StoredShard* entry;
  };
  std::map<uint32_t, std::vector<Pending>> by_rank;
  for (const auto& t : tensors) {
    auto* entry = m.add_tensors();
    entry->set_name(t.name);
    entry->set_dtype(t.dtype);
    for (uint64_t d : t.shape) entry->add_global_shape(d);
    const uint32_t es = ElementSize(t.dtype);
    for (const auto& s : t.shards) {
      auto* stored = entry->add_shards();
      *stored->mutable_geometry() = GeometryToProto(s.geometry);
      stored->set_file(DataFileName(s.rank));
      stored->set_writer_rank(s.rank);
      by_rank[s.rank].push_back(Pending{ExtractShard(t.data, s.geometry, es), stored});
    }
  }
  for (auto& [rank, shards] : by_rank) {
    std::vector<ShardSource> sources;
    for (const auto& p : shards) sources.push_back(ShardSource{p.bytes.data(), p.bytes.size()});
    ASSIGN_OR_RETURN(
        std::vector<WrittenShard> written,
        WriteTestDataFile(fs, JoinPath(step_dir, DataFileName(rank)), sources, layout));
    for (size_t i = 0; i < shards.size(); ++i) {
      auto* e = shards[i].entry;
      e->set_offset(written[i].offset);
      e->set_length(written[i].length);
      e->set_chunk_size(written[i].chunk_size);
      for (uint64_t x : written[i].chunk_xxh3) e->add_chunk_xxh3(x);
    }
  }
  for (uint32_t r = 0; r < world_size; ++r) {
    auto* rank = m.add_ranks();
    rank->set_rank(r);
    rank->set_node_id("node-" + std::to_string(r / 2));
    rank->set_extra("extra of rank " + std::to_string(r));
  }
  RETURN_IF_ERROR(ValidateManifest(m), "test checkpoint");
  RETURN_IF_ERROR(WriteFileAtomically(fs, JoinPath(step_dir, std::string(kManifestFileName)),
                                      EncodeManifest(m)));
  return m;
}

}  // namespace ckpt::testing
