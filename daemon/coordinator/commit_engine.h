// CommitEngine: the commit protocol on the storage root (docs/design.md §2.5, §5.4, §6).
//
// A step becomes visible in exactly one rename: its MANIFEST. The order is
//   data files fdatasync'ed (by the flush engine) → node manifest(s) → MANIFEST via temp +
//   fdatasync + rename + fsync(step dir) → LATEST the same way → retention.
// A crash before the MANIFEST rename leaves a step directory without MANIFEST, which no loader
// ever reads and which RemoveUncommitted deletes at the next start; a crash after it leaves a
// committed step whose LATEST may lag — ResolveLatest falls back to the newest MANIFEST.
// Retention deletes the MANIFEST first (so a half-deleted step is merely uncommitted), never
// the newest committed step, never a pinned one (being loaded), and never an in-flight step
// (those have no MANIFEST and are not candidates).
//
// Used by the embedded coordinator of a single-node daemon and by ckpt-coordinator alike.
// Thread safety: Commit/RemoveStep/RemoveUncommitted are called from one thread (the storage
// thread); Latest/List/Pin/Unpin from any.
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
    uint32_t keep = 0;  // committed steps kept per job; 0 = all
    std::string writer = "ckptd";
    // Test hook: called at the named points of Commit ("before-manifest", "after-manifest",
    // "after-latest"); the coordinator's crash tests make it kill the process there.
    std::function<void(std::string_view point)> on_point;
  };
  CommitEngine(Config config, FileSystem* fs) : config_(std::move(config)), fs_(fs) {}

  // Removes every step directory without MANIFEST (and *.tmp files) under the root. Only safe
  // when no other writer uses the root (single node, or the coordinator). Returns what it removed.
  Result<std::vector<std::string>> RemoveUncommitted();

  // Writes MANIFEST merged from `nodes` (which must cover ranks 0..world_size-1), then LATEST,
  // then applies retention. `check`, when given, may veto the merged manifest before anything
  // is written (the coordinator checks that every registered shard has a writer). Returns the
  // manifest written.
  using ManifestCheck = std::function<Status(const ckptd::v1::Manifest&)>;
  Result<ckptd::v1::Manifest> Commit(std::span<const ckptd::v1::NodeManifest> nodes,
                                     const ManifestCheck& check = nullptr);

  // Deletes an uncommitted (aborted or failed) step's directory.
  Status RemoveStep(const std::string& job, uint64_t step);

  Result<std::optional<uint64_t>> Latest(const std::string& job) const;
  Result<std::vector<uint64_t>> List(const std::string& job) const;

  // A pinned step is never deleted by retention (a load is reading it). A step pinned after
  // retention removed its MANIFEST stays uncommitted: the pinning load finds no MANIFEST.
  void Pin(const std::string& job, uint64_t step);
  // Latest and Pin in one step, so retention cannot remove the step in between. The caller
  // unpins a step it got.
  Result<std::optional<uint64_t>> PinLatest(const std::string& job);
  void Unpin(const std::string& job, uint64_t step);

  const Config& config() const { return config_; }
  FileSystem* fs() const { return fs_; }

 private:
  Status ApplyRetention(const std::string& job);

  Config config_;
  FileSystem* fs_;
  mutable Mutex mu_;
  std::map<std::pair<std::string, uint64_t>, int> pins_ GUARDED_BY(mu_);
};

}  // namespace ckpt
