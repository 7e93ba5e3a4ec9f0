// Manifest files (common/manifest_io.h): the 32-byte header, damage detection, validation and
// merging of node manifests.
#include "common/manifest_io.h"
#include "common/manifest_merge.h"

#include <functional>
#include <string>
#include <vector>

#include "common/checksum.h"
#include "common/data_layout.h"
#include "common/step_layout.h"
#include "tests/test_util.h"

namespace ckpt {
namespace {

using Catch::Matchers::Contains;
using ckpt::testing::TempDir;
namespace pb = ckptd::v1;

uint64_t Le(std::string_view b, size_t at, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= uint64_t{static_cast<unsigned char>(b[at + i])} << (8 * i);
  return v;
}
void PutLe(std::string& b, size_t at, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) b[at + i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

pb::StoredShard BoxShard(std::vector<uint64_t> off, std::vector<uint64_t> len, uint64_t bytes,
                         const std::string& file, uint64_t offset, uint32_t rank) {
  pb::StoredShard s;
  s.mutable_geometry()->mutable_box();  // a scalar's box has no dimensions
  for (uint64_t o : off) s.mutable_geometry()->mutable_box()->add_offsets(o);
  for (uint64_t l : len) s.mutable_geometry()->mutable_box()->add_lengths(l);
  s.set_file(file);
  s.set_offset(offset);
  s.set_length(bytes);
  s.set_chunk_size(4096);
  for (uint32_t i = 0; i < ChunkCount(bytes, 4096); ++i) s.add_chunk_xxh3(0x1000 + i);
  s.set_writer_rank(rank);
  return s;
}

// "w": float32 [4, 1024] split by rows between ranks 0 and 1; "b": bfloat16 [10], one flat shard.
pb::TensorEntry TensorW() {
  pb::TensorEntry t;
  t.set_name("layers.0.w");
  t.set_dtype("float32");
  t.add_global_shape(4);
  t.add_global_shape(1024);
  return t;
}
pb::StoredShard WShard(uint32_t rank) {
  return BoxShard({2ull * rank, 0}, {2, 1024}, 2 * 1024 * 4, DataFileName(rank), 0, rank);
}
pb::TensorEntry TensorB() {
  pb::TensorEntry t;
  t.set_name("layers.0.b");
  t.set_dtype("bfloat16");
  t.add_global_shape(10);
  auto* s = t.add_shards();
  s->mutable_geometry()->mutable_flat()->set_flat_offset(0);
  s->mutable_geometry()->mutable_flat()->set_numel(10);
  s->set_file(DataFileName(0));
  s->set_offset(8192);
  s->set_length(20);
  s->set_chunk_size(4096);
  s->add_chunk_xxh3(0xabcdef);
  s->set_writer_rank(0);
  return t;
}

pb::Manifest ValidManifest() {
  pb::Manifest m;
  m.set_format_version(1);
  m.set_job("job-a");
  m.set_step(42);
  m.set_world_size(2);
  auto* w = m.add_tensors();
  *w = TensorW();
  *w->add_shards() = WShard(0);
  *w->add_shards() = WShard(1);
  *m.add_tensors() = TensorB();
  for (uint32_t r = 0; r < 2; ++r) {
    auto* re = m.add_ranks();
    re->set_rank(r);
    re->set_extra(std::string("rng\0state", 9) + std::to_string(r));
    re->set_node_id("node-" + std::to_string(r));
  }
  m.set_created_unix_ms(1'700'000'000'000);
  m.set_writer("ckptd test");
  return m;
}

pb::NodeManifest Node(const std::string& id, uint32_t rank) {
  pb::NodeManifest n;
  n.set_format_version(1);
  n.set_job("job-a");
  n.set_step(42);
  n.set_world_size(2);
  n.set_node_id(id);
  auto* w = n.add_tensors();
  *w = TensorW();
  *w->add_shards() = WShard(rank);
  if (rank == 0) *n.add_tensors() = TensorB();
  auto* r = n.add_ranks();
  r->set_rank(rank);
  r->set_node_id(id);
  return n;
}

// ---- Encoding ----

TEST_CASE("EncodeManifest writes the documented header, DecodeManifest round-trips", "[manifest]") {
  const pb::Manifest m = ValidManifest();
  const std::string bytes = EncodeManifest(m);
  REQUIRE(bytes.size() > 32);
  CHECK(bytes.substr(0, 8) == std::string("CKPTMAN\0", 8));
  CHECK(Le(bytes, 8, 4) == 1);
  CHECK(Le(bytes, 12, 4) == 0);
  CHECK(Le(bytes, 16, 8) == bytes.size() - 32);
  CHECK(Le(bytes, 24, 8) == Xxh3(bytes.data() + 32, bytes.size() - 32));

  auto back = DecodeManifest(bytes, "MANIFEST");
  REQUIRE_OK(back);
  CHECK(back->SerializeAsString() == m.SerializeAsString());
  CHECK(back->tensors(0).shards(1).geometry().box().offsets(0) == 2);
  CHECK(back->ranks(1).extra() == m.ranks(1).extra());
  CHECK_OK(ValidateManifest(*back));
}

TEST_CASE("EncodeNodeManifest uses its own magic and round-trips", "[manifest]") {
  const pb::NodeManifest n = Node("n0", 0);
  const std::string bytes = EncodeNodeManifest(n);
  CHECK(bytes.substr(0, 8) == std::string("CKPTNMF\0", 8));
  auto back = DecodeNodeManifest(bytes, "node-n0.nmf");
  REQUIRE_OK(back);
  CHECK(back->SerializeAsString() == n.SerializeAsString());
  // A node manifest is not a MANIFEST and vice versa.
  auto as_manifest = DecodeManifest(bytes, "x");
  REQUIRE_FALSE(as_manifest.ok());
  CHECK(as_manifest.status().code() == StatusCode::kDataLoss);
  auto as_node = DecodeNodeManifest(EncodeManifest(ValidManifest()), "x");
  REQUIRE_FALSE(as_node.ok());
  CHECK(as_node.status().code() == StatusCode::kDataLoss);
}

TEST_CASE("an empty manifest message still encodes and decodes", "[manifest]") {
  const std::string bytes = EncodeManifest(pb::Manifest());
  CHECK(bytes.size() == 32);
  REQUIRE_OK(DecodeManifest(bytes, "x"));
}

// ---- Damage ----

TEST_CASE("every truncation of a manifest file is kDataLoss naming the file", "[manifest]") {
  const std::string bytes = EncodeManifest(ValidManifest());
  for (size_t n = 0; n < bytes.size(); ++n) {
    INFO("cut to " << n << " of " << bytes.size() << " bytes");
    auto r = DecodeManifest(std::string_view(bytes).substr(0, n), "/pfs/j/step-1/MANIFEST");
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kDataLoss);
    CHECK_THAT(r.status().message(), Contains("/pfs/j/step-1/MANIFEST"));
  }
  // Extra bytes at the end are damage too.
  auto longer = DecodeManifest(bytes + "x", "m");
  REQUIRE_FALSE(longer.ok());
  CHECK(longer.status().code() == StatusCode::kDataLoss);
}

TEST_CASE("a flipped bit anywhere in the payload or its checksum is kDataLoss", "[manifest]") {
  const std::string bytes = EncodeManifest(ValidManifest());
  // From the header's checksum field on (the length field has its own test below).
  for (size_t i = 24; i < bytes.size(); ++i) {
    for (int bit : {0, 7}) {
      std::string damaged = bytes;
      damaged[i] = static_cast<char>(damaged[i] ^ (1 << bit));
      INFO("byte " << i << " bit " << bit);
      auto r = DecodeManifest(damaged, "m");
      REQUIRE_FALSE(r.ok());
      CHECK(r.status().code() == StatusCode::kDataLoss);
    }
  }
}

TEST_CASE("a wrong payload length in the header is kDataLoss", "[manifest]") {
  const std::string bytes = EncodeManifest(ValidManifest());
  for (uint64_t len : {uint64_t{0}, uint64_t{bytes.size() - 33}, uint64_t{bytes.size() - 31},
                       uint64_t{1} << 40, ~uint64_t{0}}) {
    std::string damaged = bytes;
    PutLe(damaged, 16, len, 8);
    INFO("length field " << len);
    auto r = DecodeManifest(damaged, "m");
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kDataLoss);
  }
}

TEST_CASE("bad magic is kDataLoss", "[manifest]") {
  std::string bytes = EncodeManifest(ValidManifest());
  bytes[0] = 'X';
  auto r = DecodeManifest(bytes, "/p/MANIFEST");
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == StatusCode::kDataLoss);
  CHECK_THAT(r.status().message(), Contains("magic"));
  CHECK_THAT(r.status().message(), Contains("/p/MANIFEST"));
  auto garbage = DecodeManifest(std::string(100, '\0'), "m");
  REQUIRE_FALSE(garbage.ok());
  CHECK(garbage.status().code() == StatusCode::kDataLoss);
}

