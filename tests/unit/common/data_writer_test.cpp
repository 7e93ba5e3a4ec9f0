// DataFileWriter and WriteShardsToFile: the bytes in the file, the zero padding, the checksums,
// and the failures a PFS produces (through the fault-injecting filesystem).
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
#include "tests/test_util.h"

namespace ckpt {
namespace {

using ckpt::testing::TempDir;

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

// Checks everything WriteShardsToFile promises about the file at `path`.
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
  return {0,         1,     100,      kIoAlignment - 1, kIoAlignment, kIoAlignment + 1, 0,
          chunk - 1, chunk, chunk + 1, slot - 1,         slot,         slot + 1,         0,
          3 * slot + 12345, 7,  2 * chunk, 0};
}

TEST_CASE("WriteShardsToFile lays out boundary-sized shards", "[storage]") {
  const int threads = GENERATE(1, 3, 8);
  INFO("io_threads " << threads);
  TempDir dir;
  std::mt19937_64 rng(ckpt::testing::TestSeed());
  const Shards shards = MakeShards(BoundarySizes(kSmall), rng);
  const std::string path = dir / "rank-00000.data";
  auto written = WriteShardsToFile(PosixFileSystem(), path, shards.sources, kSmall, threads);
  REQUIRE_OK(written);
  VerifyDataFile(path, shards, *written, kSmall);
}

TEST_CASE("WriteShardsToFile with random shard sizes", "[storage]") {
  const uint64_t seed = ckpt::testing::TestSeed();
  INFO("seed " << seed << " (set CKPT_TEST_SEED to reproduce)");
  std::mt19937_64 rng(seed);
  TempDir dir;
  for (int round = 0; round < 8; ++round) {
    INFO("round " << round);
    const std::vector<uint64_t> special = BoundarySizes(kSmall);
    std::vector<uint64_t> sizes;
    const int count = 1 + static_cast<int>(rng() % 40);
    for (int i = 0; i < count; ++i) {
      switch (rng() % 3) {
        case 0: sizes.push_back(special[rng() % special.size()]); break;
        case 1: sizes.push_back(rng() % (kSmall.checksum_chunk * 2)); break;
        default: sizes.push_back(rng() % (kSmall.slot_size * 3)); break;
      }
    }
    const Shards shards = MakeShards(sizes, rng);
    const std::string path = dir / ("round-" + std::to_string(round));
    auto written = WriteShardsToFile(PosixFileSystem(), path, shards.sources, kSmall,
                                     1 + static_cast<int>(rng() % 6));
    REQUIRE_OK(written);
    VerifyDataFile(path, shards, *written, kSmall);
  }
}

TEST_CASE("WriteShardsToFile with the default 1 MiB chunks and 16 MiB slots", "[storage]") {
  TempDir dir;
  std::mt19937_64 rng(ckpt::testing::TestSeed());
  const LayoutOptions options;
  const Shards shards =
      MakeShards({0, 1, 4096, (1 << 20) + 1, 100, (16 << 20) + 5, 3000}, rng);
  const std::string path = dir / "rank-00001.data";
  auto written = WriteShardsToFile(PosixFileSystem(), path, shards.sources, options, 4);
  REQUIRE_OK(written);
  VerifyDataFile(path, shards, *written, options);
}

TEST_CASE("WriteShardsToFile edge cases", "[storage]") {
  TempDir dir;
  FileSystem* fs = PosixFileSystem();

  SECTION("no shards, or only empty ones, give an empty file") {
    auto none = WriteShardsToFile(fs, dir / "none", {}, kSmall);
    REQUIRE_OK(none);
    CHECK(none->empty());
    CHECK(std::filesystem::file_size(dir / "none") == 0);
    const ShardSource empties[] = {{nullptr, 0}, {nullptr, 0}};
    auto two = WriteShardsToFile(fs, dir / "two", empties, kSmall);
    REQUIRE_OK(two);
    REQUIRE(two->size() == 2);
    CHECK((*two)[1].chunk_xxh3.empty());
    CHECK(std::filesystem::file_size(dir / "two") == 0);
  }
  SECTION("a shard without data is refused before anything is written") {
    const ShardSource bad[] = {{nullptr, 10}};
    auto r = WriteShardsToFile(fs, dir / "bad", bad, kSmall);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kInvalidArgument);
    CHECK(r.status().message().find(dir / "bad") != std::string::npos);
    CHECK_FALSE(std::filesystem::exists(dir / "bad"));
  }
  SECTION("misaligned layout options are refused") {
    const std::byte one{1};
    const ShardSource src[] = {{&one, 1}};
    auto r = WriteShardsToFile(fs, dir / "x", src,
                               LayoutOptions{.checksum_chunk = 1000, .slot_size = 4000});
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kInvalidArgument);
  }
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

