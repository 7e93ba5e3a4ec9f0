#include "common/geometry.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "tests/test_util.h"

namespace ckpt {
namespace {

using Catch::Matchers::Contains;

constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();

template <typename T>
T Unwrap(Result<T> r) {
  REQUIRE_OK(r);
  return std::move(r).value();
}

ShardGeometry MakeBox(Shape shape, Shape offsets, Shape lengths) {
  return Unwrap(ShardGeometry::Box(std::move(shape), std::move(offsets), std::move(lengths)));
}
ShardGeometry MakeFlat(Shape shape, uint64_t offset, uint64_t numel) {
  return Unwrap(ShardGeometry::Flat(std::move(shape), offset, numel));
}
ShardGeometry MakeFull(Shape shape) { return Unwrap(ShardGeometry::Full(std::move(shape))); }

// ---- Reference model: brute force, independent of the code under test. ----

uint64_t RefNumel(const Shape& shape) {
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;
  return n;
}

// Global flat indices of a shard's elements, in the order of the shard's own bytes.
std::vector<uint64_t> RefElements(const ShardGeometry& g) {
  std::vector<uint64_t> out;
  if (g.kind() == ShardGeometry::Kind::kFlat) {
    for (uint64_t i = 0; i < g.numel(); ++i) out.push_back(g.flat_offset() + i);
    return out;
  }
  const Shape& shape = g.global_shape();
  const Shape& len = g.lengths();
  if (RefNumel(len) == 0) return out;
  Shape idx(shape.size(), 0);
  while (true) {
    uint64_t flat = 0;
    for (size_t d = 0; d < shape.size(); ++d) flat = flat * shape[d] + g.offsets()[d] + idx[d];
    out.push_back(flat);
    size_t d = shape.size();
    while (d > 0 && ++idx[d - 1] == len[d - 1]) idx[--d] = 0;
    if (d == 0) break;
  }
  return out;
}

std::string RefShape(const Shape& shape) {
  std::string s = "[";
  for (size_t d = 0; d < shape.size(); ++d) s += (d ? ", " : "") + std::to_string(shape[d]);
  return s + "]";
}

std::string RefCoordinates(const Shape& shape, uint64_t flat) {
  Shape c(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    c[d] = flat % shape[d];
    flat /= shape[d];
  }
  return RefShape(c);
}

// ---- ShapeNumel ----

TEST_CASE("ShapeNumel multiplies dims and rejects more than 2^63 elements", "[geometry]") {
  CHECK(Unwrap(ShapeNumel(Shape{})) == 1);
  CHECK(Unwrap(ShapeNumel(Shape{2, 3, 4})) == 24);
  CHECK(Unwrap(ShapeNumel(Shape{5, 0, 7})) == 0);
  CHECK(Unwrap(ShapeNumel(Shape{kMax, 0})) == 0);
  CHECK(Unwrap(ShapeNumel(Shape{uint64_t{1} << 31, uint64_t{1} << 32})) == uint64_t{1} << 63);

  auto too_big = ShapeNumel(Shape{(uint64_t{1} << 31) + 1, uint64_t{1} << 32});
  REQUIRE_FALSE(too_big.ok());
  CHECK(too_big.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(too_big.status().message(), Contains("[2147483649, 4294967296]"));
  CHECK_THAT(too_big.status().message(), Contains("2^63"));

  auto wraps = ShapeNumel(Shape{kMax, 2});
  REQUIRE_FALSE(wraps.ok());
  CHECK(wraps.status().code() == StatusCode::kInvalidArgument);
}

// ---- Construction and validation ----

TEST_CASE("Box validates rank, bounds and overflow with messages quoting the shapes",
          "[geometry]") {
  SECTION("rank mismatch") {
    auto r = ShardGeometry::Box({16, 16}, {0}, {4, 4});
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kInvalidArgument);
    CHECK_THAT(r.status().message(), Contains("offsets [0]"));
    CHECK_THAT(r.status().message(), Contains("lengths [4, 4]"));
    CHECK_THAT(r.status().message(), Contains("[16, 16]"));
    CHECK_FALSE(ShardGeometry::Box({16, 16}, {0, 0}, {4, 4, 1}).ok());
  }
  SECTION("offset + length beyond the dimension") {
    auto r = ShardGeometry::Box({16, 16}, {0, 8}, {4, 9});
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kInvalidArgument);
    CHECK_THAT(r.status().message(), Contains("box[0:4, 8:17]"));
    CHECK_THAT(r.status().message(), Contains("[16, 16]"));
    CHECK_THAT(r.status().message(), Contains("dimension 1"));
    REQUIRE_OK(ShardGeometry::Box({16, 16}, {0, 8}, {4, 8}));
    REQUIRE_OK(ShardGeometry::Box({16, 16}, {16, 0}, {0, 16}));  // empty, at the edge
    CHECK_FALSE(ShardGeometry::Box({16, 16}, {17, 0}, {0, 16}).ok());
  }
  SECTION("offset + length overflows") {
    auto r = ShardGeometry::Box({16}, {kMax - 1}, {5});
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kInvalidArgument);
    CHECK_THAT(r.status().message(), Contains("18446744073709551614+5"));
    CHECK_THAT(r.status().message(), Contains("[16]"));
  }
  SECTION("global shape too large") {
    auto r = ShardGeometry::Full({uint64_t{1} << 32, uint64_t{1} << 32});
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kInvalidArgument);
    CHECK_THAT(r.status().message(), Contains("[4294967296, 4294967296]"));
  }
}