TEST_CASE("a future or zero format version is kFailedPrecondition naming the version",
          "[manifest]") {
  for (uint32_t version : {2u, 7u, 0xffffffffu, 0u}) {
    std::string bytes = EncodeManifest(ValidManifest());
    PutLe(bytes, 8, version, 4);
    INFO("version " << version);
    auto r = DecodeManifest(bytes, "/p/MANIFEST");
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kFailedPrecondition);
    CHECK_THAT(r.status().message(), Contains("version " + std::to_string(version)));
  }
  std::string node = EncodeNodeManifest(Node("n", 0));
  PutLe(node, 8, 2, 4);
  auto r = DecodeNodeManifest(node, "n");
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == StatusCode::kFailedPrecondition);
}

// ---- Reading from a directory ----

Status WriteRaw(const std::string& path, std::string_view data) {
  ASSIGN_OR_RETURN(auto f, PosixFileSystem()->Open(
                               path, OpenOptions{.write = true, .create = true, .truncate = true}));
  RETURN_IF_ERROR(f->PWriteAll(data.data(), data.size(), 0));
  return f->Close();
}

TEST_CASE("ReadManifest: missing is kNotFound, damaged kDataLoss, invalid names the path",
          "[manifest]") {
  TempDir dir;
  FileSystem* fs = PosixFileSystem();
  const std::string step = dir / "step-0000000042";
  REQUIRE_OK(fs->CreateDirs(step));
  const std::string path = step + "/MANIFEST";

  auto missing = ReadManifest(fs, step);
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().code() == StatusCode::kNotFound);
  CHECK_THAT(missing.status().message(), Contains(path));

  REQUIRE_OK(WriteRaw(path, EncodeManifest(ValidManifest())));
  auto ok = ReadManifest(fs, step);
  REQUIRE_OK(ok);
  CHECK(ok->step() == 42);

  std::string damaged = EncodeManifest(ValidManifest());
  damaged.back() = static_cast<char>(damaged.back() ^ 1);
  REQUIRE_OK(WriteRaw(path, damaged));
  auto bad = ReadManifest(fs, step);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().code() == StatusCode::kDataLoss);
  CHECK_THAT(bad.status().message(), Contains(path));

  pb::Manifest invalid = ValidManifest();
  invalid.set_world_size(0);
  REQUIRE_OK(WriteRaw(path, EncodeManifest(invalid)));
  auto inv = ReadManifest(fs, step);
  REQUIRE_FALSE(inv.ok());
  CHECK(inv.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(inv.status().message(), Contains(path));

  const std::string nmf = step + "/node-n0.nmf";
  REQUIRE_OK(WriteRaw(nmf, EncodeNodeManifest(Node("n0", 0))));
  auto node = ReadNodeManifest(fs, nmf);
  REQUIRE_OK(node);
  CHECK(node->node_id() == "n0");
  auto no_node = ReadNodeManifest(fs, step + "/node-n1.nmf");
  REQUIRE_FALSE(no_node.ok());
  CHECK(no_node.status().code() == StatusCode::kNotFound);
}

