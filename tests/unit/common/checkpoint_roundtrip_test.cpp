// CheckpointReader against the writer: save under one random layout A, load under another
// random layout B, compare bytes with a reference cut out element by element. Then damage:
// flipped bytes, truncated and missing files, and the errors of bad requests.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "common/checkpoint_reader.h"
#include "common/checksum.h"
#include "common/step_layout.h"
#include "tests/checkpoint_builder.h"
#include "tests/test_util.h"

namespace ckpt {
namespace {

using testing::ElementSize;
using testing::ExtractShard;
using testing::RandomBytes;
using testing::TempDir;
using testing::TestShard;
using testing::TestTensor;
using testing::WriteTestCheckpoint;

using Rng = std::mt19937_64;

uint64_t Uniform(Rng& rng, uint64_t lo, uint64_t hi) {  // inclusive
  return std::uniform_int_distribution<uint64_t>(lo, hi)(rng);
}
bool Chance(Rng& rng, double p) { return std::bernoulli_distribution(p)(rng); }

uint64_t Numel(const Shape& s) {
  uint64_t n = 1;
  for (uint64_t d : s) n *= d;
  return n;
}

// ------------------------------------------------------------------ random layouts

// 1–4 dims of odd-ish sizes, at most ~40k elements; now and then a zero dimension.
Shape RandomShape(Rng& rng) {
  const size_t dims = Uniform(rng, 1, 4);
  static constexpr uint64_t kMaxDim[] = {0, 40000, 220, 37, 15};
  Shape s(dims);
  for (auto& d : s) d = Uniform(rng, 1, kMaxDim[dims]);
  if (Chance(rng, 0.02)) s[Uniform(rng, 0, dims - 1)] = 0;
  return s;
}

// Sorted distinct cut points strictly inside (0, n), at most `max_cuts` of them.
std::vector<uint64_t> RandomCuts(Rng& rng, uint64_t n, uint64_t max_cuts) {
  std::set<uint64_t> cuts;
  if (n >= 2) {
    const uint64_t k = Uniform(rng, 0, std::min<uint64_t>(max_cuts, n - 1));
    while (cuts.size() < k) cuts.insert(Uniform(rng, 1, n - 1));
  }
  std::vector<uint64_t> out{0};
  out.insert(out.end(), cuts.begin(), cuts.end());
  out.push_back(n);
  return out;  // segment boundaries, from 0 to n
}

ShardGeometry MustBox(const Shape& shape, Shape offsets, Shape lengths) {
  auto g = ShardGeometry::Box(shape, std::move(offsets), std::move(lengths));
  INFO(g.status().ToString());
  REQUIRE(g.ok());
  return *std::move(g);
}

ShardGeometry MustFlat(const Shape& shape, uint64_t offset, uint64_t numel) {
  auto g = ShardGeometry::Flat(shape, offset, numel);
  INFO(g.status().ToString());
  REQUIRE(g.ok());
  return *std::move(g);
}

// Boxes of a grid inside the sub-box [lo, lo+len) (TP / PP style splits).
void GridBoxes(Rng& rng, const Shape& shape, const Shape& lo, const Shape& len,
               std::vector<ShardGeometry>& out) {
  const size_t dims = shape.size();
  std::vector<std::vector<uint64_t>> cuts(dims);
  for (size_t d = 0; d < dims; ++d) cuts[d] = RandomCuts(rng, len[d], Chance(rng, 0.5) ? 1 : 3);
  std::vector<size_t> at(dims, 0);
  for (;;) {
    Shape off(dims), l(dims);
    for (size_t d = 0; d < dims; ++d) {
      off[d] = lo[d] + cuts[d][at[d]];
      l[d] = cuts[d][at[d] + 1] - cuts[d][at[d]];
    }
    out.push_back(MustBox(shape, off, l));
    size_t d = dims;
    while (d-- > 0) {
      if (++at[d] + 1 < cuts[d].size()) break;
      at[d] = 0;
    }
    if (d == static_cast<size_t>(-1)) return;
  }
}

// Flat ranges covering [begin, end) (ZeRO style).
void FlatRanges(Rng& rng, const Shape& shape, uint64_t begin, uint64_t end,
                std::vector<ShardGeometry>& out) {
  const auto cuts = RandomCuts(rng, end - begin, 5);
  for (size_t i = 0; i + 1 < cuts.size(); ++i) {
    out.push_back(MustFlat(shape, begin + cuts[i], cuts[i + 1] - cuts[i]));
  }
}

// A partition of the tensor: every element in exactly one shard.
std::vector<ShardGeometry> RandomPartition(Rng& rng, const Shape& shape) {
  std::vector<ShardGeometry> out;
  const uint64_t numel = Numel(shape);
  const Shape zeros(shape.size(), 0);
  if (numel == 0) {
    GridBoxes(rng, shape, zeros, shape, out);
    return out;
  }
  switch (Uniform(rng, 0, 3)) {
    case 0:  // unsharded
      out.push_back(MustBox(shape, zeros, shape));
      break;
    case 1:  // box grid
      GridBoxes(rng, shape, zeros, shape, out);
      break;
    case 2:  // flat ranges
      FlatRanges(rng, shape, 0, numel, out);
      break;
    default: {  // row blocks (pipeline stages), each split as boxes or as flat ranges
      const uint64_t row = numel / shape[0];
      const auto blocks = RandomCuts(rng, shape[0], 3);
      for (size_t b = 0; b + 1 < blocks.size(); ++b) {
        if (Chance(rng, 0.5)) {
          Shape lo = zeros, len = shape;
          lo[0] = blocks[b];
          len[0] = blocks[b + 1] - blocks[b];
          GridBoxes(rng, shape, lo, len, out);
        } else {
          FlatRanges(rng, shape, blocks[b] * row, blocks[b + 1] * row, out);
        }
      }
    }
  }
  return out;
}

// Requests need not partition anything: a partition, or random boxes and ranges that overlap.
std::vector<ShardGeometry> RandomRequests(Rng& rng, const Shape& shape) {
  const uint64_t numel = Numel(shape);
  if (numel == 0 || Chance(rng, 0.6)) return RandomPartition(rng, shape);
  std::vector<ShardGeometry> out;
  const size_t n = Uniform(rng, 1, 6);
  for (size_t i = 0; i < n; ++i) {
    if (Chance(rng, 0.5)) {
      Shape off(shape.size()), len(shape.size());
      for (size_t d = 0; d < shape.size(); ++d) {
        off[d] = Uniform(rng, 0, shape[d] - 1);
        len[d] = Uniform(rng, 1, shape[d] - off[d]);
      }
      out.push_back(MustBox(shape, off, len));
    } else {
      const uint64_t off = Uniform(rng, 0, numel - 1);
      out.push_back(MustFlat(shape, off, Uniform(rng, 1, numel - off)));
    }
  }
  return out;
}

const std::vector<std::string>& TestDTypes() {
  static const std::vector<std::string> kNames = [] {
    std::vector<std::string> v;
    for (const auto& d : AllDTypes()) v.emplace_back(d.name);
    return v;
  }();
  return kNames;
}

// A tensor with random shape, dtype and contents, stored as layout A (a partition, some shards
// replicated on a second rank) spread over `world` ranks.
TestTensor RandomTensor(Rng& rng, const std::string& name, uint32_t world) {
  TestTensor t;
  t.name = name;
  t.dtype = TestDTypes()[Uniform(rng, 0, TestDTypes().size() - 1)];
  t.shape = RandomShape(rng);
  t.data = RandomBytes(rng, Numel(t.shape) * ElementSize(t.dtype));
  for (auto& g : RandomPartition(rng, t.shape)) {
    const auto rank = static_cast<uint32_t>(Uniform(rng, 0, world - 1));
    t.shards.push_back(TestShard{g, rank});
    if (world > 1 && Chance(rng, 0.2)) {  // a data-parallel replica, written twice
      t.shards.push_back(TestShard{g, static_cast<uint32_t>((rank + 1) % world)});
    }
  }
  std::shuffle(t.shards.begin(), t.shards.end(), rng);
  return t;
}

LayoutOptions SmallLayout() {
  LayoutOptions o;
  o.checksum_chunk = 4096;
  o.slot_size = 16384;
  return o;
}

CheckpointReader::Options RandomReaderOptions(Rng& rng) {
  static constexpr uint64_t kReadSizes[] = {4096, 8192, 12288, 65536, 16ull << 20};
  CheckpointReader::Options o;
  o.max_read_bytes = kReadSizes[Uniform(rng, 0, 4)];
  o.io_threads = static_cast<int>(Uniform(rng, 1, 4));
  o.try_direct = Chance(rng, 0.7);
  return o;
}

// A stand-in for the daemon's hot cache: whole data files in memory.
struct FileCache {
  std::map<std::string, std::string> files;  // name in the manifest → bytes