TEST_CASE("Flat validates its range against the global shape", "[geometry]") {
  ShardGeometry ok = MakeFlat({16, 16}, 200, 56);
  CHECK(ok.numel() == 56);
  CHECK(ok.flat_offset() == 200);
  CHECK(ok.kind() == ShardGeometry::Kind::kFlat);

  auto beyond = ShardGeometry::Flat({16, 16}, 200, 57);
  REQUIRE_FALSE(beyond.ok());
  CHECK(beyond.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(beyond.status().message(), Contains("[16, 16]"));
  CHECK_THAT(beyond.status().message(), Contains("256 elements"));
  CHECK_THAT(beyond.status().message(), Contains("200"));

  auto overflow = ShardGeometry::Flat({16}, kMax, 2);
  REQUIRE_FALSE(overflow.ok());
  CHECK(overflow.status().code() == StatusCode::kInvalidArgument);

  CHECK_FALSE(ShardGeometry::Flat({kMax, kMax}, 0, 1).ok());
  REQUIRE_OK(ShardGeometry::Flat({16}, 16, 0));
  REQUIRE_OK(ShardGeometry::Flat({}, 0, 1));
  CHECK_FALSE(ShardGeometry::Flat({}, 1, 1).ok());
}

TEST_CASE("Full is the whole tensor as a box", "[geometry]") {
  ShardGeometry full = MakeFull({3, 5});
  CHECK(full.kind() == ShardGeometry::Kind::kBox);
  CHECK(full.offsets() == Shape{0, 0});
  CHECK(full.lengths() == Shape{3, 5});
  CHECK(full.numel() == 15);
  CHECK(full == MakeBox({3, 5}, {0, 0}, {3, 5}));

  ShardGeometry scalar = MakeFull({});
  CHECK(scalar.numel() == 1);
  CHECK(scalar.ToString() == "box[] of []");
}

// ---- Runs ----

TEST_CASE("Runs of a box are its innermost rows, merged over full trailing dims", "[geometry]") {
  CHECK(MakeFull({16, 16}).Runs() == std::vector<Run>{{0, 256, 0}});
  CHECK(MakeBox({16, 16}, {0, 8}, {4, 8}).Runs() ==
        std::vector<Run>{{8, 8, 0}, {24, 8, 8}, {40, 8, 16}, {56, 8, 24}});
  CHECK(MakeBox({16, 16}, {2, 0}, {2, 16}).Runs() == std::vector<Run>{{32, 32, 0}});
  CHECK(MakeBox({8, 8}, {3, 2}, {1, 3}).Runs() == std::vector<Run>{{26, 3, 0}});

  // [4, 3, 5]: strides 15, 5, 1.
  CHECK(MakeBox({4, 3, 5}, {1, 0, 0}, {2, 3, 5}).Runs() == std::vector<Run>{{15, 30, 0}});
  CHECK(MakeBox({4, 3, 5}, {1, 1, 0}, {2, 1, 5}).Runs() ==
        std::vector<Run>{{20, 5, 0}, {35, 5, 5}});
  CHECK(MakeBox({4, 3, 5}, {1, 0, 2}, {2, 3, 2}).Runs() ==
        std::vector<Run>{{17, 2, 0}, {22, 2, 2}, {27, 2, 4}, {32, 2, 6}, {37, 2, 8}, {42, 2, 10}});
  CHECK(MakeBox({4, 3, 5}, {1, 1, 0}, {3, 2, 5}).Runs() ==
        std::vector<Run>{{20, 10, 0}, {35, 10, 10}, {50, 10, 20}});

  ShardGeometry empty = MakeBox({16, 16}, {0, 3}, {4, 0});
  CHECK(empty.numel() == 0);
  CHECK(empty.Runs().empty());
  CHECK(MakeFull({4, 0, 3}).Runs().empty());

  CHECK(MakeFull({}).Runs() == std::vector<Run>{{0, 1, 0}});
}

TEST_CASE("Runs of a flat range are the range itself", "[geometry]") {
  CHECK(MakeFlat({16, 16}, 100, 150).Runs() == std::vector<Run>{{100, 150, 0}});
  CHECK(MakeFlat({16, 16}, 5, 0).Runs().empty());
  CHECK(MakeFlat({}, 0, 1).Runs() == std::vector<Run>{{0, 1, 0}});
}

// ---- ToString, operator==, FlatIndexToString ----

TEST_CASE("ToString names kind, extent and global shape", "[geometry]") {
  CHECK(MakeBox({16, 16}, {0, 8}, {4, 8}).ToString() == "box[0:4, 8:16] of [16, 16]");
  CHECK(MakeFlat({16, 16}, 100, 150).ToString() == "flat[100:250) of [16, 16]");
  CHECK(MakeBox({7}, {7}, {0}).ToString() == "box[7:7] of [7]");
  CHECK(MakeFlat({}, 0, 1).ToString() == "flat[0:1) of []");
}

TEST_CASE("ShardGeometry equality compares kind, shape and extent", "[geometry]") {
  CHECK(MakeBox({8, 8}, {0, 4}, {8, 4}) == MakeBox({8, 8}, {0, 4}, {8, 4}));
  CHECK_FALSE(MakeBox({8, 8}, {0, 4}, {8, 4}) == MakeBox({8, 8}, {0, 0}, {8, 4}));
  CHECK_FALSE(MakeBox({8, 8}, {0, 4}, {8, 4}) == MakeBox({8, 8}, {0, 4}, {7, 4}));
  CHECK_FALSE(MakeBox({8, 8}, {0, 4}, {8, 4}) == MakeBox({8, 9}, {0, 4}, {8, 4}));
  CHECK(MakeFlat({8, 8}, 3, 9) == MakeFlat({8, 8}, 3, 9));
  CHECK_FALSE(MakeFlat({8, 8}, 3, 9) == MakeFlat({8, 8}, 3, 10));
  CHECK_FALSE(MakeFlat({8, 8}, 3, 9) == MakeFlat({64}, 3, 9));
  // Same elements, different kind: not equal.
  CHECK_FALSE(MakeFull({4}) == MakeFlat({4}, 0, 4));
}

TEST_CASE("FlatIndexToString prints row-major coordinates", "[geometry]") {
  CHECK(FlatIndexToString(Shape{16, 16}, 55) == "[3, 7]");
  CHECK(FlatIndexToString(Shape{4, 3, 5}, 59) == "[3, 2, 4]");
  CHECK(FlatIndexToString(Shape{4, 3, 5}, 0) == "[0, 0, 0]");
  CHECK(FlatIndexToString(Shape{7}, 6) == "[6]");
  CHECK(FlatIndexToString(Shape{}, 0) == "[]");
}

// ---- PlanCopies ----

std::vector<CopyOp> Plan(const ShardGeometry& requested, const std::vector<ShardGeometry>& stored) {
  return Unwrap(PlanCopies("w", requested, stored));
}

TEST_CASE("PlanCopies reads a column box out of a full tensor row by row", "[geometry]") {
  CHECK(Plan(MakeBox({16, 16}, {0, 8}, {4, 8}), {MakeFull({16, 16})}) ==
        std::vector<CopyOp>{{0, 8, 0, 8}, {0, 24, 8, 8}, {0, 40, 16, 8}, {0, 56, 24, 8}});
}

TEST_CASE("PlanCopies gathers a full tensor from row and column shards", "[geometry]") {
  CHECK(Plan(MakeFull({16, 16}),
             {MakeBox({16, 16}, {0, 0}, {8, 16}), MakeBox({16, 16}, {8, 0}, {8, 16})}) ==
        std::vector<CopyOp>{{0, 0, 0, 128}, {1, 0, 128, 128}});
  CHECK(
      Plan(MakeFull({4, 4}), {MakeBox({4, 4}, {0, 0}, {4, 2}), MakeBox({4, 4}, {0, 2}, {4, 2})}) ==
      std::vector<CopyOp>{{0, 0, 0, 2},
                          {1, 0, 2, 2},
                          {0, 2, 4, 2},
                          {1, 2, 6, 2},
                          {0, 4, 8, 2},
                          {1, 4, 10, 2},
                          {0, 6, 12, 2},
                          {1, 6, 14, 2}});
}

TEST_CASE("PlanCopies coalesces ops that continue in source and destination", "[geometry]") {
  // The same column box stored and requested: four runs, one op.
  CHECK(Plan(MakeBox({4, 4}, {0, 1}, {4, 2}), {MakeBox({4, 4}, {0, 1}, {4, 2})}) ==
        std::vector<CopyOp>{{0, 0, 0, 8}});
  // Boundaries of shards that do not win do not split the op.
  CHECK(Plan(MakeFull({4, 4}), {MakeFull({4, 4}), MakeBox({4, 4}, {0, 0}, {2, 4}),
                                MakeFlat({4, 4}, 3, 7)}) == std::vector<CopyOp>{{0, 0, 0, 16}});
  // Flat stored, box requested.
  CHECK(Plan(MakeFlat({4, 4}, 2, 12), {MakeFlat({4, 4}, 0, 5), MakeFlat({4, 4}, 5, 11)}) ==
        std::vector<CopyOp>{{0, 2, 0, 3}, {1, 0, 3, 9}});
  CHECK(Plan(MakeBox({4, 4}, {1, 0}, {2, 4}), {MakeFlat({4, 4}, 0, 16)}) ==
        std::vector<CopyOp>{{0, 4, 0, 8}});
}

TEST_CASE("PlanCopies reads replicated stored shards once, from the first", "[geometry]") {
  ShardGeometry top = MakeBox({4, 4}, {0, 0}, {2, 4});
  ShardGeometry bottom = MakeBox({4, 4}, {2, 0}, {2, 4});
  CHECK(Plan(MakeFull({4, 4}), {top, top, bottom, bottom}) ==
        std::vector<CopyOp>{{0, 0, 0, 8}, {2, 0, 8, 8}});
  CHECK(Plan(MakeFull({4, 4}), {bottom, top, bottom, top}) ==
        std::vector<CopyOp>{{1, 0, 0, 8}, {0, 0, 8, 8}});
}

TEST_CASE("PlanCopies takes each element from the first stored shard covering it", "[geometry]") {
  // Rows 1..2 first, then the full tensor: rows 0 and 3 come from the full one.
  CHECK(Plan(MakeFull({4, 4}), {MakeBox({4, 4}, {1, 0}, {2, 4}), MakeFull({4, 4})}) ==
        std::vector<CopyOp>{{1, 0, 0, 4}, {0, 0, 4, 8}, {1, 12, 12, 4}});
}

TEST_CASE("PlanCopies handles scalars and empty requests", "[geometry]") {
  CHECK(Plan(MakeFull({}), {MakeFlat({}, 0, 1)}) == std::vector<CopyOp>{{0, 0, 0, 1}});
  CHECK(Plan(MakeBox({4, 4}, {1, 1}, {0, 3}), {}).empty());
  CHECK(Plan(MakeFlat({4, 4}, 7, 0), {}).empty());
}

TEST_CASE("PlanCopies rejects stored shards of another global shape", "[geometry]") {
  std::vector<ShardGeometry> stored = {MakeFull({4, 5})};
  auto r = PlanCopies("layers.0.mlp.w1", MakeFull({4, 4}), stored);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(r.status().message(), Contains("tensor 'layers.0.mlp.w1'"));
  CHECK_THAT(r.status().message(), Contains("[4, 5]"));
  CHECK_THAT(r.status().message(), Contains("[4, 4]"));
  std::vector<ShardGeometry> other_rank = {MakeFull({16})};
  CHECK_FALSE(PlanCopies("w", MakeFull({4, 4}), other_rank).ok());
}

TEST_CASE("PlanCopies names the first element no stored shard covers", "[geometry]") {
  std::vector<ShardGeometry> stored = {MakeBox({4, 4}, {0, 0}, {2, 4}),
                                       MakeBox({4, 4}, {2, 0}, {2, 3})};
  auto r = PlanCopies("layers.3.attn.wq", MakeFull({4, 4}), stored);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == StatusCode::kNotFound);
  CHECK_THAT(r.status().message(), Contains("tensor 'layers.3.attn.wq'"));
  CHECK_THAT(r.status().message(), Contains("element [2, 3]"));
  CHECK_THAT(r.status().message(), Contains("box[0:4, 0:4] of [4, 4]"));

  // A request that avoids the hole is fine.
  REQUIRE_OK(PlanCopies("w", MakeBox({4, 4}, {0, 0}, {4, 3}), stored));

  auto none = PlanCopies("w", MakeFlat({4, 4}, 6, 3), std::span<const ShardGeometry>());
  REQUIRE_FALSE(none.ok());
  CHECK(none.status().code() == StatusCode::kNotFound);
  CHECK_THAT(none.status().message(), Contains("element [1, 2]"));
}