// ---- Validation ----

struct Invalid {
  const char* what;
  std::function<void(pb::Manifest&)> mutate;
  StatusCode code;
  std::vector<std::string> mentions;
};

TEST_CASE("ValidateManifest rejects each invalid field with a message naming it", "[manifest]") {
  auto w = [](pb::Manifest& m) { return m.mutable_tensors(0); };
  auto w0 = [](pb::Manifest& m) { return m.mutable_tensors(0)->mutable_shards(0); };
  const std::string tw = "tensor 'layers.0.w'";
  const std::vector<Invalid> cases = {
      {"future format version",
       [](pb::Manifest& m) { m.set_format_version(2); },
       StatusCode::kFailedPrecondition,
       {"version 2"}},
      {"zero format version",
       [](pb::Manifest& m) { m.set_format_version(0); },
       StatusCode::kFailedPrecondition,
       {"version 0"}},
      {"job escaping the root",
       [](pb::Manifest& m) { m.set_job("../etc"); },
       StatusCode::kInvalidArgument,
       {"'../etc'"}},
      {"empty job", [](pb::Manifest& m) { m.set_job(""); }, StatusCode::kInvalidArgument, {"job"}},
      {"world size 0",
       [](pb::Manifest& m) { m.set_world_size(0); },
       StatusCode::kInvalidArgument,
       {"world size"}},
      {"empty tensor name",
       [&](pb::Manifest& m) { w(m)->set_name(""); },
       StatusCode::kInvalidArgument,
       {"tensor name is empty"}},
      {"control char in tensor name",
       [&](pb::Manifest& m) { w(m)->set_name("w\n"); },
       StatusCode::kInvalidArgument,
       {"'w\\x0a'"}},
      {"unknown dtype",
       [&](pb::Manifest& m) { w(m)->set_dtype("float33"); },
       StatusCode::kInvalidArgument,
       {tw, "'float33'"}},
      {"element count overflow",
       [&](pb::Manifest& m) {
         w(m)->clear_global_shape();
         w(m)->add_global_shape(1ull << 32);
         w(m)->add_global_shape(1ull << 32);
       },
       StatusCode::kInvalidArgument,
       {tw}},
      {"box outside the shape",
       [&](pb::Manifest& m) { w0(m)->mutable_geometry()->mutable_box()->set_offsets(0, 3); },
       StatusCode::kInvalidArgument,
       {tw, "shard 0"}},
      {"box of the wrong rank",
       [&](pb::Manifest& m) { w0(m)->mutable_geometry()->mutable_box()->add_offsets(0); },
       StatusCode::kInvalidArgument,
       {tw, "shard 0"}},
      {"flat range outside the shape",
       [](pb::Manifest& m) {
         m.mutable_tensors(1)->mutable_shards(0)->mutable_geometry()->mutable_flat()->set_numel(11);
       },
       StatusCode::kInvalidArgument,
       {"tensor 'layers.0.b'", "shard 0"}},
      {"no geometry",
       [&](pb::Manifest& m) { w0(m)->clear_geometry(); },
       StatusCode::kInvalidArgument,
       {tw, "neither box nor flat"}},
      {"length != numel × size",
       [&](pb::Manifest& m) { w0(m)->set_length(8191); },
       StatusCode::kInvalidArgument,
       {tw, "shard 0", "8191", "8192"}},
      {"unaligned offset",
       [&](pb::Manifest& m) { w(m)->mutable_shards(1)->set_offset(100); },
       StatusCode::kInvalidArgument,
       {tw, "shard 1", "offset 100"}},
      {"zero chunk size",
       [&](pb::Manifest& m) { w0(m)->set_chunk_size(0); },
       StatusCode::kInvalidArgument,
       {tw, "chunk size 0"}},
      {"unaligned chunk size",
       [&](pb::Manifest& m) { w0(m)->set_chunk_size(1000); },
       StatusCode::kInvalidArgument,
       {tw, "chunk size 1000"}},
      {"too few checksums",
       [&](pb::Manifest& m) { w0(m)->mutable_chunk_xxh3()->RemoveLast(); },
       StatusCode::kInvalidArgument,
       {tw, "1 checksums"}},
      {"too many checksums",
       [&](pb::Manifest& m) { w0(m)->add_chunk_xxh3(1); },
       StatusCode::kInvalidArgument,
       {tw, "3 checksums"}},
      {"empty file name",
       [&](pb::Manifest& m) { w0(m)->set_file(""); },
       StatusCode::kInvalidArgument,
       {tw, "data file name"}},
      {"file name with a slash",
       [&](pb::Manifest& m) { w0(m)->set_file("../x/rank-00000.data"); },
       StatusCode::kInvalidArgument,
       {tw, "'../x/rank-00000.data'"}},
      {"file name '..'",
       [&](pb::Manifest& m) { w0(m)->set_file(".."); },
       StatusCode::kInvalidArgument,
       {tw, "'..'"}},
      {"file name '.'",
       [&](pb::Manifest& m) { w0(m)->set_file("."); },
       StatusCode::kInvalidArgument,
       {tw, "'.'"}},
      {"file name with NUL",
       [&](pb::Manifest& m) { w0(m)->set_file(std::string("a\0b", 3)); },
       StatusCode::kInvalidArgument,
       {tw, "'a\\x00b'"}},
      {"writer rank past world size",
       [&](pb::Manifest& m) { w0(m)->set_writer_rank(2); },
       StatusCode::kInvalidArgument,
       {tw, "writer rank 2"}},
      {"partly overlapping shards",
       [&](pb::Manifest& m) {
         // Rows 1..3 overlap rows 0..2 and rows 2..4 without being equal to either.
         *w(m)->add_shards() =
             BoxShard({1, 0}, {2, 1024}, 2 * 1024 * 4, "rank-00000.data", 16384, 0);
       },
       StatusCode::kInvalidArgument,
       {"layers.0.w"}},
      {"tensor listed twice",
       [](pb::Manifest& m) { *m.add_tensors() = m.tensors(1); },
       StatusCode::kInvalidArgument,
       {"tensor 'layers.0.b'", "twice"}},
      {"rank past world size",
       [](pb::Manifest& m) { m.mutable_ranks(1)->set_rank(5); },
       StatusCode::kInvalidArgument,
       {"rank 5"}},
  };
  for (const Invalid& c : cases) {
    pb::Manifest m = ValidManifest();
    c.mutate(m);
    const Status s = ValidateManifest(m);
    INFO(c.what << " -> " << s.ToString());
    REQUIRE_FALSE(s.ok());
    CHECK(s.code() == c.code);
    for (const auto& text : c.mentions) CHECK_THAT(s.message(), Contains(text));
  }
}