  void Load(const std::string& step_dir, const std::string& name) {
    auto bytes = PosixFileSystem()->ReadFile(JoinPath(step_dir, name));
    REQUIRE_OK(bytes);
    files[name] = *bytes;
  }
  const std::byte* Find(const std::string& file, uint64_t offset, uint64_t length) const {
    auto it = files.find(file);
    if (it == files.end() || offset + length > it->second.size()) return nullptr;
    return reinterpret_cast<const std::byte*>(it->second.data() + offset);
  }
};

// A fresh directory in /dev/shm when there is one (else under $TMPDIR), removed at the end.
class MemoryDir {
 public:
  MemoryDir() {
    std::string tmpl = std::filesystem::is_directory("/dev/shm") ? "/dev/shm/ckpt-test-XXXXXX"
                                                                 : dir_.path() + "/mem-XXXXXX";
    REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
    path_ = tmpl;
  }
  ~MemoryDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  TempDir dir_;  // only used as the fallback
  std::string path_;
};

// ------------------------------------------------------------------ the property test

TEST_CASE("checkpoint written under layout A reads back under any layout B", "[reader]") {
  const uint64_t seed = testing::TestSeed();
  INFO("seed " << seed << " (rerun with CKPT_TEST_SEED=" << seed << ")");
  Rng rng(seed);
  // Most cases run in memory (/dev/shm: buffered I/O, no device latency, so thousands fit the
  // budget); every 8th runs on the disk under $TMPDIR, through O_DIRECT where it is taken.
  TempDir disk_dir;
  MemoryDir memory_dir;
  // Contents are what this test checks; fdatasync (~3 ms each on the CI disk) is skipped.
  testing::NoSyncFileSystem no_sync;
  FileSystem* fs = &no_sync;

  // Each case is one committed step: a few tensors over a few ranks. At least kMinCases run
  // whatever the machine's speed (no wall-clock assertion: a sanitizer build or a busy machine
  // only takes longer); beyond that a time budget as well as kMaxCases bounds the count.
  constexpr int kMinCases = 300;
  constexpr int kMaxCases = 3000;
  const auto budget = std::chrono::seconds(10);
  const auto start = std::chrono::steady_clock::now();
  int cases = 0;
  uint64_t requests_checked = 0;
  for (; cases < kMinCases ||
         (cases < kMaxCases && std::chrono::steady_clock::now() - start < budget);
       ++cases) {
    INFO("case " << cases);
    const auto world = static_cast<uint32_t>(Uniform(rng, 1, 4));
    std::vector<TestTensor> tensors;
    const size_t count = Uniform(rng, 1, 3);
    for (size_t i = 0; i < count; ++i) {
      tensors.push_back(RandomTensor(rng, "layers." + std::to_string(i) + ".w", world));
    }
    const std::string& base = cases % 8 == 0 ? disk_dir.path() : memory_dir.path();
    const std::string step_dir = JoinPath(base, StepDirName(cases));
    REQUIRE_OK(
        WriteTestCheckpoint(fs, step_dir, "roundtrip", cases, world, tensors, SmallLayout()));

    auto opened = CheckpointReader::Open(fs, step_dir, RandomReaderOptions(rng));
    REQUIRE_OK(opened);
    CheckpointReader& reader = **opened;

    // All B shards of all tensors in one Read (pieces shared between requests read once) or
    // one Read per shard.
    struct Expect {
      std::vector<std::byte> want;
      std::vector<std::byte> got;
    };
    std::vector<CheckpointReader::Request> requests;
    std::vector<Expect> expects;
    std::vector<std::string> what;
    for (const auto& t : tensors) {
      for (auto& g : RandomRequests(rng, t.shape)) {
        Expect e;
        e.want = ExtractShard(t.data, g, ElementSize(t.dtype));
        e.got.assign(e.want.size(), std::byte{0x5a});
        expects.push_back(std::move(e));
        what.push_back(t.name + " " + g.ToString());
        requests.push_back(CheckpointReader::Request{t.name, g, t.dtype, {}});
      }
    }
    for (size_t i = 0; i < requests.size(); ++i) {
      requests[i].dest = expects[i].got;
      if (Chance(rng, 0.15)) {  // memory behind a handle: bytes through a sink
        requests[i].sink = [dest = requests[i].dest](uint64_t offset, const std::byte* src,
                                                     uint64_t size) -> Status {
          if (offset + size > dest.size()) return Internal("sink past the end");
          std::memcpy(dest.data() + offset, src, size);
          return Status::Ok();
        };
        requests[i].dest = {};
      }
    }
    // Now and then some data files are "resident" (the daemon's hot cache).
    FileCache cache;
    CheckpointReader::ReadHooks hooks;
    const bool hot = Chance(rng, 0.25);
    if (hot) {
      for (uint32_t r = 0; r < world; ++r) {
        if (std::filesystem::exists(JoinPath(step_dir, DataFileName(r))) && Chance(rng, 0.5)) {
          cache.Load(step_dir, DataFileName(r));
        }
      }
      hooks.find_resident = [&cache](const std::string& file, uint64_t offset, uint64_t length) {
        return cache.Find(file, offset, length);
      };
    }
    CheckpointReader::ReadStats stats;
    if (Chance(rng, 0.5)) {
      REQUIRE_OK(reader.Read(requests, hot ? &hooks : nullptr, &stats));
    } else {
      for (const auto& r : requests)
        REQUIRE_OK(reader.Read({&r, 1}, hot ? &hooks : nullptr, &stats));
    }
    CHECK(stats.bytes_from_storage == reader.bytes_read());
    if (cache.files.empty()) CHECK(stats.bytes_from_memory == 0);
    for (size_t i = 0; i < requests.size(); ++i) {
      INFO("request " << what[i]);
      REQUIRE(expects[i].got == expects[i].want);
    }
    requests_checked += requests.size();

    if (cases % 10 == 0) {
      auto problems = reader.Verify();
      REQUIRE_OK(problems);
      REQUIRE(problems->empty());
    }
    REQUIRE_OK(fs->RemoveAll(step_dir));
  }
  REQUIRE(cases >= kMinCases);
  WARN("reader roundtrip: " << cases << " cases, " << requests_checked << " requests");
}

// ------------------------------------------------------------------ fixture for damage tests

struct Fixture {
  TempDir dir;
  FileSystem* fs = PosixFileSystem();
  std::string step_dir = JoinPath(dir.path(), StepDirName(7));
  std::vector<TestTensor> tensors;
  ckptd::v1::Manifest manifest;