// ---- CheckCoverage ----

TEST_CASE("CheckCoverage accepts layouts that cover the tensor and names the first hole",
          "[geometry]") {
  const Shape shape = {8, 6};
  // Rows, columns, flat ranges, a mix, and replicas of each: all cover.
  REQUIRE_OK(CheckCoverage("w", std::vector{MakeFull(shape)}));
  REQUIRE_OK(CheckCoverage(
      "w", std::vector{MakeBox(shape, {0, 0}, {3, 6}), MakeBox(shape, {3, 0}, {5, 6})}));
  REQUIRE_OK(
      CheckCoverage("w", std::vector{MakeBox(shape, {0, 0}, {8, 2}), MakeBox(shape, {0, 2}, {8, 4}),
                                     MakeBox(shape, {0, 2}, {8, 4})}));
  REQUIRE_OK(CheckCoverage("w", std::vector{MakeFlat(shape, 0, 13), MakeFlat(shape, 13, 35)}));
  REQUIRE_OK(
      CheckCoverage("w", std::vector{MakeBox(shape, {0, 0}, {4, 6}), MakeFlat(shape, 24, 24)}));
  REQUIRE_OK(CheckCoverage("empty", std::vector{MakeFull({0, 6})}));

  // A hole at the start, in the middle, at the end.
  Status s = CheckCoverage("w", std::vector{MakeBox(shape, {1, 0}, {7, 6})});
  CHECK(s.code() == StatusCode::kNotFound);
  CHECK_THAT(s.message(), Contains("'w'") && Contains("element [0, 0]"));
  s = CheckCoverage("w",
                    std::vector{MakeBox(shape, {0, 0}, {8, 2}), MakeBox(shape, {0, 3}, {8, 3})});
  CHECK_THAT(s.message(), Contains("element [0, 2]"));
  s = CheckCoverage("w", std::vector{MakeFlat(shape, 0, 47)});
  CHECK_THAT(s.message(), Contains("element [7, 5]"));
  // The case: 4 of 8 elements.
  s = CheckCoverage("v", std::vector{MakeBox({8}, {0}, {4})});
  CHECK_THAT(s.message(), Contains("element [4]"));
  // A partial overlap is still an overlap.
  s = CheckCoverage("w",
                    std::vector{MakeBox(shape, {0, 0}, {5, 6}), MakeBox(shape, {4, 0}, {4, 6})});
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(s.message(), Contains("partly overlap"));
}