TEST_CASE("ValidateManifest accepts replicas, empty shards, scalars and no tensors", "[manifest]") {
  pb::Manifest m = ValidManifest();
  // A data-parallel replica of rank 0's shard, written by rank 1.
  *m.mutable_tensors(0)->add_shards() =
      BoxShard({0, 0}, {2, 1024}, 8192, "rank-00001.data", 8192, 1);
  // A scalar.
  auto* s = m.add_tensors();
  s->set_name("step_count");
  s->set_dtype("int64");
  *s->add_shards() = BoxShard({}, {}, 8, "rank-00000.data", 12288, 0);
  // A tensor with a zero-sized dimension: no bytes, no checksums.
  auto* e = m.add_tensors();
  e->set_name("empty");
  e->set_dtype("float16");
  e->add_global_shape(0);
  e->add_global_shape(7);
  *e->add_shards() = BoxShard({0, 0}, {0, 7}, 0, "rank-00000.data", 16384, 0);
  CHECK_OK(ValidateManifest(m));

  pb::Manifest none = ValidManifest();
  none.clear_tensors();
  none.clear_ranks();
  CHECK_OK(ValidateManifest(none));
}

// Regression: ValidateTensor computes numel × element size without an overflow check. A
// float32 tensor of shape [2^62] held as one flat shard needs 2^64 bytes, which wraps to 0, so a
// shard claiming length 0 (and no checksums) passes validation; a reader then trusts a 0-byte
// shard for 2^62 elements.
TEST_CASE("ValidateManifest rejects a shard whose byte length overflows 64 bits", "[manifest]") {
  pb::Manifest m = ValidManifest();
  auto* t = m.add_tensors();
  t->set_name("huge");
  t->set_dtype("float32");
  t->add_global_shape(1ull << 62);
  auto* s = t->add_shards();
  s->mutable_geometry()->mutable_flat()->set_flat_offset(0);
  s->mutable_geometry()->mutable_flat()->set_numel(1ull << 62);
  s->set_file("rank-00000.data");
  s->set_offset(0);
  s->set_length(0);  // (2^62 × 4) mod 2^64
  s->set_chunk_size(4096);
  const Status st = ValidateManifest(m);
  INFO(st.ToString());
  CHECK_FALSE(st.ok());
}