  explicit Fixture(uint64_t seed) {
    Rng rng(seed);
    TestTensor a;  // two box shards on two ranks, several pieces each
    a.name = "embed.weight";
    a.dtype = "float32";
    a.shape = {37, 129};
    a.data = RandomBytes(rng, 37 * 129 * 4);
    a.shards = {{MustBox(a.shape, {0, 0}, {20, 129}), 0},
                {MustBox(a.shape, {20, 0}, {17, 129}), 1}};
    TestTensor b;  // flat shards, one replicated
    b.name = "opt.exp_avg";
    b.dtype = "bfloat16";
    b.shape = {5001};
    b.data = RandomBytes(rng, 5001 * 2);
    b.shards = {{MustFlat(b.shape, 0, 2500), 0},
                {MustFlat(b.shape, 2500, 2501), 1},
                {MustFlat(b.shape, 2500, 2501), 0}};
    TestTensor c;  // a small one: a single short piece
    c.name = "ln.bias";
    c.dtype = "float16";
    c.shape = {3, 7};
    c.data = RandomBytes(rng, 3 * 7 * 2);
    c.shards = {{MustBox(c.shape, {0, 0}, {3, 7}), 1}};
    tensors = {a, b, c};
    auto m = WriteTestCheckpoint(fs, step_dir, "damage", 7, 2, tensors, SmallLayout());
    REQUIRE_OK(m);
    manifest = *m;
  }