TEST_CASE(
    "CheckCoverage agrees with a brute-force count on random layouts with holes and "
    "overlaps",
    "[geometry]") {
  std::mt19937_64 rng(ckpt::testing::TestSeed() + 77);
  for (int round = 0; round < 400; ++round) {
    const Shape shape = {1 + rng() % 6, 1 + rng() % 5, 1 + rng() % 4};
    const uint64_t numel = RefNumel(shape);
    std::vector<ShardGeometry> shards;
    const int count = 1 + static_cast<int>(rng() % 5);
    for (int i = 0; i < count; ++i) {
      if (rng() % 2 == 0) {
        Shape off(3), len(3);
        for (size_t d = 0; d < 3; ++d) {
          off[d] = rng() % shape[d];
          len[d] = 1 + rng() % (shape[d] - off[d]);
        }
        shards.push_back(MakeBox(shape, off, len));
      } else {
        const uint64_t start = rng() % numel;
        shards.push_back(MakeFlat(shape, start, 1 + rng() % (numel - start)));
      }
      if (rng() % 4 == 0) shards.push_back(shards.back());  // an exact replica
    }
    // Reference: how often each element is held, counting each distinct shard once.
    std::vector<int> held(numel, 0);
    std::vector<ShardGeometry> distinct;
    for (const auto& g : shards) {
      if (std::find(distinct.begin(), distinct.end(), g) != distinct.end()) continue;
      distinct.push_back(g);
      for (uint64_t e : RefElements(g)) ++held[e];
    }
    // The sweep reports whichever comes first in index order: a doubly held element or a hole.
    const auto twice = std::find_if(held.begin(), held.end(), [](int n) { return n > 1; });
    const auto hole = std::find(held.begin(), held.end(), 0);
    INFO("round " << round << " shape " << RefShape(shape));
    const Status s = CheckCoverage("t", shards);
    if (twice < hole) {
      CHECK(s.code() == StatusCode::kInvalidArgument);
    } else if (hole != held.end()) {
      REQUIRE(s.code() == StatusCode::kNotFound);
      CHECK_THAT(
          s.message(),
          Contains("element " + RefCoordinates(shape, static_cast<uint64_t>(hole - held.begin()))));
    } else {
      CHECK(s.ok());
    }
  }
}

