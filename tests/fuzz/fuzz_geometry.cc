// libFuzzer harness: shard geometry and the resharding planner (common/geometry.h), which turn
// shapes and offsets from clients and from manifests into copy plans. The input describes a
// global shape, a requested shard and up to 8 stored shards (boxes or flat ranges) with
// arbitrary 64-bit numbers; whatever validates is planned, and every plan is checked against
// the contract: ops in bounds of both shards, sorted and non-overlapping in the destination,
// covering the request exactly when planning succeeds. Any crash, sanitizer report or contract
// violation is a bug. Shapes are kept to at most 2^16 elements' worth of runs per shard so a
// run does not spend its time in one huge (valid) plan.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common/geometry.h"

namespace {

class Input {
 public:
  Input(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint8_t Byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  // Mostly small numbers, sometimes raw 64-bit ones (overflow paths).
  uint64_t Number() {
    const uint8_t tag = Byte();
    if ((tag & 0xC0) == 0xC0) {
      uint64_t v = 0;
      for (int i = 0; i < 8; ++i) v = (v << 8) | Byte();
      return v;
    }
    return tag & 0x3F;
  }
  bool empty() const { return pos_ >= size_; }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

bool Small(const ckpt::ShardGeometry& g) {
  // Runs() is linear in the number of runs; bound it through the element count.
  return g.numel() <= (1u << 16);
}

std::optional<ckpt::ShardGeometry> MakeShard(Input& in, const ckpt::Shape& shape) {
  if (in.Byte() & 1) {
    auto g = ckpt::ShardGeometry::Flat(shape, in.Number(), in.Number());
    if (!g.ok() || !Small(*g)) return std::nullopt;
    return *g;
  }
  ckpt::Shape offsets, lengths;
  const size_t rank = (in.Byte() & 1) ? shape.size() : in.Byte() % 6;  // sometimes mismatched
  for (size_t d = 0; d < rank; ++d) {
    offsets.push_back(in.Number());
    lengths.push_back(in.Number());
  }
  auto g = ckpt::ShardGeometry::Box(shape, offsets, lengths);
  if (!g.ok() || !Small(*g)) return std::nullopt;
  return *g;
}

void CheckRuns(const ckpt::ShardGeometry& g) {
  uint64_t total = 0, last_end = 0, last_local = 0;
  bool first = true;
  for (const ckpt::Run& r : g.Runs()) {
    if (r.length == 0) std::abort();
    if (!first && (r.global_start < last_end || r.local_start < last_local)) std::abort();
    last_end = r.global_start + r.length;
    last_local = r.local_start + r.length;
    total += r.length;
    first = false;
  }
  if (total != g.numel()) std::abort();
  (void)g.ToString();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in(data, size);
  ckpt::Shape shape;
  const size_t rank = in.Byte() % 5;
  for (size_t d = 0; d < rank; ++d) shape.push_back(in.Number());
  auto numel = ckpt::ShapeNumel(shape);
  if (!numel.ok()) return 0;

  auto requested = MakeShard(in, shape);
  std::vector<ckpt::ShardGeometry> stored;
  while (!in.empty() && stored.size() < 8) {
    if (auto s = MakeShard(in, shape)) stored.push_back(*s);
  }
  for (const auto& s : stored) CheckRuns(s);
  (void)ckpt::CheckNoPartialOverlap("fuzz", stored);
  if (!requested) return 0;
  CheckRuns(*requested);

  auto plan = ckpt::PlanCopies("fuzz", *requested, stored);
  if (!plan.ok()) return 0;
  uint64_t covered = 0, next_dest = 0;
  for (const ckpt::CopyOp& op : *plan) {
    if (op.source >= stored.size()) std::abort();
    if (op.elements == 0) std::abort();
    if (op.dest_element < next_dest) std::abort();  // sorted, no overlap
    if (op.dest_element + op.elements > requested->numel()) std::abort();
    if (op.source_element + op.elements > stored[op.source].numel()) std::abort();
    next_dest = op.dest_element + op.elements;
    covered += op.elements;
  }
  if (covered != requested->numel()) std::abort();  // success means every element is covered
  return 0;
}
