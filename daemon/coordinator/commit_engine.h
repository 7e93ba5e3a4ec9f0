// CommitEngine: the commit protocol on the storage root (docs/design.md §2.5, §5.4, §6).
//
// A step becomes visible in exactly one rename: its MANIFEST. The order is
//   data files fdatasync'ed (by the flush engine) → node manifest(s) → MANIFEST via temp +
//   fdatasync + rename + fsync(step dir) → LATEST the same way → retention.
// A crash before the MANIFEST rename leaves a step directory without MANIFEST, which no loader
// ever reads and which RemoveUncommitted deletes at the next start; a crash after it leaves a
// committed step whose LATEST may lag — ResolveLatest falls back to the newest MANIFEST.
//
// Retention (after every commit, per job, when keep > 0). The committed steps fall in three kinds:
//   * milestones — step % keep_every == 0 (keep_every > 0): kept for good;
//   * operator-pinned — a PINNED marker file in the step directory (PinForOperator): kept until
//     unpinned;
//   * the rest, the rolling window, of which the newest `keep` are kept.
// Milestones and pinned steps are outside the window: they neither count towards `keep` nor
// push a rolling step out. The newest committed step is never removed, whatever its kind. A
// window step that a load holds (Pin / PinLatest, in memory) is skipped and the next window
// step (oldest first) goes instead, so the window stays at `keep`; the held one is removed by a
// later commit once released. Removal deletes the MANIFEST first (so a half-deleted step is merely
// uncommitted, and in-flight steps, which have no MANIFEST, are never candidates), then the
// directory. RetentionVictims is the rule without I/O.
//
// Operator operations (the Admin API's Pin / Unpin / Delete). Pin writes the PINNED marker with
// the atomic-file helper (temp + fdatasync + rename + fsync of the step directory), so a pin
// survives a restart of the daemon or coordinator and is honoured by whichever engine applies
// retention to the root. It is distinct from a load's hold: unpinning never releases a load's
// hold, and a load ending never removes a marker. Delete removes one committed step the same way
// retention does, and refuses the newest committed step, a step that is not committed (in
// flight, or being removed), a pinned step and a step a load holds. All three take validated
// job names only (common/names.h), so no request leaves the root.
//
// Used by the embedded coordinator of a single-node daemon and by ckpt-coordinator alike; the
// operator operations belong to the engine that commits the job (docs/design.md §2.5).
// Thread safety: Commit/RemoveStep/RemoveUncommitted are called from one thread (the commit or
// storage thread); everything else from any. Each MANIFEST removal (retention, Delete) happens
// under mu_ right after re-checking that the step is still committed, unpinned and not held, so
// two removals never race for one step; directory removal and the markers' fsyncs run without
// a lock, so a large delete never holds up a commit or a load.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ckptd/v1/manifest.pb.h"
#include "common/file_system.h"
#include "common/mutex.h"

namespace ckpt {

class CommitEngine {
 public:
  struct Config {
    std::string storage_root;
    uint32_t keep = 0;  // rolling (non-milestone, unpinned) committed steps kept per job; 0 = all
    std::string writer = "ckptd";
    // Test hook: called at the named points of Commit ("before-manifest", "after-manifest",
    // "after-latest"); the coordinator's crash tests make it kill the process there.
    std::function<void(std::string_view point)> on_point;
    // Steps that are multiples of this are milestones, kept for good; 0 = none. Last, so that
    // the positional initialisers of the fields above stay valid.
    uint32_t keep_every = 0;
  };
  CommitEngine(Config config, FileSystem* fs) : config_(std::move(config)), fs_(fs) {}

  // Removes every step directory without MANIFEST (and *.tmp files) under the root. Only safe
  // when no other writer uses the root (single node, or the coordinator). Returns what it removed.
  Result<std::vector<std::string>> RemoveUncommitted();