// ---- CheckNoPartialOverlap ----

TEST_CASE("CheckNoPartialOverlap accepts disjoint shards and identical replicas", "[geometry]") {
  ShardGeometry top = MakeBox({4, 4}, {0, 0}, {2, 4});
  ShardGeometry bottom = MakeBox({4, 4}, {2, 0}, {2, 4});
  std::vector<ShardGeometry> none;
  REQUIRE_OK(CheckNoPartialOverlap("w", none));
  REQUIRE_OK(CheckNoPartialOverlap("w", std::vector<ShardGeometry>{top, bottom}));
  REQUIRE_OK(CheckNoPartialOverlap("w", std::vector<ShardGeometry>{bottom, top, top, bottom}));
  // Column 0 and the flat element [1, 1] do not meet.
  REQUIRE_OK(CheckNoPartialOverlap(
      "w", std::vector<ShardGeometry>{MakeBox({4, 4}, {0, 0}, {4, 1}), MakeFlat({4, 4}, 5, 1)}));
  // Empty shards overlap nothing.
  REQUIRE_OK(CheckNoPartialOverlap(
      "w", std::vector<ShardGeometry>{MakeFull({4, 4}), MakeBox({4, 4}, {1, 1}, {2, 0})}));
}

TEST_CASE("CheckNoPartialOverlap names the tensor and both overlapping shards", "[geometry]") {
  std::vector<ShardGeometry> stored = {MakeBox({4, 4}, {0, 0}, {3, 4}),
                                       MakeBox({4, 4}, {3, 0}, {1, 4}),
                                       MakeBox({4, 4}, {2, 0}, {2, 4})};
  Status s = CheckNoPartialOverlap("emb", stored);
  REQUIRE_FALSE(s.ok());
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(s.message(), Contains("tensor 'emb'"));
  CHECK_THAT(s.message(), Contains("0 (box[0:3, 0:4] of [4, 4])"));
  CHECK_THAT(s.message(), Contains("2 (box[2:4, 0:4] of [4, 4])"));
  CHECK_THAT(s.message(), Contains("element [2, 0]"));

  Status flat = CheckNoPartialOverlap(
      "w", std::vector<ShardGeometry>{MakeBox({4, 4}, {0, 0}, {4, 1}), MakeFlat({4, 4}, 4, 1)});
  REQUIRE_FALSE(flat.ok());
  CHECK_THAT(flat.message(), Contains("flat[4:5) of [4, 4]"));
  CHECK_THAT(flat.message(), Contains("element [1, 0]"));

  // Same elements in another kind are not identical: a replica must be registered the same way.
  CHECK_FALSE(
      CheckNoPartialOverlap("w", std::vector<ShardGeometry>{MakeFull({4}), MakeFlat({4}, 0, 4)})
          .ok());
}