  std::string DataPath(const ckptd::v1::StoredShard& s) const {
    return JoinPath(step_dir, s.file());
  }

  std::unique_ptr<CheckpointReader> Open() {
    auto r = CheckpointReader::Open(fs, step_dir);
    REQUIRE_OK(r);
    return std::move(r).value();
  }

  // Reads the whole tensor; returns the status and, when ok, checks the bytes.
  Status ReadFull(CheckpointReader& reader, const TestTensor& t) {
    auto g = ShardGeometry::Full(t.shape);
    REQUIRE_OK(g);
    std::vector<std::byte> got(t.data.size());
    CheckpointReader::Request r{t.name, *g, t.dtype, got};
    Status s = reader.Read({&r, 1});
    if (s.ok()) REQUIRE(got == t.data);
    return s;
  }
};

void XorByteAt(const std::string& path, uint64_t offset, unsigned char mask) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  REQUIRE(f.good());
  f.seekg(static_cast<std::streamoff>(offset));
  char c;
  f.read(&c, 1);
  c = static_cast<char>(static_cast<unsigned char>(c) ^ mask);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
  f.close();
  REQUIRE(f.good());
}

bool Contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

TEST_CASE("a flipped byte anywhere in a shard is found by Verify and fails Read", "[reader]") {
  const uint64_t seed = testing::TestSeed();
  INFO("seed " << seed);
  Rng rng(seed);
  Fixture fx(seed);
  {
    auto reader = fx.Open();
    auto clean = reader->Verify();
    REQUIRE_OK(clean);
    REQUIRE(clean->empty());
  }

  for (int round = 0; round < 60; ++round) {
    const size_t ti = Uniform(rng, 0, fx.tensors.size() - 1);
    const auto& entry = fx.manifest.tensors(static_cast<int>(ti));
    const int si =
        static_cast<int>(Uniform(rng, 0, static_cast<uint64_t>(entry.shards_size()) - 1));
    const auto& shard = entry.shards(si);
    // First byte, last byte, a piece boundary, or anywhere.
    uint64_t at;
    switch (round % 4) {
      case 0:
        at = 0;
        break;
      case 1:
        at = shard.length() - 1;
        break;
      case 2:
        at = std::min<uint64_t>(shard.chunk_size(), shard.length() - 1);
        break;
      default:
        at = Uniform(rng, 0, shard.length() - 1);
    }
    const auto mask = static_cast<unsigned char>(Uniform(rng, 1, 255));
    const std::string path = fx.DataPath(shard);
    INFO("round " << round << ": tensor " << entry.name() << " shard " << si << " byte " << at
                  << " of " << shard.length() << " in " << path << " ^ " << int{mask});
    XorByteAt(path, shard.offset() + at, mask);

    auto reader = fx.Open();
    auto problems = reader->Verify();
    REQUIRE_OK(problems);
    REQUIRE(problems->size() == 1);
    const std::string& line = problems->front();
    INFO("verify: " << line);
    CHECK(Contains(line, "checksum mismatch"));
    CHECK(Contains(line, path));
    CHECK(Contains(line, entry.name()));
    CHECK(Contains(line, "piece " + std::to_string(at / shard.chunk_size())));
    CHECK(Contains(line, "offset " + std::to_string(shard.offset() +
                                                    at / shard.chunk_size() * shard.chunk_size())));

    // A request overlapping the damaged piece fails naming the file; for a replicated shard
    // the reader uses the first copy in the manifest, so read exactly the damaged shard's
    // bytes through a request that only this shard's piece can serve when it is the first.
    auto g = GeometryFromProto(shard.geometry(), fx.tensors[ti].shape);
    REQUIRE_OK(g);
    bool first_copy = true;
    for (int k = 0; k < si; ++k) {
      if (entry.shards(k).geometry().SerializeAsString() == shard.geometry().SerializeAsString()) {
        first_copy = false;
      }
    }
    std::vector<std::byte> dest(shard.length());
    CheckpointReader::Request r{entry.name(), *g, entry.dtype(), dest};
    Status s = reader->Read({&r, 1});
    if (first_copy) {
      INFO("read: " << s.ToString());
      REQUIRE(s.code() == StatusCode::kDataLoss);
      CHECK(Contains(s.message(), path));
      CHECK(Contains(s.message(), entry.name()));
      CHECK(Contains(s.message(), "piece " + std::to_string(at / shard.chunk_size())));
    } else {
      REQUIRE_OK(s);  // served by the intact replica
    }
    XorByteAt(path, shard.offset() + at, mask);  // repair
  }

  auto reader = fx.Open();
  auto clean = reader->Verify();
  REQUIRE_OK(clean);
  REQUIRE(clean->empty());
  for (const auto& t : fx.tensors) REQUIRE_OK(fx.ReadFull(*reader, t));
}

TEST_CASE(
    "VerifyRange checks the pieces wholly inside a range of held bytes, and names one that differs",
    "[reader]") {
  Fixture fx(testing::TestSeed());
  auto reader = fx.Open();
  // The first shard of "embed.weight" (rank 0's file), several 4 KiB pieces.
  const auto& shard = fx.manifest.tensors(0).shards(0);
  REQUIRE(shard.length() > 2 * shard.chunk_size());
  auto bytes = PosixFileSystem()->ReadFile(fx.DataPath(shard));
  REQUIRE_OK(bytes);
  std::vector<std::byte> file(bytes->size());
  std::memcpy(file.data(), bytes->data(), file.size());
  const std::string& name = shard.file();
  CHECK_OK(reader->VerifyRange(name, 0, file.data(), file.size()));

  // One flipped byte in the shard's second piece.
  const uint64_t piece = shard.offset() + shard.chunk_size();
  file[piece + 17] ^= std::byte{0x40};
  const Status whole = reader->VerifyRange(name, 0, file.data(), file.size());
  INFO(whole.ToString());
  CHECK(whole.code() == StatusCode::kDataLoss);
  CHECK(Contains(whole.message(), name));
  CHECK(Contains(whole.message(), "embed.weight"));
  CHECK(Contains(whole.message(), "[" + std::to_string(piece) + ", "));
  // A range holding that piece whole fails; ranges that hold only part of it, or none of it,
  // cannot check it and pass.
  CHECK(reader->VerifyRange(name, piece, file.data() + piece, shard.chunk_size()).code() ==
        StatusCode::kDataLoss);
  const uint64_t half = shard.chunk_size() / 2;
  CHECK_OK(reader->VerifyRange(name, piece + half, file.data() + piece + half, shard.chunk_size()));
  CHECK_OK(reader->VerifyRange(name, 0, file.data(), piece));
  // A file the manifest does not name has nothing to check.
  CHECK_OK(reader->VerifyRange("rank-00009.data", 0, file.data(), file.size()));
}

TEST_CASE("padding between shards is not checksummed", "[reader]") {
  Fixture fx(testing::TestSeed());
  // embed.weight shard 0 is 20*129*4 = 10320 bytes; the next shard starts on a 4 KiB boundary.
  const auto& shard = fx.manifest.tensors(0).shards(0);
  const uint64_t end = shard.offset() + shard.length();
  REQUIRE(end % 4096 != 0);
  XorByteAt(fx.DataPath(shard), end, 0xff);
  auto reader = fx.Open();
  auto problems = reader->Verify();
  REQUIRE_OK(problems);
  CHECK(problems->empty());
  for (const auto& t : fx.tensors) REQUIRE_OK(fx.ReadFull(*reader, t));
}

TEST_CASE("truncated and missing data files are reported", "[reader]") {
  Fixture fx(testing::TestSeed());
  const std::string rank1 = JoinPath(fx.step_dir, DataFileName(1));
  const uint64_t size = std::filesystem::file_size(rank1);

  SECTION("truncated") {
    std::filesystem::resize_file(rank1, size - 4096 - 100);
    auto reader = fx.Open();
    auto problems = reader->Verify();
    REQUIRE_OK(problems);
    REQUIRE(!problems->empty());
    bool named = false;
    for (const auto& p : *problems) {
      INFO(p);
      CHECK(Contains(p, rank1));
      named = named || Contains(p, "short data file");
    }
    CHECK(named);
    // Some tensor stored in rank 1 cannot be read in full now.
    int failures = 0;
    for (const auto& t : fx.tensors) {
      Status s = fx.ReadFull(*reader, t);
      if (s.ok()) continue;
      ++failures;
      INFO(s.ToString());
      CHECK(s.code() == StatusCode::kDataLoss);
      CHECK(Contains(s.message(), rank1));
    }
    CHECK(failures >= 1);
  }
  SECTION("truncated to nothing") {
    std::filesystem::resize_file(rank1, 0);
    auto reader = fx.Open();
    auto problems = reader->Verify();
    REQUIRE_OK(problems);
    CHECK(problems->size() >= 3);                    // every shard in rank 1
    Status s = fx.ReadFull(*reader, fx.tensors[2]);  // ln.bias lives only in rank 1
    INFO(s.ToString());
    CHECK(s.code() == StatusCode::kDataLoss);
    CHECK(Contains(s.message(), rank1));
    CHECK(Contains(s.message(), "ln.bias"));
  }
  SECTION("missing") {
    std::filesystem::remove(rank1);
    auto reader = fx.Open();
    auto problems = reader->Verify();
    REQUIRE_OK(problems);
    REQUIRE(problems->size() == 1);
    INFO(problems->front());
    CHECK(Contains(problems->front(), "missing data file " + rank1));
    Status s = fx.ReadFull(*reader, fx.tensors[2]);
    INFO(s.ToString());
    CHECK(s.code() == StatusCode::kDataLoss);
    CHECK(Contains(s.message(), rank1));
    CHECK(Contains(s.message(), "ln.bias"));
    // embed.weight rows 0..19 live in rank 0 only: still readable.
    auto g = ShardGeometry::Box(fx.tensors[0].shape, {0, 0}, {20, 129});
    REQUIRE_OK(g);
    std::vector<std::byte> got(20 * 129 * 4);
    CheckpointReader::Request r{"embed.weight", *g, "float32", got};
    REQUIRE_OK(reader->Read({&r, 1}));
    CHECK(got == ExtractShard(fx.tensors[0].data, *g, 4));
  }
}

TEST_CASE("bad requests name the tensor and what differs", "[reader]") {
  Fixture fx(testing::TestSeed());
  auto reader = fx.Open();
  std::vector<std::byte> buf(37 * 129 * 4);

  SECTION("unknown tensor") {
    auto g = ShardGeometry::Full({4});
    REQUIRE_OK(g);
    std::vector<std::byte> small(16);
    CheckpointReader::Request r{"no.such.tensor", *g, "float32", small};
    Status s = reader->Read({&r, 1});
    INFO(s.ToString());
    CHECK(s.code() == StatusCode::kNotFound);
    CHECK(Contains(s.message(), "no.such.tensor"));
    CHECK(reader->FindTensor("no.such.tensor") == nullptr);
    CHECK(reader->FindTensor("embed.weight") != nullptr);
  }
  SECTION("dtype mismatch") {
    auto g = ShardGeometry::Full({37, 129});
    REQUIRE_OK(g);
    std::vector<std::byte> half(37 * 129 * 2);
    CheckpointReader::Request r{"embed.weight", *g, "float16", half};
    Status s = reader->Read({&r, 1});
    INFO(s.ToString());
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK(Contains(s.message(), "embed.weight"));
    CHECK(Contains(s.message(), "float16"));
    CHECK(Contains(s.message(), "float32"));
  }
  SECTION("shape mismatch") {
    auto g = ShardGeometry::Full({129, 37});
    REQUIRE_OK(g);
    CheckpointReader::Request r{"embed.weight", *g, "float32", buf};
    Status s = reader->Read({&r, 1});
    INFO(s.ToString());
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK(Contains(s.message(), "embed.weight"));
    CHECK(Contains(s.message(), "[129, 37]"));
    CHECK(Contains(s.message(), "[37, 129]"));
  }
  SECTION("destination of the wrong size") {
    auto g = ShardGeometry::Full({37, 129});
    REQUIRE_OK(g);
    CheckpointReader::Request r{"embed.weight", *g, "float32",
                                std::span<std::byte>(buf).first(buf.size() - 4)};
    Status s = reader->Read({&r, 1});
    INFO(s.ToString());
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK(Contains(s.message(), "embed.weight"));
  }
  SECTION("one bad request fails the whole read") {
    auto full = ShardGeometry::Full({37, 129});
    auto other = ShardGeometry::Full({9});
    REQUIRE_OK(full);
    REQUIRE_OK(other);
    std::vector<std::byte> small(36);
    CheckpointReader::Request rs[] = {{"embed.weight", *full, "float32", buf},
                                      {"ln.bias", *other, "float16", small}};
    Status s = reader->Read(rs);
    INFO(s.ToString());
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK(Contains(s.message(), "ln.bias"));
  }
}

TEST_CASE("a tensor whose stored shards leave a hole cannot be read there", "[reader]") {
  TempDir dir;
  FileSystem* fs = PosixFileSystem();
  Rng rng(testing::TestSeed());
  TestTensor t;
  t.name = "partial";
  t.shape = {10, 10};
  t.data = RandomBytes(rng, 400);
  t.shards = {{MustBox(t.shape, {0, 0}, {6, 10}), 0}};  // rows 6..9 were never saved
  const std::string step = JoinPath(dir.path(), StepDirName(1));
  REQUIRE_OK(WriteTestCheckpoint(fs, step, "holes", 1, 1, {t}, SmallLayout()));
  auto reader = CheckpointReader::Open(fs, step);
  REQUIRE_OK(reader);

  std::vector<std::byte> got(400);
  auto full = ShardGeometry::Full(t.shape);
  REQUIRE_OK(full);
  CheckpointReader::Request r{"partial", *full, "float32", got};
  Status s = (*reader)->Read({&r, 1});
  INFO(s.ToString());
  CHECK(s.code() == StatusCode::kNotFound);
  CHECK(Contains(s.message(), "partial"));

  auto top = ShardGeometry::Box(t.shape, {2, 3}, {4, 5});  // inside what was saved
  REQUIRE_OK(top);
  std::vector<std::byte> part(4 * 5 * 4);
  CheckpointReader::Request ok{"partial", *top, "float32", part};
  REQUIRE_OK((*reader)->Read({&ok, 1}));
  CHECK(part == ExtractShard(t.data, *top, 4));
}

TEST_CASE("only the checksum pieces a request touches are read, each once", "[reader]") {
  TempDir dir;
  FileSystem* fs = PosixFileSystem();
  Rng rng(testing::TestSeed());
  TestTensor t;
  t.name = "big";
  t.dtype = "int32";
  t.shape = {64, 1024};  // 256 KiB: 64 pieces of 4 KiB, one row each
  t.data = RandomBytes(rng, 64 * 1024 * 4);
  t.shards = {{MustBox(t.shape, {0, 0}, {64, 1024}), 0}};
  const std::string step = JoinPath(dir.path(), StepDirName(3));
  REQUIRE_OK(WriteTestCheckpoint(fs, step, "pieces", 3, 1, {t}, SmallLayout()));
  auto reader = CheckpointReader::Open(fs, step);
  REQUIRE_OK(reader);

  // One element of row 5: one piece.
  auto one = ShardGeometry::Box(t.shape, {5, 17}, {1, 1});
  REQUIRE_OK(one);
  std::vector<std::byte> a(4), b(4);
  CheckpointReader::Request r1{"big", *one, "int32", a};
  REQUIRE_OK((*reader)->Read({&r1, 1}));
  CHECK((*reader)->bytes_read() == 4096);
  CHECK(a == ExtractShard(t.data, *one, 4));

  // The same element twice plus column 0 of rows 5..9 in one Read: 5 pieces, each read once.
  auto col = ShardGeometry::Box(t.shape, {5, 0}, {5, 1});
  REQUIRE_OK(col);
  std::vector<std::byte> c(5 * 4);
  CheckpointReader::Request rs[] = {
      {"big", *one, "int32", a}, {"big", *one, "int32", b}, {"big", *col, "int32", c}};
  REQUIRE_OK((*reader)->Read(rs));
  CHECK((*reader)->bytes_read() == 4096 + 5 * 4096);
  CHECK(a == b);
  CHECK(c == ExtractShard(t.data, *col, 4));
}

}  // namespace
}  // namespace ckpt