// ---- Geometry conversion ----

TEST_CASE("GeometryToProto and GeometryFromProto round-trip boxes and flat ranges", "[manifest]") {
  const Shape shape = {8, 16};
  auto box = ShardGeometry::Box(shape, {2, 4}, {3, 12});
  REQUIRE_OK(box);
  auto box_back = GeometryFromProto(GeometryToProto(*box), shape);
  REQUIRE_OK(box_back);
  CHECK(*box_back == *box);

  auto flat = ShardGeometry::Flat(shape, 17, 50);
  REQUIRE_OK(flat);
  auto flat_back = GeometryFromProto(GeometryToProto(*flat), shape);
  REQUIRE_OK(flat_back);
  CHECK(*flat_back == *flat);

  auto none = GeometryFromProto(pb::ShardGeometry(), shape);
  REQUIRE_FALSE(none.ok());
  CHECK(none.status().code() == StatusCode::kInvalidArgument);
}

// ---- Merging node manifests ----

TEST_CASE("MergeNodeManifests joins shards of a tensor and sorts ranks", "[manifest]") {
  // Given in reverse so that sorting is visible.
  const std::vector<pb::NodeManifest> nodes = {Node("node-b", 1), Node("node-a", 0)};
  auto merged = MergeNodeManifests(nodes);
  REQUIRE_OK(merged);
  CHECK(merged->format_version() == kFormatVersion);
  CHECK(merged->job() == "job-a");
  CHECK(merged->step() == 42);
  CHECK(merged->world_size() == 2);
  REQUIRE(merged->tensors_size() == 2);
  const pb::TensorEntry* w = nullptr;
  for (const auto& t : merged->tensors()) {
    if (t.name() == "layers.0.w") w = &t;
  }
  REQUIRE(w != nullptr);
  REQUIRE(w->shards_size() == 2);
  std::vector<uint32_t> writers = {w->shards(0).writer_rank(), w->shards(1).writer_rank()};
  std::sort(writers.begin(), writers.end());
  CHECK(writers == std::vector<uint32_t>{0, 1});
  REQUIRE(merged->ranks_size() == 2);
  CHECK(merged->ranks(0).rank() == 0);
  CHECK(merged->ranks(0).node_id() == "node-a");
  CHECK(merged->ranks(1).rank() == 1);
  CHECK(merged->ranks(1).node_id() == "node-b");
  CHECK_OK(ValidateManifest(*merged));
}