TEST_CASE("CheckNoPartialOverlap rejects shards of different global shapes", "[geometry]") {
  Status s = CheckNoPartialOverlap(
      "w", std::vector<ShardGeometry>{MakeBox({4, 4}, {0, 0}, {2, 4}), MakeFull({8, 2})});
  REQUIRE_FALSE(s.ok());
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(s.message(), Contains("tensor 'w'"));
  CHECK_THAT(s.message(), Contains("[4, 4] vs [8, 2]"));
}

// ---- Randomized: split, request another layout, copy, compare ----

// Sorted cut points of [0, n], both ends included; repeated cuts make empty pieces.
Shape RandomCuts(std::mt19937_64& rng, uint64_t n) {
  Shape cuts = {0, n};
  int extra = std::uniform_int_distribution<int>(0, 3)(rng);
  for (int i = 0; i < extra; ++i)
    cuts.push_back(std::uniform_int_distribution<uint64_t>(0, n)(rng));
  std::sort(cuts.begin(), cuts.end());
  return cuts;
}

bool Chance(std::mt19937_64& rng, double p) { return std::bernoulli_distribution(p)(rng); }

// Box grid over dims [first_dim, rank) inside `base` (offsets/lengths of the other dims kept).
void AddBoxGrid(std::mt19937_64& rng, const Shape& shape, Shape offsets, Shape lengths,
                size_t first_dim, std::vector<ShardGeometry>& out) {
  std::vector<Shape> cuts(shape.size());
  for (size_t d = 0; d < shape.size(); ++d) {
    cuts[d] = {offsets[d], offsets[d] + lengths[d]};
    if (d >= first_dim && Chance(rng, 0.6)) {
      cuts[d] = RandomCuts(rng, lengths[d]);
      for (uint64_t& c : cuts[d]) c += offsets[d];
    }
  }
  Shape piece(shape.size(), 0);  // index of the piece per dim
  while (true) {
    Shape off(shape.size()), len(shape.size());
    for (size_t d = 0; d < shape.size(); ++d) {
      off[d] = cuts[d][piece[d]];
      len[d] = cuts[d][piece[d] + 1] - off[d];
    }
    out.push_back(MakeBox(shape, off, len));
    size_t d = shape.size();
    while (d > 0 && ++piece[d - 1] + 1 == cuts[d - 1].size()) piece[--d] = 0;
    if (d == 0) break;
  }
}

void AddFlatSplits(std::mt19937_64& rng, const Shape& shape, uint64_t begin, uint64_t end,
                   std::vector<ShardGeometry>& out) {
  Shape cuts = RandomCuts(rng, end - begin);
  for (size_t i = 0; i + 1 < cuts.size(); ++i) {
    out.push_back(MakeFlat(shape, begin + cuts[i], cuts[i + 1] - cuts[i]));
  }
}

// A layout that covers every element exactly once: a box grid, flat splits, or row blocks each
// kept whole, gridded further, or cut as flat ranges.
std::vector<ShardGeometry> RandomLayout(std::mt19937_64& rng, const Shape& shape) {
  std::vector<ShardGeometry> out;
  const uint64_t numel = RefNumel(shape);
  const Shape zeros(shape.size(), 0);
  switch (std::uniform_int_distribution<int>(0, 2)(rng)) {
    case 0:
      AddBoxGrid(rng, shape, zeros, shape, 0, out);
      break;
    case 1:
      AddFlatSplits(rng, shape, 0, numel, out);
      break;
    default: {
      if (shape.empty()) {
        out.push_back(Chance(rng, 0.5) ? MakeFull(shape) : MakeFlat(shape, 0, 1));
        break;
      }
      const uint64_t row = numel / shape[0];
      Shape rows = RandomCuts(rng, shape[0]);
      for (size_t i = 0; i + 1 < rows.size(); ++i) {
        Shape off = zeros, len = shape;
        off[0] = rows[i];
        len[0] = rows[i + 1] - rows[i];
        switch (std::uniform_int_distribution<int>(0, 2)(rng)) {
          case 0:
            out.push_back(MakeBox(shape, off, len));
            break;
          case 1:
            AddBoxGrid(rng, shape, off, len, 1, out);
            break;
          default:
            AddFlatSplits(rng, shape, rows[i] * row, rows[i + 1] * row, out);
            break;
        }
      }
    }
  }
  return out;
}

