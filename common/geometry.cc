// Shard geometry and the resharding planner; the contract and the model are in geometry.h.
//
// How the planner stays fast. A shard's runs are never materialized by the planner: a
// RunCursor produces them one at a time (an odometer over the box's outer dimensions) and can
// jump past a position by binary search over the run index, because run j's start is a closed
// form of j. PlanCopies then sweeps the flattened index space once:
//   * stored shards whose bounding box misses the request are dropped up front (a column
//     shard never touches another column), and so are exact duplicates of an earlier shard
//     (replicas: the first one always wins, so the others can never supply a byte);
//   * a min-heap holds, per remaining stored shard, the next position where its coverage
//     changes (its current run starts or ends); a sorted vector holds the shards covering the
//     current position, lowest index first, so the winner is its front (distinct stored shards
//     are disjoint, so it rarely holds more than one);
//   * the requested shard's runs are walked in order; within a run, each stretch between two
//     heap events becomes one CopyOp from the winner, and ops that continue the previous one in
//     both source and destination are merged.
// Cost: O((R + T') log S) heap steps for R requested runs, S stored shards kept and T' of
// their runs that meet the request; runs of a kept shard that fall between two requested runs
// are skipped by one binary search (O(log T · rank) for T runs of the shard). Measured on a
// loaded 2-core dev box (-O2), [50000, 8192] tensor:
//   [50000, 64] columns (50,000 runs) from the full tensor or 8 column shards   2–7 ms
//   the same from 128 column shards of 64 (the others are dropped up front)    < 1 ms
//   the full tensor from 8 column shards × 64 replicas (400,000 ops)            ~50 ms
//   the full tensor from 128 column shards (6.4 million ops)                    ~1.3 s
//   CheckNoPartialOverlap over those 128 column shards (6.4 million runs)       ~0.5 s
//
// CheckNoPartialOverlap drops duplicates the same way and then merges the runs of all the
// remaining shards by start: any run starting before the furthest end seen so far overlaps.
#include "common/geometry.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <tuple>
#include <utility>

namespace ckpt {
namespace {

constexpr uint64_t kMaxElements = uint64_t{1} << 63;
constexpr uint64_t kNoPosition = std::numeric_limits<uint64_t>::max();

std::string ShapeToString(std::span<const uint64_t> shape) {
  std::string s = "[";
  for (size_t d = 0; d < shape.size(); ++d) {
    if (d > 0) s += ", ";
    s += std::to_string(shape[d]);
  }
  s += "]";
  return s;
}

std::string BoxToString(std::span<const uint64_t> offsets, std::span<const uint64_t> lengths) {
  std::string s = "box[";
  for (size_t d = 0; d < offsets.size() && d < lengths.size(); ++d) {
    if (d > 0) s += ", ";
    s += std::to_string(offsets[d]);
    s += ":";
    // Only called on validated boxes or to report an overflow, where the sum may wrap; say so.
    uint64_t end = 0;
    if (__builtin_add_overflow(offsets[d], lengths[d], &end)) {
      s += std::to_string(offsets[d]) + "+" + std::to_string(lengths[d]);
    } else {
      s += std::to_string(end);
    }
  }
  s += "]";
  return s;
}

std::string Quote(std::string_view name) {
  std::string s = "tensor '";
  s += name;
  s += "'";
  return s;
}

// "tensor 'w': element [4] is in none of the 1 distinct stored shards ..." for an uncovered
// element.
std::string Gap(std::string_view tensor_name, std::span<const ShardGeometry> stored,
                uint64_t element, size_t distinct);

// Row-major strides of a shape whose element count is known to be nonzero and at most 2^63,
// so no product overflows.
Shape Strides(const Shape& shape) {
  Shape strides(shape.size(), 1);
  for (size_t d = shape.size(); d-- > 1;) strides[d - 1] = strides[d] * shape[d];
  return strides;
}

// Produces a shard's runs in order without materializing them: positioned on one run, done()
// once past the last. Copies what it needs from the geometry.
class RunCursor {
 public:
  explicit RunCursor(const ShardGeometry& g) {
    if (g.numel() == 0) return;  // no runs
    if (g.kind() == ShardGeometry::Kind::kFlat) {
      count_ = 1;
      run_length_ = g.numel();
      base_ = g.flat_offset();
      Load(0);
      return;
    }
    const Shape& shape = g.global_shape();
    const Shape& off = g.offsets();
    const Shape& len = g.lengths();
    const Shape strides = Strides(shape);
    // k: the innermost dimension the box does not span fully; everything inside it is one
    // contiguous row of the box. If the box spans all dimensions it is one run.
    size_t k = shape.size();
    while (k > 0 && len[k - 1] == shape[k - 1]) --k;
    if (k == 0) {
      count_ = 1;
      run_length_ = g.numel();
      base_ = 0;
      Load(0);
      return;
    }
    size_t inner = k - 1;
    run_length_ = len[inner] * strides[inner];
    base_ = off[inner] * strides[inner];
    count_ = 1;
    for (size_t d = 0; d < inner; ++d) {
      base_ += off[d] * strides[d];
      count_ *= len[d];
      outer_lengths_.push_back(len[d]);
      outer_strides_.push_back(strides[d]);
    }
    odometer_.assign(outer_lengths_.size(), 0);
    Load(0);
  }

