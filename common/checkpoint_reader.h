// Reading a checkpoint: any requested shard of any tensor, from whatever stored shards cover
// it, reading only the bytes needed and verifying every checksum piece it touches.
//
// A read is planned in three steps. (1) For each request, PlanCopies intersects the requested
// geometry with the stored shards of the tensor. (2) Each copy touches some checksum pieces of
// stored shards; the pieces needed by all requests together are collected once, so pieces
// wanted by several requests (replicas loaded by several ranks) are read once. (3) Pieces are
// grouped per file in offset order and coalesced into aligned reads of up to max_read_bytes,
// issued by io_threads threads (O_DIRECT where possible). Each piece is verified before any of
// its bytes are copied out; a mismatch fails the whole read naming file, tensor and piece.
// A caller that keeps checkpoint bytes in memory (the daemon's hot cache) passes ReadHooks:
// pieces it holds are verified and taken from memory, and only the others are read — with every
// piece resident, Read opens no data file at all.
//
// Thread safety: Read, Verify and VerifyRange may run concurrently; the reader owns no mutable
// state but its counters (atomic) and VerifyRange's index of checksum pieces (one mutex).
#pragma once

#include <atomic>
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ckptd/v1/manifest.pb.h"
#include "common/file_system.h"
#include "common/geometry.h"
#include "common/mutex.h"

namespace ckpt {

namespace read_plan {
struct FilePieces;  // checkpoint_reader.cc
}

class CheckpointReader {
 public:
  struct Options {
    uint64_t max_read_bytes = 16ull << 20;
    int io_threads = 8;
    bool try_direct = true;
  };

  // Reads and validates <step_dir>/MANIFEST.
  static Result<std::unique_ptr<CheckpointReader>> Open(FileSystem* fs, std::string step_dir,
                                                        Options options);
  static Result<std::unique_ptr<CheckpointReader>> Open(FileSystem* fs, std::string step_dir) {
    return Open(fs, std::move(step_dir), Options());
  }
  // For a manifest already in hand (the daemon has it in memory).
  CheckpointReader(FileSystem* fs, std::string step_dir, ckptd::v1::Manifest manifest,
                   Options options);

  const ckptd::v1::Manifest& manifest() const { return manifest_; }
  const std::string& step_dir() const { return step_dir_; }
  // nullptr when the step has no tensor of that name.
  const ckptd::v1::TensorEntry* FindTensor(std::string_view name) const;

  // Where verified bytes of a request go when they cannot simply be memcpy'd into `dest` (memory
  // behind a handle): `size` bytes at byte `offset` of the requested shard. Called from the I/O
  // threads, concurrently for distinct ranges; a non-ok status fails the read.
  using Sink = std::function<Status(uint64_t offset, const std::byte* src, uint64_t size)>;

  struct Request {
    std::string tensor;
    ShardGeometry geometry;     // requested shard; its global shape must match the stored one
    std::string dtype;          // must match the stored dtype
    std::span<std::byte> dest;  // numel(geometry) * element size bytes; ignored when sink is set
    Sink sink;                  // optional: receives the bytes instead of dest
  };

  // Optional hooks for a caller that keeps checkpoint bytes in memory (the daemon's hot cache).
  struct ReadHooks {
    // Bytes [offset, offset + length) of data file `file` (as named in the manifest) if resident,
    // else nullptr; asked once per needed checksum piece, from the calling thread, before any
    // storage I/O. Resident bytes are verified like stored ones; a piece that fails is read from
    // storage instead. The pointer must stay valid until Read returns.
    std::function<const std::byte*(const std::string& file, uint64_t offset, uint64_t length)>
        find_resident;
    // Each piece read from storage, after its checksum matched. From the I/O threads, concurrently.
    std::function<void(const std::string& file, uint64_t offset, const std::byte* data,
                       uint64_t length)>
        on_storage_piece;
  };
  // Added to (not reset) by Read.
  struct ReadStats {
    uint64_t bytes_from_memory = 0;   // piece bytes taken from find_resident
    uint64_t bytes_from_storage = 0;  // bytes read from data files (aligned reads)
  };

  // Fills every request's dest (or sink). Errors: unknown tensor (kNotFound), dtype/shape
  // mismatch (kInvalidArgument naming both), incomplete coverage, I/O errors, checksum mismatch
  // (kDataLoss). On error the dest contents are unspecified. `hooks` and `stats` may be null.
  Status Read(std::span<const Request> requests, const ReadHooks* hooks = nullptr,
              ReadStats* stats = nullptr);

  // The byte ranges of data files that Read(requests, hooks) would read from storage now: the
  // checksum pieces the requests touch that find_resident does not hold, joined where they
  // touch, per file in offset order. Errors as Read's planning (unknown tensor, mismatches).
  struct FileRange {
    std::string file;
    uint64_t offset = 0;
    uint64_t length = 0;
  };
  Result<std::vector<FileRange>> StorageRanges(std::span<const Request> requests,
                                               const ReadHooks* hooks) const;

  // Reads every stored byte of every shard and checks each checksum and that each data file is
  // long enough. Returns one line per problem found (empty when the step is intact).
  Result<std::vector<std::string>> Verify();

  // Checks bytes [offset, offset + length) of data file `file`, held in `data` (fetched from
  // another daemon, say), against the manifest: every checksum piece lying wholly inside the
  // range. Pieces it only partly covers are not checked (Read checks them when it uses them);
  // shards whose checksum fields are malformed are skipped likewise. kDataLoss names the
  // first piece that differs. The first call indexes the manifest's shards by file (O(shards),
  // once), the first call for a file its pieces (O(its pieces)); then a call costs
  // O(log pieces + the bytes checked). Memory: 8 bytes per shard, 32 per piece of the files
  // checked.
  Status VerifyRange(const std::string& file, uint64_t offset, const std::byte* data,
                     uint64_t length) const;

  uint64_t bytes_read() const { return bytes_read_.load(std::memory_order_relaxed); }

 private:
  // Steps (1) and (2) of Read: the checksum pieces the requests need, each once, per file.
  Status PlanPieces(std::span<const Request> requests,
                    std::vector<read_plan::FilePieces>* pieces) const;

  // One checksum piece of a data file, for VerifyRange.
  struct PieceSum {
    uint64_t offset;
    uint64_t length;
    uint64_t xxh3;
    uint32_t tensor;  // index into the manifest, for the message
  };
  // The pieces of `file` by offset, built on first use.
  std::shared_ptr<const std::vector<PieceSum>> PiecesOf(const std::string& file) const
      EXCLUDES(index_mu_);
  struct FileIndex {
    std::vector<std::pair<uint32_t, uint32_t>> shards;    // (tensor, shard) stored in the file
    std::shared_ptr<const std::vector<PieceSum>> pieces;  // null until first asked for
  };

  FileSystem* fs_;
  std::string step_dir_;
  ckptd::v1::Manifest manifest_;
  Options options_;
  std::atomic<uint64_t> bytes_read_{0};
  mutable Mutex index_mu_;
  mutable bool files_indexed_ GUARDED_BY(index_mu_) = false;
  mutable std::map<std::string, FileIndex, std::less<>> files_ GUARDED_BY(index_mu_);
};

}  // namespace ckpt