  // Writes MANIFEST merged from `nodes` (which must cover ranks 0..world_size-1), then LATEST,
  // then applies retention. `check`, when given, may veto the merged manifest before anything
  // is written (the coordinator checks that every registered shard has a writer). The merged
  // manifest lives on a protobuf Arena for the call: at 131,072 ranks it has ~400,000 entries,
  // and one malloc and free each was most of the commit.
  using ManifestCheck = std::function<Status(const ckptd::v1::Manifest&)>;
  Status Commit(std::span<const ckptd::v1::NodeManifest> nodes,
                const ManifestCheck& check = nullptr);
  // The same for a manifest already merged (ManifestMerger::Finish, common/manifest_merge.h):
  // the coordinator merges each node's report as it arrives. Sets `merged`'s creation time and
  // writer, validates it and checks its coverage, then writes it as above.
  Status CommitMerged(ckptd::v1::Manifest& merged, const ManifestCheck& check = nullptr);
  // What a merged manifest must be to commit (or to stand for a memory-only step): every rank
  // reported, and valid (ValidateManifestForCommit).
  static Status CheckCommittable(const ckptd::v1::Manifest& merged);

  // Deletes an uncommitted (aborted or failed) step's directory.
  Status RemoveStep(const std::string& job, uint64_t step);

  Result<std::optional<uint64_t>> Latest(const std::string& job) const;
  Result<std::vector<uint64_t>> List(const std::string& job) const;

  // A step a load holds is never deleted by retention (the load is reading it). A step held
  // after retention removed its MANIFEST stays uncommitted: the load finds no MANIFEST.
  void Pin(const std::string& job, uint64_t step);
  // Latest and Pin in one step, so retention cannot remove the step in between. The caller
  // unpins a step it got.
  Result<std::optional<uint64_t>> PinLatest(const std::string& job);
  void Unpin(const std::string& job, uint64_t step);

  // ---- operator operations (durable; see the essay above) ----
  // Writes the step's PINNED marker. Errors: INVALID_ARGUMENT for a bad job name, NOT_FOUND
  // when the step is not committed. Pinning a pinned step is not an error.
  Status PinForOperator(const std::string& job, uint64_t step);
  // Removes the marker; the step becomes a rolling step again and the next commit's retention
  // may remove it. NOT_FOUND when the step is not committed; FAILED_PRECONDITION when it is not
  // pinned.
  Status UnpinForOperator(const std::string& job, uint64_t step);
  // Deletes a committed step (MANIFEST first). NOT_FOUND when no such step exists;
  // FAILED_PRECONDITION when it is the newest committed step, not committed (in flight), pinned,
  // or held by a load.
  Status DeleteCommitted(const std::string& job, uint64_t step);
  // The operator-pinned committed steps of a job, ascending.
  Result<std::vector<uint64_t>> ListPinned(const std::string& job) const;

  // Which of `committed` (ascending, the job's committed steps) retention removes, given which
  // are operator-pinned and which a load holds: the rule of the essay, without I/O. Ascending.
  static std::vector<uint64_t> RetentionVictims(const std::vector<uint64_t>& committed,
                                                const std::set<uint64_t>& pinned,
                                                const std::set<uint64_t>& held, uint32_t keep,
                                                uint32_t keep_every);

  const Config& config() const { return config_; }
  FileSystem* fs() const { return fs_; }

 private:
  Status ApplyRetention(const std::string& job);
  Status RemoveStepDir(const std::string& job, uint64_t step);
  Result<bool> IsPinned(const std::string& job, uint64_t step) const;
  // NOT_FOUND (prefixed by `what`) unless step directory `dir` holds a MANIFEST.
  Status RequireCommitted(const std::string& job, uint64_t step, const std::string& dir,
                          const std::string& what);

  Config config_;
  FileSystem* fs_;
  mutable Mutex mu_;
  std::map<std::pair<std::string, uint64_t>, int> pins_ GUARDED_BY(mu_);
};

}  // namespace ckpt