// For each global element, the lowest index of a stored shard holding it (or kMax), and that
// shard's local index of it.
struct Coverage {
  std::vector<uint64_t> shard;
  std::vector<uint64_t> local;
};
Coverage CoverageOf(const Shape& shape, const std::vector<ShardGeometry>& stored) {
  Coverage c{std::vector<uint64_t>(RefNumel(shape), kMax), std::vector<uint64_t>(RefNumel(shape))};
  for (size_t i = stored.size(); i-- > 0;) {
    std::vector<uint64_t> el = RefElements(stored[i]);
    for (size_t j = 0; j < el.size(); ++j) {
      c.shard[el[j]] = i;
      c.local[el[j]] = j;
    }
  }
  return c;
}

using Bytes = std::vector<unsigned char>;
constexpr size_t kElem = sizeof(uint64_t);

Bytes ShardBytes(const ShardGeometry& g) {
  std::vector<uint64_t> el = RefElements(g);
  Bytes b(el.size() * kElem);
  if (!el.empty()) std::memcpy(b.data(), el.data(), b.size());
  return b;
}

void CheckRunsAgainstReference(const ShardGeometry& g) {
  std::vector<Run> runs = g.Runs();
  std::vector<uint64_t> expanded;
  for (size_t i = 0; i < runs.size(); ++i) {
    REQUIRE(runs[i].length > 0);
    REQUIRE(runs[i].local_start == expanded.size());
    // Maximal: the next run does not continue this one.
    if (i > 0) REQUIRE(runs[i - 1].global_start + runs[i - 1].length < runs[i].global_start);
    for (uint64_t k = 0; k < runs[i].length; ++k) expanded.push_back(runs[i].global_start + k);
  }
  REQUIRE(expanded == RefElements(g));
}

TEST_CASE("PlanCopies moves every element right under random layouts", "[geometry]") {
  const uint64_t seed = testing::TestSeed();
  INFO("seed " << seed << " (set CKPT_TEST_SEED to reproduce)");
  std::mt19937_64 rng(seed);
  constexpr int kCases = 5000;
  int planned = 0, missing = 0, overlapping = 0;
  for (int iter = 0; iter < kCases; ++iter) {
    INFO("case " << iter);
    Shape shape(std::uniform_int_distribution<int>(0, 4)(rng));
    for (uint64_t& d : shape) d = std::uniform_int_distribution<uint64_t>(1, 13)(rng);

    std::vector<ShardGeometry> stored = RandomLayout(rng, shape);
    // Replicas of some shards, then any order: nothing may depend on either.
    if (Chance(rng, 0.3)) {
      size_t n = stored.size();
      for (size_t i = 0; i < n; ++i) {
        if (Chance(rng, 0.5)) stored.push_back(stored[i]);
      }
    }
    std::shuffle(stored.begin(), stored.end(), rng);
    std::vector<ShardGeometry> requested = RandomLayout(rng, shape);
    INFO("shape " << RefShape(shape) << " stored " << stored.size() << " requested "
                  << requested.size());

    for (const ShardGeometry& g : stored) CheckRunsAgainstReference(g);
    for (const ShardGeometry& g : requested) CheckRunsAgainstReference(g);
    REQUIRE_OK(CheckNoPartialOverlap("w", stored));

    // Variants: as is; one shard (and its replicas) removed; a shard of another layout mixed in
    // at a random place, which partly overlaps and takes precedence where it comes first.
    int variant = std::uniform_int_distribution<int>(0, 3)(rng);
    if (variant == 1) {
      ShardGeometry gone = stored[std::uniform_int_distribution<size_t>(0, stored.size() - 1)(rng)];
      std::erase(stored, gone);
    } else if (variant == 2) {
      std::vector<ShardGeometry> other = RandomLayout(rng, shape);
      const ShardGeometry& extra =
          other[std::uniform_int_distribution<size_t>(0, other.size() - 1)(rng)];
      size_t at = std::uniform_int_distribution<size_t>(0, stored.size())(rng);
      bool identical = std::find(stored.begin(), stored.end(), extra) != stored.end();
      stored.insert(stored.begin() + static_cast<std::ptrdiff_t>(at), extra);
      Status s = CheckNoPartialOverlap("w", stored);
      if (identical || extra.numel() == 0) {
        REQUIRE_OK(s);
      } else {
        REQUIRE(s.code() == StatusCode::kInvalidArgument);
        REQUIRE_THAT(s.message(), Contains("partly overlap"));
        ++overlapping;
      }
    }

    const Coverage cover = CoverageOf(shape, stored);
    std::vector<Bytes> source;
    for (const ShardGeometry& g : stored) source.push_back(ShardBytes(g));

    for (const ShardGeometry& want : requested) {
      INFO("requested " << want.ToString());
      const std::vector<uint64_t> expected = RefElements(want);
      auto hole = std::find_if(expected.begin(), expected.end(),
                               [&](uint64_t g) { return cover.shard[g] == kMax; });
      auto plan = PlanCopies("w", want, stored);
      if (hole != expected.end()) {
        REQUIRE(plan.status().code() == StatusCode::kNotFound);
        REQUIRE_THAT(plan.status().message(), Contains("element " + RefCoordinates(shape, *hole)));
        ++missing;
        continue;
      }
      REQUIRE_OK(plan);
      ++planned;

      Bytes dest(expected.size() * kElem, 0xff);
      uint64_t next_dest = 0;
      const CopyOp* prev = nullptr;
      for (const CopyOp& op : *plan) {
        INFO("op source " << op.source << " src " << op.source_element << " dst " << op.dest_element
                          << " n " << op.elements);
        REQUIRE(op.elements > 0);
        REQUIRE(op.source < stored.size());
        REQUIRE(op.dest_element >= next_dest);  // sorted, no overlap
        REQUIRE(op.dest_element + op.elements <= want.numel());
        REQUIRE(op.source_element + op.elements <= stored[op.source].numel());
        if (prev != nullptr) {
          bool continues = prev->source == op.source &&
                           prev->source_element + prev->elements == op.source_element &&
                           prev->dest_element + prev->elements == op.dest_element;
          REQUIRE_FALSE(continues);  // coalesced
        }
        for (uint64_t k = 0; k < op.elements; ++k) {
          REQUIRE(cover.shard[expected[op.dest_element + k]] == op.source);  // first wins
        }
        std::memcpy(dest.data() + op.dest_element * kElem,
                    source[op.source].data() + op.source_element * kElem, op.elements * kElem);
        next_dest = op.dest_element + op.elements;
        prev = &op;
      }
      std::vector<uint64_t> got(expected.size());
      if (!got.empty()) std::memcpy(got.data(), dest.data(), dest.size());
      REQUIRE(got == expected);
    }
  }
  // The generator exercises every path.
  CHECK(planned > kCases);
  CHECK(missing > 100);
  CHECK(overlapping > 100);
}

