// DataFileWriter, the daemon's data-file writer (its flush engine writes every captured slot
// through it): alignment checks, Finish, and the failures a PFS produces (through the
// fault-injecting filesystem), driven slot by slot by the tests' WriteTestDataFile
// (checkpoint_builder.h).
#include "common/data_writer.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "common/checksum.h"
#include "common/fault_file_system.h"
#include "tests/checkpoint_builder.h"
#include "tests/test_util.h"

namespace ckpt {
namespace {

using ckpt::testing::ShardSource;
using ckpt::testing::TempDir;
using ckpt::testing::WriteTestDataFile;
using ckpt::testing::WrittenShard;

// Small chunks and slots, so a few hundred KiB exercise many slots and every boundary case.
constexpr LayoutOptions kSmall{.checksum_chunk = 16 << 10, .slot_size = 64 << 10};

struct Shards {
  std::vector<std::vector<std::byte>> bytes;
  std::vector<ShardSource> sources;
};

Shards MakeShards(const std::vector<uint64_t>& sizes, std::mt19937_64& rng) {
  Shards s;
  s.bytes.reserve(sizes.size());
  for (uint64_t size : sizes) {
    std::vector<std::byte> b(size);
    // Never zero, so that a shard byte can be told from padding.
    for (auto& x : b) x = std::byte(1 + rng() % 255);
    s.bytes.push_back(std::move(b));
  }
  for (const auto& b : s.bytes) s.sources.push_back(ShardSource{b.data(), b.size()});
  return s;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Checks the file at `path`: the layout PlanDataFile gives, the shards' bytes, zero padding and
// the checksums.
void VerifyDataFile(const std::string& path, const Shards& shards,
                    const std::vector<WrittenShard>& written, const LayoutOptions& options) {
  std::vector<uint64_t> sizes;
  for (const auto& src : shards.sources) sizes.push_back(src.size);
  auto layout = PlanDataFile(sizes, options);
  REQUIRE_OK(layout);

  const std::string file = ReadAll(path);
  CHECK(file.size() % kIoAlignment == 0);
  CHECK(file.size() == layout->file_size);
  REQUIRE(written.size() == shards.sources.size());

  std::vector<bool> covered(file.size(), false);
  for (size_t i = 0; i < written.size(); ++i) {
    INFO("shard " << i << " of " << sizes[i] << " bytes");
    const WrittenShard& w = written[i];
    CHECK(w.offset == layout->shard_offsets[i]);
    CHECK(w.length == sizes[i]);
    CHECK(w.chunk_size == options.checksum_chunk);
    CHECK(w.offset % kIoAlignment == 0);
    if (sizes[i] >= options.checksum_chunk) CHECK(w.offset % options.checksum_chunk == 0);
    REQUIRE(w.offset + w.length <= file.size());
    // (memcmp of an empty shard would pass a null pointer: undefined even for length 0.)
    if (w.length > 0) {
      CHECK(std::memcmp(file.data() + w.offset, shards.bytes[i].data(), w.length) == 0);
    }
    std::fill(covered.begin() + w.offset, covered.begin() + w.offset + w.length, true);

    REQUIRE(w.chunk_xxh3.size() == ChunkCount(w.length, w.chunk_size));
    for (size_t c = 0; c < w.chunk_xxh3.size(); ++c) {
      const uint64_t begin = c * w.chunk_size;
      const uint64_t len = std::min(w.chunk_size, w.length - begin);
      CHECK(w.chunk_xxh3[c] == Xxh3(shards.bytes[i].data() + begin, len));
    }
  }
  size_t nonzero_padding = 0;
  for (size_t i = 0; i < file.size(); ++i) {
    if (!covered[i] && file[i] != '\0') ++nonzero_padding;
  }
  CHECK(nonzero_padding == 0);
}

std::vector<uint64_t> BoundarySizes(const LayoutOptions& o) {
  const uint64_t chunk = o.checksum_chunk;
  const uint64_t slot = o.slot_size;
  return {0,
          1,
          100,
          kIoAlignment - 1,
          kIoAlignment,
          kIoAlignment + 1,
          0,
          chunk - 1,
          chunk,
          chunk + 1,
          slot - 1,
          slot,
          slot + 1,
          0,
          3 * slot + 12345,
          7,
          2 * chunk,
          0};
}

TEST_CASE("DataFileWriter checks alignment and finishes once", "[storage]") {
  TempDir dir;
  const std::string path = dir / "w.data";
  auto writer = DataFileWriter::Create(PosixFileSystem(), path);
  REQUIRE_OK(writer);
  DataFileWriter& w = **writer;
  CHECK(w.path() == path);
  AlignedBuffer buf(2 * kIoAlignment);
  std::memset(buf.data(), 0xab, buf.size());

  for (const auto& [offset, data, size] :
       {std::tuple<uint64_t, const std::byte*, size_t>{100, buf.data(), kIoAlignment},
        {0, buf.data(), 100},
        {0, buf.data() + 8, kIoAlignment}}) {
    Status st = w.WriteAt(offset, data, size);
    CHECK(st.code() == StatusCode::kInvalidArgument);
    CHECK(st.message().find(path) != std::string::npos);
  }
  CHECK(w.bytes_written() == 0);

  REQUIRE_OK(w.WriteAt(kIoAlignment, buf.data(), buf.size()));
  CHECK(w.bytes_written() == buf.size());
  REQUIRE_OK(w.Finish());
  REQUIRE_OK(w.Finish());  // a second Finish repeats the first's result
  const std::string file = ReadAll(path);
  REQUIRE(file.size() == 3 * kIoAlignment);
  CHECK(file.substr(0, kIoAlignment) == std::string(kIoAlignment, '\0'));
  CHECK(file.substr(kIoAlignment) == std::string(2 * kIoAlignment, '\xab'));
  WARN("DataFileWriter under " << dir.path() << ": " << (w.direct() ? "O_DIRECT" : "buffered"));
}

TEST_CASE("DataFileWriter through injected faults", "[storage]") {
  TempDir dir;
  FaultInjectingFileSystem fs(PosixFileSystem());
  std::mt19937_64 rng(ckpt::testing::TestSeed());
  const Shards shards = MakeShards(BoundarySizes(kSmall), rng);
  const std::string path = dir / "rank-00003.data";

  SECTION("ENOSPC fails the write with the path and errno") {
    fs.FailWithNoSpaceAfter(100 << 10);
    auto r = WriteTestDataFile(&fs, path, shards.sources, kSmall);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().sys_errno() == ENOSPC);
    CHECK(r.status().code() == StatusCode::kResourceExhausted);
    CHECK(r.status().message().find(path) != std::string::npos);
    CHECK(fs.bytes_written() <= (100 << 10));
  }
  SECTION("EIO on a write fails it with the path") {
    fs.FailWriteNumber(3);
    auto r = WriteTestDataFile(&fs, path, shards.sources, kSmall);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().sys_errno() == EIO);
    CHECK(r.status().message().find("pwrite " + path + " at offset") != std::string::npos);
  }
  SECTION("EIO on the final fdatasync fails it with the path") {
    fs.FailDataSync(true);
    auto r = WriteTestDataFile(&fs, path, shards.sources, kSmall);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().sys_errno() == EIO);
    CHECK(r.status().message().find("fdatasync " + path) != std::string::npos);
  }
  SECTION("faults on other paths do not matter") {
    fs.LimitFaultsTo("rank-00004");
    fs.FailWithNoSpaceAfter(0);
    fs.FailDataSync(true);
    auto r = WriteTestDataFile(&fs, path, shards.sources, kSmall);
    REQUIRE_OK(r);
    VerifyDataFile(path, shards, *r, kSmall);
  }
  SECTION("short writes still give the right file") {
    fs.ShortWrites(true);
    auto r = WriteTestDataFile(&fs, path, shards.sources, kSmall);
    REQUIRE_OK(r);
    VerifyDataFile(path, shards, *r, kSmall);
    CHECK(fs.bytes_written() == std::filesystem::file_size(path));
  }
  SECTION("a finished data file survives a crash once its directory is synced") {
    auto r = WriteTestDataFile(&fs, path, shards.sources, kSmall);
    REQUIRE_OK(r);
    REQUIRE_OK(fs.SyncDir(dir.path()));
    REQUIRE_OK(fs.SimulateCrash());
    VerifyDataFile(path, shards, *r, kSmall);
  }
  SECTION("without the directory sync a crash loses it") {
    auto r = WriteTestDataFile(&fs, path, shards.sources, kSmall);
    REQUIRE_OK(r);
    REQUIRE_OK(fs.SimulateCrash());
    CHECK_FALSE(std::filesystem::exists(path));
  }
}

}  // namespace
}  // namespace ckpt