  bool done() const { return index_ >= count_; }
  const Run& run() const { return run_; }
  uint64_t run_end() const { return run_.global_start + run_.length; }

  void Next() {
    ++index_;
    if (done()) return;
    run_.local_start += run_length_;
    // Odometer step over the outer dimensions, innermost first.
    for (size_t d = odometer_.size(); d-- > 0;) {
      if (++odometer_[d] < outer_lengths_[d]) {
        run_.global_start += outer_strides_[d];
        return;
      }
      odometer_[d] = 0;
      run_.global_start -= (outer_lengths_[d] - 1) * outer_strides_[d];
    }
  }

  // Moves forward to the first run that ends after `position` (stays if the current one does).
  void SeekPast(uint64_t position) {
    if (done() || run_end() > position) return;
    // Usually the next run is the one (sweeps move run by run); otherwise binary search.
    Next();
    if (done() || run_end() > position) return;
    uint64_t lo = index_ + 1, hi = count_;  // answer in [lo, hi]; hi means none
    while (lo < hi) {
      uint64_t mid = lo + (hi - lo) / 2;
      if (StartOf(mid) + run_length_ > position) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    Load(lo);
  }

 private:
  // Global start of run j: its outer multi-index is j in mixed radix over outer_lengths_.
  uint64_t StartOf(uint64_t j) const {
    uint64_t start = base_;
    for (size_t d = outer_lengths_.size(); d-- > 0;) {
      start += (j % outer_lengths_[d]) * outer_strides_[d];
      j /= outer_lengths_[d];
    }
    return start;
  }

  void Load(uint64_t j) {
    index_ = j;
    if (done()) return;
    uint64_t rest = j;
    for (size_t d = outer_lengths_.size(); d-- > 0;) {
      odometer_[d] = rest % outer_lengths_[d];
      rest /= outer_lengths_[d];
    }
    run_ = Run{StartOf(j), run_length_, j * run_length_};
  }

  uint64_t count_ = 0;
  uint64_t index_ = 0;
  uint64_t run_length_ = 0;
  uint64_t base_ = 0;  // global start of run 0
  Shape outer_lengths_;
  Shape outer_strides_;
  Shape odometer_;
  Run run_{0, 0, 0};
};

// Per-dimension [lo, hi) bounds containing every element of a nonempty shard. Exact for a box;
// for a flat range, the tightest box around its first and last elements' common prefix.
struct BoundingBox {
  Shape lo;
  Shape hi;
};

Shape Coordinates(const Shape& shape, uint64_t flat_index) {
  Shape c(shape.size(), 0);
  for (size_t d = shape.size(); d-- > 0;) {
    c[d] = flat_index % shape[d];
    flat_index /= shape[d];
  }
  return c;
}

BoundingBox BoundsOf(const ShardGeometry& g) {
  BoundingBox b;
  if (g.kind() == ShardGeometry::Kind::kBox) {
    b.lo = g.offsets();
    b.hi = g.offsets();
    for (size_t d = 0; d < b.hi.size(); ++d) b.hi[d] += g.lengths()[d];
    return b;
  }
  const Shape& shape = g.global_shape();
  const Shape first = Coordinates(shape, g.flat_offset());
  const Shape last = Coordinates(shape, g.flat_offset() + g.numel() - 1);
  b.lo.resize(shape.size());
  b.hi.resize(shape.size());
  size_t d = 0;
  for (; d < shape.size() && first[d] == last[d]; ++d) {
    b.lo[d] = first[d];
    b.hi[d] = first[d] + 1;
  }
  if (d < shape.size()) {
    b.lo[d] = first[d];
    b.hi[d] = last[d] + 1;
    for (++d; d < shape.size(); ++d) {
      b.lo[d] = 0;
      b.hi[d] = shape[d];
    }
  }
  return b;
}

bool Intersect(const BoundingBox& a, const BoundingBox& b) {
  for (size_t d = 0; d < a.lo.size(); ++d) {
    if (std::max(a.lo[d], b.lo[d]) >= std::min(a.hi[d], b.hi[d])) return false;
  }
  return true;
}

// Indices of `stored` with no identical shard at a lower index, in increasing order.
std::vector<uint32_t> FirstOfEachReplicaGroup(std::span<const ShardGeometry> stored) {
  auto key = [&](uint32_t i) {
    const ShardGeometry& g = stored[i];
    return std::tie(g.global_shape(), g.offsets(), g.lengths());
  };
  std::vector<uint32_t> order(stored.size());
  std::iota(order.begin(), order.end(), 0u);
  auto less = [&](uint32_t a, uint32_t b) {
    const ShardGeometry& x = stored[a];
    const ShardGeometry& y = stored[b];
    if (x.kind() != y.kind()) return x.kind() < y.kind();
    if (x.flat_offset() != y.flat_offset()) return x.flat_offset() < y.flat_offset();
    if (x.numel() != y.numel()) return x.numel() < y.numel();
    if (key(a) != key(b)) return key(a) < key(b);
    return a < b;
  };
  std::sort(order.begin(), order.end(), less);
  std::vector<uint32_t> firsts;
  for (size_t i = 0; i < order.size(); ++i) {
    if (i == 0 || !(stored[order[i]] == stored[order[i - 1]])) firsts.push_back(order[i]);
  }
  std::sort(firsts.begin(), firsts.end());
  return firsts;
}

Status CheckShardCount(std::string_view tensor_name, size_t count) {
  if (count > std::numeric_limits<uint32_t>::max()) {
    return InvalidArgument(Quote(tensor_name) + ": " + std::to_string(count) +
                           " stored shards, more than 2^32-1");
  }
  return Status::Ok();
}

// A binary min-heap of (position, cursor), least position first, ties by cursor. Unlike
// std::priority_queue it can replace its top with one sift: a sweep mostly moves the cursor it
// just looked at to a later position, and this halves the work of a pop and a push.
class EventHeap {
 public:
  struct Event {
    uint64_t position;
    uint32_t cursor;
  };