TEST_CASE("MergeNodeManifests rejects a dtype or shape disagreement naming both nodes",
          "[manifest]") {
  std::vector<pb::NodeManifest> nodes = {Node("node-a", 0), Node("node-b", 1)};
  nodes[1].mutable_tensors(0)->set_dtype("bfloat16");
  auto r = MergeNodeManifests(nodes);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(r.status().message(), Contains("layers.0.w"));
  CHECK_THAT(r.status().message(), Contains("node-a"));
  CHECK_THAT(r.status().message(), Contains("node-b"));

  nodes = {Node("node-a", 0), Node("node-b", 1)};
  nodes[1].mutable_tensors(0)->set_global_shape(1, 2048);
  auto shape = MergeNodeManifests(nodes);
  REQUIRE_FALSE(shape.ok());
  CHECK_THAT(shape.status().message(), Contains("layers.0.w"));
  CHECK_THAT(shape.status().message(), Contains("node-a"));
  CHECK_THAT(shape.status().message(), Contains("node-b"));
}

TEST_CASE("MergeNodeManifests rejects a rank reported by two nodes", "[manifest]") {
  std::vector<pb::NodeManifest> nodes = {Node("node-a", 0), Node("node-b", 1)};
  nodes[1].mutable_ranks(0)->set_rank(0);
  auto r = MergeNodeManifests(nodes);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(r.status().message(), Contains("rank 0"));
  CHECK_THAT(r.status().message(), Contains("node-b"));
}

