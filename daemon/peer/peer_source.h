// PeerSource: where a FETCH's bytes come from. The daemon's source (DaemonPeerSource) looks, in
// order, in the regions other nodes PUT here (PeerStore), in the hot cache (the steps this node
// captured or loaded, daemon/hot_cache.h), and last in storage through the FileSystem — the step
// directory's data file under the storage root, only once the step is committed (MANIFEST
// present: before that the file may hold preallocated zeros where a write has not landed). The
// bytes of a FETCH are checksummed for the wire only; a reader that restores a checkpoint still
// verifies them against the manifest, as it does bytes from its own storage. A region may be served
// partly from the cache and partly from storage: the cache is consulted per host-pool slot window,
// and a step's data file never changes once written, so the pieces agree.
//
// Read blocks (storage): the server calls it on its pool threads, never on its loop.
// Thread safety: Read from any number of threads at once.
#pragma once

#include <cstddef>
#include <functional>
#include <string>

#include "common/file_system.h"
#include "common/status.h"
#include "daemon/peer/peer_protocol.h"

namespace ckpt {
class HotCache;
}

namespace ckpt::peer {

class PeerStore;

class PeerSource {
 public:
  virtual ~PeerSource() = default;
  // Copies the region (region.length bytes) into `out`. kNotFound when this node has no such
  // step or file, kOutOfRange when the region runs past the file's end; messages name the
  // region.
  virtual Status Read(const Region& region, std::byte* out) = 0;
};

class DaemonPeerSource final : public PeerSource {
 public:
  // Any of store, hot may be null (skipped). `window`: the hot cache's window size (the host
  // pool's slot size); 0 treats the region as one window.
  DaemonPeerSource(PeerStore* store, HotCache* hot, uint64_t window, FileSystem* fs,
                   std::string storage_root)
      : store_(store), hot_(hot), window_(window), fs_(fs), root_(std::move(storage_root)) {}

  // For a cold load across nodes (daemon/load_service.h): `wait_staged` returns once this node
  // has read the region if it is one it serves (a FETCH that arrives first waits for it rather
  // than read it a second time); `on_storage_read` counts what Read had to read from storage,
  // which it also keeps in the hot cache for the next peer asking. Set before serving.
  void SetLoadHooks(std::function<void(const Region& region)> wait_staged,
                    std::function<void(const std::string& job, uint64_t bytes)> on_storage_read) {
    wait_staged_ = std::move(wait_staged);
    on_storage_read_ = std::move(on_storage_read);
  }

  Status Read(const Region& region, std::byte* out) override;

 private:
  Status ReadStorage(const Region& region, std::byte* out);

  PeerStore* store_;
  HotCache* hot_;
  uint64_t window_;
  FileSystem* fs_;
  std::string root_;
  std::function<void(const Region&)> wait_staged_;
  std::function<void(const std::string&, uint64_t)> on_storage_read_;
};

}  // namespace ckpt::peer