  bool empty() const { return heap_.empty(); }
  const Event& top() const { return heap_.front(); }

  void push(Event e) {
    size_t i = heap_.size();
    heap_.push_back(e);
    while (i > 0) {
      size_t parent = (i - 1) / 2;
      if (!Less(heap_[i], heap_[parent])) break;
      std::swap(heap_[i], heap_[parent]);
      i = parent;
    }
  }
  void pop() {
    heap_.front() = heap_.back();
    heap_.pop_back();
    if (!heap_.empty()) SiftDown();
  }
  void replace_top(Event e) {
    heap_.front() = e;
    SiftDown();
  }

 private:
  static bool Less(const Event& a, const Event& b) {
    return a.position < b.position || (a.position == b.position && a.cursor < b.cursor);
  }
  void SiftDown() {
    const size_t n = heap_.size();
    size_t i = 0;
    while (true) {
      size_t least = i, left = 2 * i + 1, right = left + 1;
      if (left < n && Less(heap_[left], heap_[least])) least = left;
      if (right < n && Less(heap_[right], heap_[least])) least = right;
      if (least == i) return;
      std::swap(heap_[i], heap_[least]);
      i = least;
    }
  }
  std::vector<Event> heap_;
};

// The sweep state of PlanCopies: which stored shards cover the current position.
class CoverageSweep {
 public:
  CoverageSweep(std::span<const ShardGeometry> stored, const std::vector<uint32_t>& shards) {
    cursors_.reserve(shards.size());
    for (uint32_t i : shards) {
      const uint32_t c = static_cast<uint32_t>(cursors_.size());
      cursors_.emplace_back(stored[i]);
      source_.push_back(i);
      if (!cursors_[c].done()) events_.push({cursors_[c].run().global_start, c});
    }
  }