TEST_CASE("MergeNodeManifests rejects nodes of another job or step, and nothing", "[manifest]") {
  std::vector<pb::NodeManifest> nodes = {Node("node-a", 0), Node("node-b", 1)};
  nodes[1].set_step(43);
  auto step = MergeNodeManifests(nodes);
  REQUIRE_FALSE(step.ok());
  CHECK_THAT(step.status().message(), Contains("node-b"));

  nodes = {Node("node-a", 0), Node("node-b", 1)};
  nodes[1].set_job("job-b");
  auto job = MergeNodeManifests(nodes);
  REQUIRE_FALSE(job.ok());
  CHECK_THAT(job.status().message(), Contains("job-b"));

  auto none = MergeNodeManifests({});
  REQUIRE_FALSE(none.ok());
  CHECK(none.status().code() == StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ckpt

TEST_CASE("MergeNodeManifests keeps one copy of a replica written by several ranks", "[manifest]") {
  ckptd::v1::NodeManifest a, b;
  for (auto* m : {&a, &b}) {
    m->set_format_version(ckpt::kFormatVersion);
    m->set_job("j");
    m->set_step(1);
    m->set_world_size(2);
  }
  a.set_node_id("a");
  b.set_node_id("b");
  auto add = [](ckptd::v1::NodeManifest& m, uint32_t rank) {
    auto* t = m.add_tensors();
    t->set_name("w");
    t->set_dtype("int32");
    t->add_global_shape(1024);
    auto* s = t->add_shards();
    s->mutable_geometry()->mutable_box()->add_offsets(0);
    s->mutable_geometry()->mutable_box()->add_lengths(1024);
    s->set_file(ckpt::DataFileName(rank));
    s->set_length(4096);
    s->set_chunk_size(4096);
    s->add_chunk_xxh3(7);
    s->set_writer_rank(rank);
    m.add_ranks()->set_rank(rank);
  };
  add(b, 1);
  add(a, 0);
  std::vector<ckptd::v1::NodeManifest> nodes = {b, a};
  auto merged = ckpt::MergeNodeManifests(nodes);
  REQUIRE(merged.ok());
  REQUIRE(merged->tensors_size() == 1);
  REQUIRE(merged->tensors(0).shards_size() == 1);
  CHECK(merged->tensors(0).shards(0).writer_rank() == 0);  // the lowest writer rank's copy
  CHECK(ckpt::ValidateManifest(*merged).ok());
}

namespace ckpt {
namespace {

// ---- What a commit requires ----

TEST_CASE("MergeNodeManifests refuses replicas that hold different bytes, naming both ranks",
          "[manifest]") {
  pb::NodeManifest a = Node("a", 0), b = Node("b", 1);
  // Both ranks hold all of "layers.0.w" (data-parallel replicas): same geometry.
  for (auto* n : {&a, &b}) {
    auto* shards = n->mutable_tensors(0)->mutable_shards();
    const uint32_t rank = shards->Get(0).writer_rank();
    shards->Clear();
    *shards->Add() = BoxShard({0, 0}, {4, 1024}, 4 * 1024 * 4, DataFileName(rank), 0, rank);
  }
  std::vector<pb::NodeManifest> nodes = {a, b};
  REQUIRE_OK(MergeNodeManifests(nodes));  // equal checksums: one copy kept
  b.mutable_tensors(0)->mutable_shards(0)->set_chunk_xxh3(2, 0xbad);
  nodes = {a, b};
  auto merged = MergeNodeManifests(nodes);
  REQUIRE_FALSE(merged.ok());
  CHECK(merged.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(merged.status().message(),
             Contains("layers.0.w") && Contains("ranks 0 and 1") && Contains("chunk 2"));
}

TEST_CASE("CheckManifestCoverage names the tensor, the first hole and who saved it", "[manifest]") {
  pb::Manifest m = ValidManifest();
  REQUIRE_OK(CheckManifestCoverage(m));
  // Rank 1's rows of "w" are missing: elements from [2, 0] on are in no shard.
  m.mutable_tensors(0)->mutable_shards()->RemoveLast();
  REQUIRE_OK(ValidateManifest(m));  // a reader may still load what is there
  const Status st = CheckManifestCoverage(m);
  CHECK(st.code() == StatusCode::kNotFound);
  CHECK_THAT(st.message(),
             Contains("layers.0.w") && Contains("element [2, 0]") && Contains("rank 0"));
}

TEST_CASE("ValidateManifest rejects a tensor whose whole size does not fit in 63 bits",
          "[manifest]") {
  pb::Manifest m = ValidManifest();
  auto* t = m.add_tensors();
  t->set_name("huge");
  t->set_dtype("float32");
  t->add_global_shape(1ull << 61);  // 2^63 bytes: one byte too many
  *t->add_shards() = BoxShard({0}, {1024}, 4096, DataFileName(0), 0, 0);
  const Status st = ValidateManifest(m);
  CHECK(st.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(st.message(), Contains("huge") && Contains("2^63 bytes"));
  t->set_global_shape(0, (1ull << 61) - 1);  // fits
  CHECK_OK(ValidateManifest(m));
}

TEST_CASE("ResolveReadableLatest falls back past a committed step whose MANIFEST is damaged",
          "[manifest]") {
  TempDir dir;
  FileSystem* fs = PosixFileSystem();
  const std::string job_dir = dir / "job-a";
  for (uint64_t step : {41, 42}) {
    pb::Manifest m = ValidManifest();
    m.set_step(step);
    const std::string step_dir = JoinPath(job_dir, StepDirName(step));
    REQUIRE_OK(fs->CreateDirs(step_dir));
    REQUIRE_OK(WriteRaw(step_dir + "/MANIFEST", EncodeManifest(m)));
  }
  REQUIRE_OK(WriteRaw(job_dir + "/LATEST", "42\n"));
  auto latest = ResolveReadableLatest(fs, job_dir);
  REQUIRE_OK(latest);
  CHECK(*latest == std::optional<uint64_t>(42));

  // Truncated after the commit (the measurement: "10 bytes is shorter than the header").
  REQUIRE_OK(WriteRaw(JoinPath(job_dir, StepDirName(42)) + "/MANIFEST", "0123456789"));
  std::vector<uint64_t> damaged;
  latest = ResolveReadableLatest(fs, job_dir, &damaged);
  REQUIRE_OK(latest);
  CHECK(*latest == std::optional<uint64_t>(41));
  CHECK(damaged == std::vector<uint64_t>{42});

  REQUIRE_OK(WriteRaw(JoinPath(job_dir, StepDirName(41)) + "/MANIFEST", ""));
  latest = ResolveReadableLatest(fs, job_dir);
  REQUIRE_OK(latest);
  CHECK(!latest->has_value());
}

}  // namespace
}  // namespace ckpt
