// PlanDataFile (common/data_layout.h): the invariants the capture and flush pipeline rely on,
// checked on fixed cases and on seeded random shard lists.
#include "common/data_layout.h"

#include <algorithm>
#include <random>
#include <vector>

#include "common/file_system.h"
#include "tests/test_util.h"

namespace ckpt {
namespace {

using Catch::Matchers::Contains;

constexpr uint64_t k4K = 4096;

DataFileLayout Plan(const std::vector<uint64_t>& shards, const LayoutOptions& options) {
  auto r = PlanDataFile(shards, options);
  REQUIRE_OK(r);
  return std::move(r).value();
}

// Every promise of data_layout.h, checked against the shard sizes.
void CheckLayout(const std::vector<uint64_t>& shards, const LayoutOptions& opt,
                 const DataFileLayout& l) {
  const uint64_t chunk = opt.checksum_chunk, slot = opt.slot_size;
  REQUIRE(l.checksum_chunk == chunk);
  REQUIRE(l.slot_size == slot);
  REQUIRE(l.shard_offsets.size() == shards.size());
  REQUIRE(l.chunk_counts.size() == shards.size());

  // Shards: aligned, in order, disjoint, inside the file.
  uint64_t prev_end = 0, max_end = 0;
  for (size_t i = 0; i < shards.size(); ++i) {
    INFO("shard " << i << " of " << shards[i] << " bytes at " << l.shard_offsets[i]);
    const uint64_t off = l.shard_offsets[i];
    CHECK(off % k4K == 0);
    if (shards[i] >= chunk) CHECK(off % chunk == 0);
    CHECK(off >= prev_end);
    CHECK(l.chunk_counts[i] == ChunkCount(shards[i], chunk));
    prev_end = off + shards[i];
    max_end = std::max(max_end, prev_end);
  }
  CHECK(l.file_size % k4K == 0);
  CHECK(l.file_size >= max_end);
  CHECK(l.file_size < max_end + k4K);

  // Slots and pieces.
  std::vector<std::vector<int>> seen(shards.size());
  for (size_t i = 0; i < shards.size(); ++i) seen[i].assign(l.chunk_counts[i], 0);
  for (size_t si = 0; si < l.slots.size(); ++si) {
    const Slot& s = l.slots[si];
    INFO("slot " << si << " at " << s.file_offset << " length " << s.length);
    CHECK(s.file_offset % slot == 0);
    if (si > 0) CHECK(s.file_offset > l.slots[si - 1].file_offset);
    CHECK_FALSE(s.pieces.empty());
    CHECK(s.length % k4K == 0);
    CHECK(s.length <= slot);
    CHECK(s.file_offset + s.length <= l.file_size);
    uint64_t piece_end = 0;
    for (size_t pi = 0; pi < s.pieces.size(); ++pi) {
      const SlotPiece& p = s.pieces[pi];
      INFO("piece " << pi << ": shard " << p.shard << " chunk " << p.chunk_index << " at slot +"
                    << p.slot_offset << " length " << p.length);
      REQUIRE(p.shard < shards.size());
      CHECK(p.slot_offset >= piece_end);  // in slot_offset order, no overlap
      CHECK(p.length > 0);
      CHECK(p.length <= chunk);
      CHECK(p.slot_offset + p.length <= slot);  // never straddles a slot
      CHECK(p.slot_offset + p.length <= s.length);
      piece_end = p.slot_offset + p.length;
      // The piece is chunk `chunk_index` of its shard, at the shard's place in the file.
      CHECK(p.shard_offset == uint64_t{p.chunk_index} * chunk);
      CHECK(p.length == std::min(chunk, shards[p.shard] - p.shard_offset));
      CHECK(s.file_offset + p.slot_offset == l.shard_offsets[p.shard] + p.shard_offset);
      REQUIRE(p.chunk_index < seen[p.shard].size());
      ++seen[p.shard][p.chunk_index];
    }
    CHECK(s.length == AlignUp(piece_end, k4K));  // writes no more than it must
  }
  // Each piece of each shard exactly once.
  for (size_t i = 0; i < shards.size(); ++i) {
    for (size_t c = 0; c < seen[i].size(); ++c) {
      INFO("shard " << i << " chunk " << c);
      CHECK(seen[i][c] == 1);
    }
  }
}

TEST_CASE("PlanDataFile: no shards is an empty file", "[layout]") {
  const LayoutOptions opt;
  const auto l = Plan({}, opt);
  CHECK(l.file_size == 0);
  CHECK(l.slots.empty());
  CHECK(l.shard_offsets.empty());
}

TEST_CASE("PlanDataFile: empty shards take no piece and no slot", "[layout]") {
  const LayoutOptions opt{.checksum_chunk = 8192, .slot_size = 32768};
  const std::vector<uint64_t> shards = {0, 100, 0, 0};
  const auto l = Plan(shards, opt);
  CheckLayout(shards, opt, l);
  CHECK(l.chunk_counts == std::vector<uint32_t>{0, 1, 0, 0});
  REQUIRE(l.slots.size() == 1);
  CHECK(l.slots[0].pieces.size() == 1);
  CHECK(l.file_size == k4K);
}

TEST_CASE("PlanDataFile: small shards share a slot, 4 KiB apart", "[layout]") {
  const LayoutOptions opt{.checksum_chunk = 16384, .slot_size = 65536};
  const std::vector<uint64_t> shards = {1, 4096, 4097, 10};
  const auto l = Plan(shards, opt);
  CheckLayout(shards, opt, l);
  CHECK(l.shard_offsets == std::vector<uint64_t>{0, 4096, 8192, 16384});
  REQUIRE(l.slots.size() == 1);
  CHECK(l.slots[0].length == 20480);
  CHECK(l.file_size == 20480);
}

TEST_CASE("PlanDataFile: a shard of at least one chunk starts on a chunk boundary", "[layout]") {
  const LayoutOptions opt{.checksum_chunk = 16384, .slot_size = 65536};
  const std::vector<uint64_t> shards = {100, 16384, 100, 40000};
  const auto l = Plan(shards, opt);
  CheckLayout(shards, opt, l);
  CHECK(l.shard_offsets[1] == 16384);
  CHECK(l.shard_offsets[2] == 32768);
  CHECK(l.shard_offsets[3] == 49152);
  CHECK(l.chunk_counts[3] == 3);  // 16384 + 16384 + 7232
}

TEST_CASE("PlanDataFile: a small shard that would straddle a slot moves to the next", "[layout]") {
  const LayoutOptions opt{.checksum_chunk = 16384, .slot_size = 32768};
  // Shard 0 ends at 20000; shard 1 (16383 bytes) would run from 20480 past 32768.
  const std::vector<uint64_t> shards = {20000, 16383};
  const auto l = Plan(shards, opt);
  CheckLayout(shards, opt, l);
  CHECK(l.shard_offsets[1] == 32768);
  REQUIRE(l.slots.size() == 2);
  // One that fits stays: 20480 + 12288 == 32768.
  const std::vector<uint64_t> fits = {20000, 12288};
  const auto l2 = Plan(fits, opt);
  CheckLayout(fits, opt, l2);
  CHECK(l2.shard_offsets[1] == 20480);
  CHECK(l2.slots.size() == 1);
}

TEST_CASE("PlanDataFile: a large shard is cut into chunk pieces across slots", "[layout]") {
  const LayoutOptions opt{.checksum_chunk = 8192, .slot_size = 16384};
  const std::vector<uint64_t> shards = {5 * 8192 + 1};
  const auto l = Plan(shards, opt);
  CheckLayout(shards, opt, l);
  CHECK(l.chunk_counts[0] == 6);
  REQUIRE(l.slots.size() == 3);
  CHECK(l.slots[2].pieces.size() == 2);
  CHECK(l.slots[2].pieces[1].length == 1);
  CHECK(l.slots[2].length == 8192 + 4096);
  CHECK(l.file_size == 5 * 8192 + 4096);
}

TEST_CASE("PlanDataFile: thousands of small tensors become a few slots", "[layout]") {
  const LayoutOptions opt;  // 1 MiB chunks, 16 MiB slots
  const std::vector<uint64_t> shards(3000, 1000);
  const auto l = Plan(shards, opt);
  CheckLayout(shards, opt, l);
  CHECK(l.slots.size() == 1);  // 3000 × 4 KiB = 11.7 MiB
}

TEST_CASE("PlanDataFile invariants on random shard lists", "[layout]") {
  const uint64_t seed = ckpt::testing::TestSeed();
  INFO("seed " << seed << " (set CKPT_TEST_SEED to reproduce)");
  std::mt19937_64 rng(seed);
  for (int iter = 0; iter < 300; ++iter) {
    const uint64_t chunk = k4K * (1 + rng() % 4);   // 4..16 KiB
    const uint64_t slot = chunk * (1 + rng() % 6);  // 1..6 chunks
    const LayoutOptions opt{.checksum_chunk = chunk, .slot_size = slot};
    std::vector<uint64_t> shards(rng() % 40);
    for (auto& s : shards) {
      switch (rng() % 6) {
        case 0:
          s = 0;
          break;
        case 1:
          s = 1 + rng() % 64;
          break;  // tiny
        case 2:
          s = 1 + rng() % chunk;
          break;  // up to one chunk
        case 3:
          s = chunk - 1 + rng() % 3;
          break;  // around a chunk
        case 4:
          s = slot - 1 + rng() % 3;
          break;  // around a slot
        default:
          s = 1 + rng() % (3 * slot);
          break;  // several slots
      }
    }
    INFO("iteration " << iter << ": chunk " << chunk << ", slot " << slot << ", " << shards.size()
                      << " shards");
    CheckLayout(shards, opt, Plan(shards, opt));
  }
}

TEST_CASE("PlanDataFile rejects misaligned options", "[layout]") {
  struct Case {
    uint64_t chunk, slot;
    const char* says;
  };
  for (const Case& c :
       {Case{0, 16384, "checksum chunk 0"}, Case{1000, 16000, "checksum chunk 1000"},
        Case{4097, 4097 * 4, "checksum chunk 4097"}, Case{8192, 0, "slot size 0"},
        Case{8192, 12288, "slot size 12288"}, Case{8192, 4096, "slot size 4096"}}) {
    INFO("chunk " << c.chunk << ", slot " << c.slot);
    const std::vector<uint64_t> shards = {100};
    auto r = PlanDataFile(shards, LayoutOptions{.checksum_chunk = c.chunk, .slot_size = c.slot});
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kInvalidArgument);
    CHECK_THAT(r.status().message(), Contains(c.says));
  }
}

TEST_CASE("ChunkCount", "[layout]") {
  CHECK(ChunkCount(0, 4096) == 0);
  CHECK(ChunkCount(1, 4096) == 1);
  CHECK(ChunkCount(4096, 4096) == 1);
  CHECK(ChunkCount(4097, 4096) == 2);
}

}  // namespace
}  // namespace ckpt