  // Brings the state to `position` (non-decreasing across calls): afterwards the covering set
  // is exactly the shards whose current run contains it. Each shard has one event in the heap
  // until its runs are exhausted: where its current run starts, or ends if it covers.
  void AdvanceTo(uint64_t position) {
    while (!events_.empty() && events_.top().position <= position) {
      const uint32_t c = events_.top().cursor;
      auto it = std::lower_bound(covering_.begin(), covering_.end(), c);
      if (it != covering_.end() && *it == c) covering_.erase(it);
      RunCursor& cursor = cursors_[c];
      cursor.SeekPast(position);
      if (cursor.done()) {
        events_.pop();
      } else if (cursor.run().global_start <= position) {
        covering_.insert(std::lower_bound(covering_.begin(), covering_.end(), c), c);
        events_.replace_top({cursor.run_end(), c});
      } else {
        events_.replace_top({cursor.run().global_start, c});
      }
    }
  }

  // Next position where coverage changes; kNoPosition if none.
  uint64_t next_event() const { return events_.empty() ? kNoPosition : events_.top().position; }
  bool covered() const { return !covering_.empty(); }
  // The lowest-index covering shard (index into `stored`) and its run at the current position.
  uint32_t winner_source() const { return source_[covering_.front()]; }
  const Run& winner_run() const { return cursors_[covering_.front()].run(); }

