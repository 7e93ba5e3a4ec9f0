// Shard geometry and the resharding planner.
//
// A tensor has a global shape; a rank holds shards of it. Two kinds of shard exist:
//   * a box: offsets[d] .. offsets[d]+lengths[d] in each dimension (TP, PP, row/column splits);
//     its bytes are the box's elements in the box's own row-major order;
//   * a flat range [flat_offset, flat_offset+numel) of the row-major flattened tensor (ZeRO /
//     FSDP flat-parameter splits that cut across rows); its bytes are those elements in order.
// Both reduce to sorted, disjoint *runs* in the flattened index space: (global_start, length,
// local_start), where local_start is the element index inside the shard's own bytes. A box's
// runs are its innermost contiguous rows, merged where trailing dimensions are complete.
//
// Loading under a new layout is then one sweep: for a requested shard and the stored shards of
// the same tensor, intersect runs and emit CopyOps (source shard, source element, destination
// element, count), coalescing ops that continue each other in both source and destination.
// Every element of the request must be covered, or the planner says which tensor and which
// coordinates are missing. Stored shards may repeat (data-parallel replicas written twice);
// the first stored shard that covers an element is used.
//
// Everything here is in elements; callers multiply by the dtype's element size. All arithmetic
// is checked: shapes whose element count overflows 2^63 are rejected. Thread safety: values.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace ckpt {

using Shape = std::vector<uint64_t>;

// Product of dims; kInvalidArgument on overflow past 2^63 elements. A scalar ({}) has 1.
Result<uint64_t> ShapeNumel(std::span<const uint64_t> shape);

struct Run {
  uint64_t global_start;  // first element in the flattened global tensor
  uint64_t length;        // elements
  uint64_t local_start;   // first element inside the shard's own bytes
  bool operator==(const Run&) const = default;
};

class ShardGeometry {
 public:
  enum class Kind { kBox, kFlat };

  // Validates against the global shape: ranks match, offset+length within each dim, no
  // overflow. A box with a zero length in some dimension is valid and holds no elements.
  static Result<ShardGeometry> Box(Shape global_shape, Shape offsets, Shape lengths);
  static Result<ShardGeometry> Flat(Shape global_shape, uint64_t flat_offset, uint64_t numel);
  // The whole tensor as a box (offsets 0, lengths = shape).
  static Result<ShardGeometry> Full(Shape global_shape);

  Kind kind() const { return kind_; }
  const Shape& global_shape() const { return global_shape_; }
  const Shape& offsets() const { return offsets_; }      // box only
  const Shape& lengths() const { return lengths_; }      // box only
  uint64_t flat_offset() const { return flat_offset_; }  // flat only
  uint64_t numel() const { return numel_; }

  // The shard's runs in increasing global_start order; local_start increases with them.
  std::vector<Run> Runs() const;

  // "box[0:4, 8:16] of [16, 16]" / "flat[100:250) of [16, 16]".
  std::string ToString() const;

  // Same kind, same global shape, same box or range.
  bool operator==(const ShardGeometry& other) const;

 private:
  ShardGeometry() = default;
  Kind kind_ = Kind::kBox;
  Shape global_shape_;
  Shape offsets_;
  Shape lengths_;
  uint64_t flat_offset_ = 0;
  uint64_t numel_ = 0;
};

// Coordinates of a flattened index in a shape, as "[3, 7]" — for error messages.
std::string FlatIndexToString(std::span<const uint64_t> shape, uint64_t flat_index);

struct CopyOp {
  uint32_t source;          // index into the `stored` span given to PlanCopies
  uint64_t source_element;  // first element inside the stored shard's bytes
  uint64_t dest_element;    // first element inside the requested shard's bytes
  uint64_t elements;
  bool operator==(const CopyOp&) const = default;
};

// Plans how to fill `requested` from `stored` (all shards of one tensor, same global shape).
// Ops come sorted by dest_element and coalesced. Errors: a global shape that differs
// (kInvalidArgument naming both shapes), or an element of `requested` that no stored shard
// covers (kNotFound naming the tensor and the first missing coordinates).
Result<std::vector<CopyOp>> PlanCopies(std::string_view tensor_name, const ShardGeometry& requested,
                                       std::span<const ShardGeometry> stored);

// Checks that stored shards do not partly overlap: two shards are either identical (replicas)
// or disjoint. kInvalidArgument naming the tensor and both shards otherwise.
Status CheckNoPartialOverlap(std::string_view tensor_name, std::span<const ShardGeometry> stored);

// As CheckNoPartialOverlap, and every element of the global tensor is in some shard:
// kNotFound naming the tensor and the first uncovered coordinates otherwise. What a commit
// requires of each tensor (a checkpoint that cannot be restored is never committed).
Status CheckCoverage(std::string_view tensor_name, std::span<const ShardGeometry> stored);

}  // namespace ckpt