namespace ckpt {
namespace {

TEST_CASE("ReadHooks: resident pieces come from memory, the rest from storage", "[reader]") {
  Fixture fx(testing::TestSeed());
  auto reader = fx.Open();
  FileCache cache;
  std::mutex mu;
  std::vector<std::pair<std::string, uint64_t>> offered;  // guarded by mu
  int offered_wrong_bytes = 0;                            // guarded by mu
  CheckpointReader::ReadHooks hooks;
  hooks.find_resident = [&](const std::string& file, uint64_t offset, uint64_t length) {
    return cache.Find(file, offset, length);
  };
  // Runs on the I/O threads: no Catch assertions in here (Catch is not thread safe).
  hooks.on_storage_piece = [&](const std::string& file, uint64_t offset, const std::byte* data,
                               uint64_t length) {
    // Only verified bytes are offered: they match the file.
    auto bytes = PosixFileSystem()->ReadFile(JoinPath(fx.step_dir, file));
    const bool same = bytes.ok() && std::memcmp(bytes->data() + offset, data, length) == 0;
    std::lock_guard<std::mutex> lock(mu);
    offered.emplace_back(file, offset);
    if (!same) ++offered_wrong_bytes;
  };

  auto read_all = [&](CheckpointReader::ReadStats* stats) {
    std::vector<std::vector<std::byte>> got;
    got.reserve(fx.tensors.size());  // requests point into it
    std::vector<CheckpointReader::Request> requests;
    for (const auto& t : fx.tensors) {
      got.emplace_back(t.data.size());
      auto g = ShardGeometry::Full(t.shape);
      REQUIRE_OK(g);
      requests.push_back({t.name, *g, t.dtype, got.back()});
    }
    Status s = reader->Read(requests, &hooks, stats);
    CHECK(offered_wrong_bytes == 0);
    if (s.ok()) {
      for (size_t i = 0; i < fx.tensors.size(); ++i) CHECK(got[i] == fx.tensors[i].data);
    }
    return s;
  };

  SECTION("nothing resident: everything from storage, every piece offered once") {
    CheckpointReader::ReadStats stats;
    REQUIRE_OK(read_all(&stats));
    CHECK(stats.bytes_from_memory == 0);
    CHECK(stats.bytes_from_storage > 0);
    CHECK(stats.bytes_from_storage == reader->bytes_read());
    std::set<std::pair<std::string, uint64_t>> unique(offered.begin(), offered.end());
    CHECK(unique.size() == offered.size());
  }
  SECTION("everything resident: no data file is touched") {
    cache.Load(fx.step_dir, DataFileName(0));
    cache.Load(fx.step_dir, DataFileName(1));
    std::filesystem::remove(JoinPath(fx.step_dir, DataFileName(0)));
    std::filesystem::remove(JoinPath(fx.step_dir, DataFileName(1)));
    CheckpointReader::ReadStats stats;
    REQUIRE_OK(read_all(&stats));
    CHECK(stats.bytes_from_storage == 0);
    CHECK(reader->bytes_read() == 0);
    uint64_t logical = 0;  // each needed piece once; ln.bias and embed.weight read in full
    for (const auto& t : fx.tensors) logical += t.data.size();
    CHECK(stats.bytes_from_memory == logical);
    CHECK(offered.empty());
  }
  SECTION("one file resident, the other read") {
    cache.Load(fx.step_dir, DataFileName(1));
    std::filesystem::remove(JoinPath(fx.step_dir, DataFileName(1)));
    CheckpointReader::ReadStats stats;
    REQUIRE_OK(read_all(&stats));
    CHECK(stats.bytes_from_memory > 0);
    CHECK(stats.bytes_from_storage > 0);
    for (const auto& [file, offset] : offered) CHECK(file == DataFileName(0));
  }
  SECTION("damaged resident bytes are not used: the piece is read from storage") {
    cache.Load(fx.step_dir, DataFileName(0));
    cache.Load(fx.step_dir, DataFileName(1));
    const auto& shard = fx.manifest.tensors(0).shards(1);  // embed.weight rows 20..36, rank 1
    cache.files[shard.file()][shard.offset() + 5] ^= 0x01;
    CheckpointReader::ReadStats stats;
    REQUIRE_OK(read_all(&stats));
    CHECK(stats.bytes_from_storage == 4096);
    REQUIRE(offered.size() == 1);
    CHECK(offered[0] == std::pair<std::string, uint64_t>(shard.file(), shard.offset()));
  }
}

TEST_CASE("Request::sink receives every byte of the shard once, at its offset", "[reader]") {
  Fixture fx(testing::TestSeed());
  auto reader = fx.Open();
  Rng rng(testing::TestSeed() + 1);
  for (const auto& t : fx.tensors) {
    for (const auto& g : RandomRequests(rng, t.shape)) {
      const uint32_t es = ElementSize(t.dtype);
      std::vector<std::byte> got(g.numel() * es);
      std::vector<int> hits(got.size(), 0);
      std::mutex mu;
      CheckpointReader::Request r{t.name, g, t.dtype, {}};
      r.sink = [&](uint64_t offset, const std::byte* src, uint64_t size) -> Status {
        std::lock_guard<std::mutex> lock(mu);
        if (offset + size > got.size()) return Internal("sink past the end");
        std::memcpy(got.data() + offset, src, size);
        for (uint64_t i = offset; i < offset + size; ++i) ++hits[i];
        return Status::Ok();
      };
      INFO(t.name << " " << g.ToString());
      REQUIRE_OK(reader->Read({&r, 1}));
      CHECK(got == ExtractShard(t.data, g, es));
      CHECK(std::all_of(hits.begin(), hits.end(), [](int h) { return h == 1; }));
    }
  }
  // A failing sink fails the read with its status.
  auto g = ShardGeometry::Full(fx.tensors[0].shape);
  REQUIRE_OK(g);
  CheckpointReader::Request r{fx.tensors[0].name, *g, fx.tensors[0].dtype, {}};
  r.sink = [](uint64_t, const std::byte*, uint64_t) { return Unavailable("device gone"); };
  Status s = reader->Read({&r, 1});
  CHECK(s.code() == StatusCode::kUnavailable);
  CHECK(Contains(s.message(), "device gone"));
}

}  // namespace
}  // namespace ckpt