 private:
  std::vector<RunCursor> cursors_;
  std::vector<uint32_t> source_;  // cursor → index into stored; increasing
  EventHeap events_;
  // Cursor indices, sorted: the first is the lowest stored index. Usually one entry (distinct
  // stored shards are disjoint), so a sorted vector beats a tree.
  std::vector<uint32_t> covering_;
};

}  // namespace

Result<uint64_t> ShapeNumel(std::span<const uint64_t> shape) {
  // A zero dimension makes the tensor empty whatever the others are.
  if (std::find(shape.begin(), shape.end(), uint64_t{0}) != shape.end()) return uint64_t{0};
  uint64_t n = 1;
  for (uint64_t dim : shape) {
    if (__builtin_mul_overflow(n, dim, &n) || n > kMaxElements) {
      return InvalidArgument("shape " + ShapeToString(shape) + " has more than 2^63 elements");
    }
  }
  return n;
}

Result<ShardGeometry> ShardGeometry::Box(Shape global_shape, Shape offsets, Shape lengths) {
  ASSIGN_OR_RETURN(uint64_t global_numel, ShapeNumel(global_shape));
  (void)global_numel;
  if (offsets.size() != global_shape.size() || lengths.size() != global_shape.size()) {
    return InvalidArgument("box with offsets " + ShapeToString(offsets) + " and lengths " +
                           ShapeToString(lengths) + " does not match the rank of global shape " +
                           ShapeToString(global_shape));
  }
  for (size_t d = 0; d < global_shape.size(); ++d) {
    uint64_t end = 0;
    if (__builtin_add_overflow(offsets[d], lengths[d], &end) || end > global_shape[d]) {
      return InvalidArgument(BoxToString(offsets, lengths) + " exceeds global shape " +
                             ShapeToString(global_shape) + " in dimension " + std::to_string(d));
    }
  }
  ShardGeometry g;
  g.kind_ = Kind::kBox;
  ASSIGN_OR_RETURN(g.numel_, ShapeNumel(lengths));  // cannot fail: bounded by the global numel
  g.global_shape_ = std::move(global_shape);
  g.offsets_ = std::move(offsets);
  g.lengths_ = std::move(lengths);
  return g;
}

Result<ShardGeometry> ShardGeometry::Flat(Shape global_shape, uint64_t flat_offset,
                                          uint64_t numel) {
  ASSIGN_OR_RETURN(uint64_t global_numel, ShapeNumel(global_shape));
  uint64_t end = 0;
  if (__builtin_add_overflow(flat_offset, numel, &end) || end > global_numel) {
    return InvalidArgument("flat range at " + std::to_string(flat_offset) + " of " +
                           std::to_string(numel) + " elements exceeds global shape " +
                           ShapeToString(global_shape) + " of " + std::to_string(global_numel) +
                           " elements");
  }
  ShardGeometry g;
  g.kind_ = Kind::kFlat;
  g.global_shape_ = std::move(global_shape);
  g.flat_offset_ = flat_offset;
  g.numel_ = numel;
  return g;
}

Result<ShardGeometry> ShardGeometry::Full(Shape global_shape) {
  Shape offsets(global_shape.size(), 0);
  Shape lengths = global_shape;
  return Box(std::move(global_shape), std::move(offsets), std::move(lengths));
}

std::vector<Run> ShardGeometry::Runs() const {
  std::vector<Run> runs;
  for (RunCursor c(*this); !c.done(); c.Next()) runs.push_back(c.run());
  return runs;
}

std::string ShardGeometry::ToString() const {
  std::string s;
  if (kind_ == Kind::kBox) {
    s = BoxToString(offsets_, lengths_);
  } else {
    s = "flat[" + std::to_string(flat_offset_) + ":" + std::to_string(flat_offset_ + numel_) + ")";
  }
  return s + " of " + ShapeToString(global_shape_);
}

bool ShardGeometry::operator==(const ShardGeometry& other) const {
  return kind_ == other.kind_ && global_shape_ == other.global_shape_ &&
         offsets_ == other.offsets_ && lengths_ == other.lengths_ &&
         flat_offset_ == other.flat_offset_ && numel_ == other.numel_;
}

std::string FlatIndexToString(std::span<const uint64_t> shape, uint64_t flat_index) {
  // Row-major decomposition; the outermost coordinate takes whatever is left, so an index past
  // the end still prints something recognizable rather than wrapping.
  Shape c(shape.size(), 0);
  for (size_t d = shape.size(); d-- > 1;) {
    if (shape[d] == 0) continue;
    c[d] = flat_index % shape[d];
    flat_index /= shape[d];
  }
  if (!c.empty()) c[0] = flat_index;
  return ShapeToString(c);
}

Result<std::vector<CopyOp>> PlanCopies(std::string_view tensor_name, const ShardGeometry& requested,
                                       std::span<const ShardGeometry> stored) {
  RETURN_IF_ERROR(CheckShardCount(tensor_name, stored.size()));
  for (size_t i = 0; i < stored.size(); ++i) {
    if (stored[i].global_shape() != requested.global_shape()) {
      return InvalidArgument(Quote(tensor_name) + ": stored shard " + std::to_string(i) +
                             " has global shape " + ShapeToString(stored[i].global_shape()) +
                             " but the request has global shape " +
                             ShapeToString(requested.global_shape()));
    }
  }
  std::vector<CopyOp> ops;
  if (requested.numel() == 0) return ops;

  // Drop replicas of an earlier shard and shards that cannot touch the request.
  const BoundingBox want = BoundsOf(requested);
  std::vector<uint32_t> useful;
  for (uint32_t i : FirstOfEachReplicaGroup(stored)) {
    if (stored[i].numel() > 0 && Intersect(want, BoundsOf(stored[i]))) useful.push_back(i);
  }
  CoverageSweep sweep(stored, useful);

  for (RunCursor want_runs(requested); !want_runs.done(); want_runs.Next()) {
    const Run& r = want_runs.run();
    const uint64_t end = r.global_start + r.length;
    for (uint64_t p = r.global_start; p < end;) {
      sweep.AdvanceTo(p);
      if (!sweep.covered()) {
        return NotFound(Quote(tensor_name) + ": element " +
                        FlatIndexToString(requested.global_shape(), p) + " of requested " +
                        requested.ToString() + " is in none of the " +
                        std::to_string(stored.size()) + " stored shards");
      }
      const uint64_t stop = std::min(end, sweep.next_event());
      const Run& from = sweep.winner_run();
      CopyOp op{sweep.winner_source(), from.local_start + (p - from.global_start),
                r.local_start + (p - r.global_start), stop - p};
      if (!ops.empty()) {
        CopyOp& last = ops.back();
        if (last.source == op.source && last.source_element + last.elements == op.source_element &&
            last.dest_element + last.elements == op.dest_element) {
          last.elements += op.elements;
          p = stop;
          continue;
        }
      }
      ops.push_back(op);
      p = stop;
    }
  }
  return ops;
}

namespace {

// The sweep behind CheckNoPartialOverlap and CheckCoverage; with `cover`, a gap between the
// distinct shards' runs (or before the first, or after the last) is an error too.
Status SweepDistinctRuns(std::string_view tensor_name, std::span<const ShardGeometry> stored,
                         bool cover);

}  // namespace

Status CheckNoPartialOverlap(std::string_view tensor_name, std::span<const ShardGeometry> stored) {
  return SweepDistinctRuns(tensor_name, stored, /*cover=*/false);
}

Status CheckCoverage(std::string_view tensor_name, std::span<const ShardGeometry> stored) {
  return SweepDistinctRuns(tensor_name, stored, /*cover=*/true);
}

namespace {

Status SweepDistinctRuns(std::string_view tensor_name, std::span<const ShardGeometry> stored,
                         bool cover) {
  if (cover && stored.empty()) {
    return NotFound(Quote(tensor_name) + ": no stored shard at all");
  }
  RETURN_IF_ERROR(CheckShardCount(tensor_name, stored.size()));
  for (size_t i = 1; i < stored.size(); ++i) {
    if (stored[i].global_shape() != stored[0].global_shape()) {
      return InvalidArgument(
          Quote(tensor_name) + ": stored shards 0 and " + std::to_string(i) +
          " disagree on the global shape: " + ShapeToString(stored[0].global_shape()) + " vs " +
          ShapeToString(stored[i].global_shape()));
    }
  }
  // Merge the runs of all distinct shards by start (ties by shard index); a run that starts
  // before the furthest end seen so far overlaps the shard that reached that end, and the first
  // such start is the first element the two share.
  const std::vector<uint32_t> distinct = FirstOfEachReplicaGroup(stored);
  std::vector<RunCursor> cursors;
  cursors.reserve(distinct.size());
  EventHeap heap;  // run starts; cursor = position in `distinct`
  for (uint32_t c = 0; c < distinct.size(); ++c) {
    cursors.emplace_back(stored[distinct[c]]);
    if (!cursors[c].done()) heap.push({cursors[c].run().global_start, c});
  }
  uint64_t furthest_end = 0;
  uint32_t furthest_owner = 0;
  while (!heap.empty()) {
    const uint32_t c = heap.top().cursor;
    RunCursor& cursor = cursors[c];
    const uint64_t start = cursor.run().global_start;
    if (start < furthest_end) {
      uint32_t a = std::min(distinct[c], distinct[furthest_owner]);
      uint32_t b = std::max(distinct[c], distinct[furthest_owner]);
      return InvalidArgument(Quote(tensor_name) + ": stored shards " + std::to_string(a) + " (" +
                             stored[a].ToString() + ") and " + std::to_string(b) + " (" +
                             stored[b].ToString() + ") partly overlap, first at element " +
                             FlatIndexToString(stored[a].global_shape(), start) +
                             "; stored shards must be identical replicas or disjoint");
    }
    if (cover && start > furthest_end) {
      return NotFound(Gap(tensor_name, stored, furthest_end, distinct.size()));
    }
    furthest_end = cursor.run_end();
    furthest_owner = c;
    cursor.Next();
    if (cursor.done()) {
      heap.pop();
    } else {
      heap.replace_top({cursor.run().global_start, c});
    }
  }
  if (cover) {
    // Validated shapes: the element count fits (ShapeNumel checked it for every shard).
    const uint64_t numel = ShapeNumel(stored[0].global_shape()).value();
    if (furthest_end < numel)
      return NotFound(Gap(tensor_name, stored, furthest_end, distinct.size()));
  }
  return Status::Ok();
}

}  // namespace

namespace {

std::string Gap(std::string_view tensor_name, std::span<const ShardGeometry> stored,
                uint64_t element, size_t distinct) {
  return Quote(tensor_name) + ": element " + FlatIndexToString(stored[0].global_shape(), element) +
         " is in none of the " + std::to_string(distinct) + " distinct stored shards of " +
         ShapeToString(stored[0].global_shape()) + " (the step's shards must cover the tensor)";
}

}  // namespace

}  // namespace ckpt