// ---- Scale ----

TEST_CASE("PlanCopies and CheckNoPartialOverlap scale to tensors with many runs", "[geometry]") {
  const Shape shape = {50000, 8192};
  auto columns = [&](uint64_t width) {
    std::vector<ShardGeometry> shards;
    for (uint64_t c = 0; c < shape[1]; c += width) {
      shards.push_back(MakeBox(shape, {0, c}, {shape[0], width}));
    }
    return shards;
  };

  SECTION("64 columns out of the full tensor: 50000 runs, 50000 ops") {
    std::vector<CopyOp> ops = Plan(MakeBox(shape, {0, 64}, {50000, 64}), {MakeFull(shape)});
    REQUIRE(ops.size() == 50000);
    CHECK(ops[1] == CopyOp{0, 8192 + 64, 64, 64});
  }
  SECTION("64 columns across a boundary of 8 replicated column shards") {
    std::vector<ShardGeometry> stored = columns(1024);
    std::vector<ShardGeometry> replicas = stored;
    stored.insert(stored.end(), replicas.begin(), replicas.end());
    std::vector<CopyOp> ops = Plan(MakeBox(shape, {0, 1000}, {50000, 64}), stored);
    REQUIRE(ops.size() == 100000);
    CHECK(ops[0] == CopyOp{0, 1000, 0, 24});
    CHECK(ops[1] == CopyOp{1, 0, 24, 40});
    CHECK(ops[3] == CopyOp{1, 1024, 88, 40});
  }
  SECTION("64 columns out of 128 column shards") {
    std::vector<ShardGeometry> stored = columns(64);
    // The same box as stored shard 64: its bytes in one op.
    CHECK(Plan(MakeBox(shape, {0, 4096}, {50000, 64}), stored) ==
          std::vector<CopyOp>{{64, 0, 0, 50000 * 64}});
    // Straddling shards 64 and 65: two ops per row.
    std::vector<CopyOp> ops = Plan(MakeBox(shape, {0, 4100}, {50000, 64}), stored);
    REQUIRE(ops.size() == 100000);
    CHECK(ops[0] == CopyOp{64, 4, 0, 60});
    CHECK(ops[1] == CopyOp{65, 0, 60, 4});
  }
  SECTION("the last rows out of column shards, and the rows as a flat range") {
    std::vector<CopyOp> ops = Plan(MakeBox(shape, {49990, 0}, {10, 8192}), columns(1024));
    REQUIRE(ops.size() == 80);
    CHECK(ops[0] == CopyOp{0, 49990 * 1024, 0, 1024});
    std::vector<ShardGeometry> flat = {MakeFlat(shape, 0, 49990 * 8192),
                                       MakeFlat(shape, 49990 * 8192, 10 * 8192)};
    CHECK(Plan(MakeBox(shape, {49990, 0}, {10, 8192}), flat) ==
          std::vector<CopyOp>{{1, 0, 0, 10 * 8192}});
  }
  SECTION("overlap check over 128 column shards (6.4 million runs)") {
    std::vector<ShardGeometry> stored = columns(64);
    REQUIRE_OK(CheckNoPartialOverlap("w", stored));
    stored.push_back(MakeBox(shape, {49999, 8000}, {1, 100}));
    Status s = CheckNoPartialOverlap("w", stored);
    REQUIRE_FALSE(s.ok());
    CHECK_THAT(s.message(), Contains("element [49999, 8000]"));
  }
}

}  // namespace
}  // namespace ckpt
