// ManifestMerger: node manifests merged one at a time, as the coordinator folds in each node's
// report when it arrives, give the same manifest as a merge of all of them at once, and every
// check of the merge (replicas, ranks, skipped shards) holds whichever node comes first.
#include "common/manifest_merge.h"

#include <google/protobuf/util/message_differencer.h>

#include <algorithm>
#include <catch2/catch.hpp>

#include "common/checksum.h"
#include "common/manifest_io.h"
#include "common/step_layout.h"
#include "tests/test_util.h"

namespace ckpt {
namespace {

namespace pb = ckptd::v1;
using Catch::Matchers::Contains;

constexpr uint32_t kWorld = 4;

// Tensor "w", float32 [4, 1024]: row r is rank r's shard. With `replica`, tensor "norm",
// float32 [1024], held whole by every rank (a data-parallel replica).
pb::StoredShard RowShard(uint32_t row, uint32_t writer, uint64_t checksum) {
  pb::StoredShard s;
  auto* box = s.mutable_geometry()->mutable_box();
  box->add_offsets(row);
  box->add_offsets(0);
  box->add_lengths(1);
  box->add_lengths(1024);
  s.set_file(DataFileName(writer));
  s.set_offset(0);
  s.set_length(4096);
  s.set_chunk_size(4096);
  s.add_chunk_xxh3(checksum);
  s.set_writer_rank(writer);
  return s;
}

pb::StoredShard NormShard(uint32_t writer, uint64_t checksum) {
  pb::StoredShard s;
  s.mutable_geometry()->mutable_flat()->set_flat_offset(0);
  s.mutable_geometry()->mutable_flat()->set_numel(1024);
  s.set_file(DataFileName(writer));
  s.set_offset(4096);
  s.set_length(4096);
  s.set_chunk_size(4096);
  s.add_chunk_xxh3(checksum);
  s.set_writer_rank(writer);
  return s;
}

pb::TensorEntry Tensor(const std::string& name, std::vector<uint64_t> shape) {
  pb::TensorEntry t;
  t.set_name(name);
  t.set_dtype("float32");
  for (uint64_t d : shape) t.add_global_shape(d);
  return t;
}

// Node `id` holding `ranks`; each writes its row of "w" and its copy of "norm".
pb::NodeManifest Node(const std::string& id, std::vector<uint32_t> ranks) {
  pb::NodeManifest n;
  n.set_format_version(kFormatVersion);
  n.set_job("job");
  n.set_step(7);
  n.set_world_size(kWorld);
  n.set_node_id(id);
  auto* w = n.add_tensors();
  *w = Tensor("w", {kWorld, 1024});
  auto* norm = n.add_tensors();
  *norm = Tensor("norm", {1024});
  for (uint32_t r : ranks) {
    *w->add_shards() = RowShard(r, r, 100 + r);
    *norm->add_shards() = NormShard(r, 55);
    auto* re = n.add_ranks();
    re->set_rank(r);
    re->set_node_id(id);
  }
  return n;
}

pb::SkippedShard Skip(const pb::TensorEntry& t, const pb::StoredShard& s, uint32_t rank) {
  pb::SkippedShard k;
  k.set_name(t.name());
  k.set_dtype(t.dtype());
  *k.mutable_global_shape() = t.global_shape();
  *k.mutable_geometry() = s.geometry();
  k.set_rank(rank);
  return k;
}

Status MergeInOrder(const std::vector<pb::NodeManifest>& nodes, pb::Manifest* out) {
  ManifestMerger merger(out);
  for (const auto& n : nodes) {
    if (Status st = merger.Add(n); !st.ok()) return st;
  }
  return merger.Finish();
}

bool Same(const pb::Manifest& a, const pb::Manifest& b) {
  return google::protobuf::util::MessageDifferencer::Equals(a, b);
}

TEST_CASE("ManifestMerger node by node equals the merge of all nodes, in any order",
          "[manifest_merge]") {
  std::vector<pb::NodeManifest> nodes = {Node("b", {2, 3}), Node("a", {0, 1})};
  auto whole = MergeNodeManifests(nodes);
  REQUIRE_OK(whole);
  CHECK_OK(ValidateManifestForCommit(*whole));
  // Names and ranks in order; "norm", written by every rank, kept once: rank 0's copy.
  REQUIRE(whole->tensors_size() == 2);
  CHECK(whole->tensors(0).name() == "norm");
  REQUIRE(whole->tensors(0).shards_size() == 1);
  CHECK(whole->tensors(0).shards(0).writer_rank() == 0);
  CHECK(whole->tensors(1).shards_size() == 4);
  REQUIRE(whole->ranks_size() == 4);
  for (int r = 0; r < 4; ++r) CHECK(whole->ranks(r).rank() == static_cast<uint32_t>(r));

  std::reverse(nodes.begin(), nodes.end());
  pb::Manifest reversed;
  REQUIRE_OK(MergeInOrder(nodes, &reversed));
  // The shards of "w" keep their arrival order; compare after sorting them by writer.
  for (pb::Manifest* m : {&*whole, &reversed}) {
    auto* shards = m->mutable_tensors(1)->mutable_shards();
    std::sort(shards->pointer_begin(), shards->pointer_end(),
              [](auto* x, auto* y) { return x->writer_rank() < y->writer_rank(); });
  }
  CHECK(Same(*whole, reversed));

  MergeOnArena on_arena;
  for (const auto& n : nodes) REQUIRE_OK(on_arena.merger().Add(n));
  REQUIRE_OK(on_arena.merger().Finish());
  CHECK(on_arena.manifest().GetArena() != nullptr);
  auto* shards = on_arena.manifest().mutable_tensors(1)->mutable_shards();
  std::sort(shards->pointer_begin(), shards->pointer_end(),
            [](auto* x, auto* y) { return x->writer_rank() < y->writer_rank(); });
  CHECK(Same(on_arena.manifest(), reversed));
}

TEST_CASE("ManifestMerger accepts a skipped shard written before or after it was skipped",
          "[manifest_merge]") {
  // Node "a" writes "norm" (rank 0); node "b"'s ranks skip their replicas of it.
  pb::NodeManifest a = Node("a", {0, 1});
  pb::NodeManifest b = Node("b", {2, 3});
  b.mutable_tensors()->RemoveLast();  // "norm"
  const pb::TensorEntry norm = Tensor("norm", {1024});
  *b.add_skipped() = Skip(norm, NormShard(2, 55), 2);
  *b.add_skipped() = Skip(norm, NormShard(3, 55), 3);
  for (const auto& order :
       {std::vector<pb::NodeManifest>{a, b}, std::vector<pb::NodeManifest>{b, a}}) {
    pb::Manifest out;
    CHECK_OK(MergeInOrder(order, &out));
    CHECK(out.ranks_size() == 4);
  }
}

TEST_CASE("ManifestMerger fails a step whose skipped shard no rank wrote, naming rank and node",
          "[manifest_merge]") {
  pb::NodeManifest a = Node("a", {0, 1});
  pb::NodeManifest b = Node("b", {2, 3});
  const pb::TensorEntry w = Tensor("w", {kWorld, 1024});
  SECTION("a tensor nobody wrote") {
    *b.add_skipped() = Skip(Tensor("lost", {1024}), NormShard(2, 1), 2);
  }
  SECTION("a geometry nobody wrote") {
    pb::StoredShard two_rows = RowShard(0, 3, 1);
    two_rows.mutable_geometry()->mutable_box()->set_lengths(0, 2);
    *b.add_skipped() = Skip(w, two_rows, 3);
  }
  SECTION("the right geometry of another dtype") {
    pb::TensorEntry as_int = w;
    as_int.set_dtype("int32");
    *b.add_skipped() = Skip(as_int, RowShard(0, 3, 1), 3);
  }
  for (const auto& order :
       {std::vector<pb::NodeManifest>{a, b}, std::vector<pb::NodeManifest>{b, a}}) {
    pb::Manifest out;
    const Status st = MergeInOrder(order, &out);
    INFO(st.ToString());
    CHECK(st.code() == StatusCode::kFailedPrecondition);
    CHECK_THAT(st.message(), Contains("node 'b'") && Contains("no rank wrote it"));
  }
}

TEST_CASE("ManifestMerger refuses replicas with different bytes, and ranks reported twice",
          "[manifest_merge]") {
  std::vector<pb::NodeManifest> nodes = {Node("a", {0, 1}), Node("b", {2, 3})};
  SECTION("replicas that differ name both writers") {
    *nodes[1].mutable_tensors(1)->mutable_shards(1) = NormShard(3, 99);
    pb::Manifest out;
    const Status st = MergeInOrder(nodes, &out);
    CHECK(st.code() == StatusCode::kInvalidArgument);
    CHECK_THAT(st.message(), Contains("ranks 0 and 3") && Contains("different bytes"));
  }
  SECTION("a rank on two nodes") {
    nodes[1].mutable_ranks(0)->set_rank(1);
    pb::Manifest out;
    const Status st = MergeInOrder(nodes, &out);
    CHECK(st.code() == StatusCode::kInvalidArgument);
    CHECK_THAT(st.message(), Contains("rank 1 is reported by two nodes (second: 'b')"));
  }
}

TEST_CASE("ManifestMerger keeps its first error, and finishes once", "[manifest_merge]") {
  pb::Manifest out;
  SECTION("nothing to merge") {
    ManifestMerger merger(&out);
    CHECK(merger.Finish().code() == StatusCode::kInvalidArgument);
  }
  SECTION("a node of another step, then a good one") {
    ManifestMerger merger(&out);
    REQUIRE_OK(merger.Add(Node("a", {0, 1})));
    pb::NodeManifest other = Node("b", {2, 3});
    other.set_step(8);
    const Status st = merger.Add(other);
    CHECK_THAT(st.message(), Contains("step 8"));
    CHECK(merger.Add(Node("c", {2, 3})).message() == st.message());
    CHECK(merger.Finish().message() == st.message());
  }
  SECTION("finished") {
    ManifestMerger merger(&out);
    REQUIRE_OK(merger.Add(Node("a", {0, 1, 2, 3})));
    REQUIRE_OK(merger.Finish());
    CHECK(merger.Finish().code() == StatusCode::kFailedPrecondition);
    CHECK(merger.Add(Node("b", {0})).code() == StatusCode::kFailedPrecondition);
  }
}

}  // namespace
}  // namespace ckpt