TEST_CASE("WriteShardsToFile through injected faults", "[storage]") {
  const int threads = GENERATE(1, 4);
  INFO("io_threads " << threads);
  TempDir dir;
  FaultInjectingFileSystem fs(PosixFileSystem());
  std::mt19937_64 rng(ckpt::testing::TestSeed());
  const Shards shards = MakeShards(BoundarySizes(kSmall), rng);
  const std::string path = dir / "rank-00003.data";

  SECTION("ENOSPC fails the write with the path and errno") {
    fs.FailWithNoSpaceAfter(100 << 10);
    auto r = WriteShardsToFile(&fs, path, shards.sources, kSmall, threads);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().sys_errno() == ENOSPC);
    CHECK(r.status().code() == StatusCode::kResourceExhausted);
    CHECK(r.status().message().find(path) != std::string::npos);
    CHECK(fs.bytes_written() <= (100 << 10));
  }
  SECTION("EIO on a write fails it with the path") {
    fs.FailWriteNumber(3);
    auto r = WriteShardsToFile(&fs, path, shards.sources, kSmall, threads);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().sys_errno() == EIO);
    CHECK(r.status().message().find("pwrite " + path + " at offset") != std::string::npos);
  }
  SECTION("EIO on the final fdatasync fails it with the path") {
    fs.FailDataSync(true);
    auto r = WriteShardsToFile(&fs, path, shards.sources, kSmall, threads);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().sys_errno() == EIO);
    CHECK(r.status().message().find("fdatasync " + path) != std::string::npos);
  }
  SECTION("faults on other paths do not matter") {
    fs.LimitFaultsTo("rank-00004");
    fs.FailWithNoSpaceAfter(0);
    fs.FailDataSync(true);
    auto r = WriteShardsToFile(&fs, path, shards.sources, kSmall, threads);
    REQUIRE_OK(r);
    VerifyDataFile(path, shards, *r, kSmall);
  }
  SECTION("short writes still give the right file") {
    fs.ShortWrites(true);
    auto r = WriteShardsToFile(&fs, path, shards.sources, kSmall, threads);
    REQUIRE_OK(r);
    VerifyDataFile(path, shards, *r, kSmall);
    CHECK(fs.bytes_written() == std::filesystem::file_size(path));
  }
  SECTION("a finished data file survives a crash once its directory is synced") {
    auto r = WriteShardsToFile(&fs, path, shards.sources, kSmall, threads);
    REQUIRE_OK(r);
    REQUIRE_OK(fs.SyncDir(dir.path()));
    REQUIRE_OK(fs.SimulateCrash());
    VerifyDataFile(path, shards, *r, kSmall);
  }
  SECTION("without the directory sync a crash loses it") {
    auto r = WriteShardsToFile(&fs, path, shards.sources, kSmall, threads);
    REQUIRE_OK(r);
    REQUIRE_OK(fs.SimulateCrash());
    CHECK_FALSE(std::filesystem::exists(path));
  }
}

}  // namespace
}  // namespace ckpt
