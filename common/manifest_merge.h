// Merging node manifests into a step's Manifest: what a commit writes.
//
// Each node of a job reports what it persisted for a step as a NodeManifest: its tensors (the
// shards its ranks wrote), its ranks, and the shards its ranks registered but left to another
// rank under the writer plan (`skipped`). The Manifest is their union:
//   * shards of one tensor from several nodes are joined under one TensorEntry; a dtype or
//     global-shape disagreement is an error naming both nodes;
//   * shards of one tensor with the same geometry (data-parallel replicas written more than
//     once: no plan was in force yet, or the embedded coordinator, which writes everything)
//     are kept once, the lowest writer rank's copy; replicas whose checksums differ are an error
//     naming both ranks (shards may overlap only as exact replicas);
//   * a rank reported by two nodes is an error;
//   * every shard a rank skipped must have been written by some rank, with the same dtype,
//     global shape and geometry: a plan that changed while the step was in flight can make two
//     ranks each leave a replica to the other, and the step then fails here instead of
//     committing a hole;
//   * tensors come out in name order and ranks in rank order, as readers list them.
//
// ManifestMerger does this one node at a time, so that the coordinator can fold each node's
// report in as it arrives (on its commit thread, off the request threads) and leave only the
// last node and Finish for the commit itself: at 131,072 ranks, merging 16,384 node manifests
// at the end was most of the commit. Cost model, for N nodes, E tensor entries reported in all,
// D distinct tensors, S shards and K skipped shards:
//   Add     O(entries + shards + skipped of that node): each entry and shard is copied once
//           (onto the output's arena when it has one) and found again by name through a hash
//           index; a skipped shard already written is settled at once;
//   Finish  O(D log D + S log(S/D) + R log R + K'): sorts entry pointers by name (no entry moves),
//           a replica pass that compares geometries in place and copies only where some
//           geometry repeats, and the skipped shards not yet settled (K' ≤ K).
// The output Manifest and the merger must outlive nothing they point into: the merger keeps
// views into the output's own strings and entries, never into the NodeManifests given to Add.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <google/protobuf/arena.h>

#include "ckptd/v1/manifest.pb.h"
#include "common/layout_fingerprint.h"
#include "common/status.h"

namespace ckpt {

class ManifestMerger {
 public:
  struct Options {
    // Keep the digest of every stored shard's replica key (common/layout_fingerprint.h), for
    // Wrote: the coordinator checks skipped layouts with it. Computed as nodes are added.
    bool track_replica_keys = false;
  };
  // Builds into `out` (cleared now; on a protobuf Arena when it has one), which must outlive the
  // merger.
  explicit ManifestMerger(ckptd::v1::Manifest* out) : ManifestMerger(out, Options{}) {}
  ManifestMerger(ckptd::v1::Manifest* out, Options options);

  // Folds in one node's manifest (copied: `node` may go away afterwards). The first node sets
  // the job, step and world size; a node of another one is an error. After an error, every
  // later call returns the same error.
  //
  // `merged` (sorted): ranks of this node already folded in from its earlier report. A daemon
  // reports a step's node manifest again each time another of its ranks persists, each report
  // a superset of the last; only the shards, ranks and skipped shards of the other ranks are
  // added then.
  Status Add(const ckptd::v1::NodeManifest& node, std::span<const uint32_t> merged = {});
  // Ends the merge: name order, replicas kept once, skipped shards checked. `out` is then the
  // merged manifest (without created_unix_ms and writer, which the commit sets). Call once.
  Status Finish();

  size_t nodes() const { return nodes_.size(); }
  // Whether some node stored a shard whose replica key has this digest (track_replica_keys).
  bool Wrote(const LayoutFingerprint& key_digest) const {
    return written_keys_.count(key_digest) != 0;
  }

 private:
  struct Entry {
    ckptd::v1::TensorEntry* tensor;  // in out_
    uint32_t from;                   // index in nodes_ of the node that reported it first
  };
  // A skipped shard no node had written when its node was added.
  struct Pending {
    ckptd::v1::SkippedShard shard;
    uint32_t from;
  };
  bool Written(const ckptd::v1::SkippedShard& k) const;
  void TrackKeys(const ckptd::v1::TensorEntry& t, std::span<const uint32_t> merged);
  Status KeepReplicasOnce();

  ckptd::v1::Manifest* out_;
  const Options options_;
  Status failed_;
  std::vector<std::string> nodes_;                     // node ids in the order added, for errors
  std::unordered_map<std::string_view, Entry> index_;  // keys: the entries' own names
  std::unordered_set<uint32_t> ranks_;
  std::vector<Pending> pending_;
  std::unordered_set<LayoutFingerprint, LayoutFingerprintHash> written_keys_;
  bool finished_ = false;
};

// A ManifestMerger whose output lives on its own protobuf Arena (blocks of 64 KiB growing to
// 4 MiB): a manifest of 100,000+ ranks has hundreds of thousands of entries, and one malloc and
// free each was most of a commit. Not movable: the merger points into the arena.
class MergeOnArena {
 public:
  explicit MergeOnArena(ManifestMerger::Options options = {});
  MergeOnArena(const MergeOnArena&) = delete;
  MergeOnArena& operator=(const MergeOnArena&) = delete;

  ManifestMerger& merger() { return merger_; }
  ckptd::v1::Manifest& manifest() { return *manifest_; }

 private:
  google::protobuf::Arena arena_;
  ckptd::v1::Manifest* manifest_;
  ManifestMerger merger_;
};

// All of `nodes` merged into `out` (cleared first): ManifestMerger in one call.
Status MergeNodeManifestsInto(std::span<const ckptd::v1::NodeManifest> nodes,
                              ckptd::v1::Manifest* out);
// The same, into a fresh manifest.
Result<ckptd::v1::Manifest> MergeNodeManifests(std::span<const ckptd::v1::NodeManifest> nodes);

}  // namespace ckpt
