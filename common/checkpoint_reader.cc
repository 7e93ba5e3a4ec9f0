// Implemented with its header; see checkpoint_reader.h for the three-step plan.
//
// Shape of the code: both Read and Verify reduce to a list of *pieces* (one checksum piece of
// one stored shard: file range, expected XXH3, where its bytes go), grouped by data file.
// PieceReader turns each file's pieces, in offset order, into aligned reads and runs them on
// io_threads threads; what happens to a piece once read (verify and copy out, or verify and note
// a problem) is the caller's PieceSink. Read first takes what it can from resident memory
// (ReadHooks::find_resident), in parallel on the same number of threads, and reads only the rest
// from storage — opening only the files it still needs, so a hot restore touches no file.
//
// Memory: each I/O thread owns one AlignedBuffer as long as the longest read of the call (at
// most max_read_bytes, or one piece when a piece is longer), so a read of any size is bounded by
// io_threads × that, plus the caller's destinations. Buffers outlive the call in a small
// process-wide cache (common/buffer_cache.h): a daemon serving loads one after another would
// otherwise fault in and zero io_threads fresh 16 MiB buffers per call — measured at 53k page
// faults for a 256 MiB cold load — on the core it shares with capture.
#include "common/checkpoint_reader.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <new>
#include <system_error>
#include <thread>
#include <tuple>
#include <unordered_map>

#include "common/buffer_cache.h"
#include "common/checksum.h"
#include "common/data_layout.h"
#include "common/dtype.h"
#include "common/manifest_io.h"
#include "common/mutex.h"
#include "common/names.h"

namespace ckpt {
namespace read_plan {

// Where a piece's bytes go: `length` bytes from `piece_offset` inside the piece to byte
// `dest_offset` of request `request`.
struct CopySegment {
  uint64_t piece_offset;
  uint64_t length;
  uint32_t request;
  uint64_t dest_offset;
};

// One checksum piece of one stored shard.
struct Piece {
  uint32_t tensor;
  uint32_t shard;
  uint32_t index;        // which checksum of the shard
  uint64_t file_offset;  // shard.offset + index * chunk_size
  uint64_t length;
  uint64_t expected_xxh3;
  std::vector<CopySegment> copies;  // empty for Verify
};

// The pieces of one data file, sorted by file_offset before reading.
struct FilePieces {
  std::string name;  // relative to the step directory, as in the manifest
  std::vector<Piece> pieces;
};

}  // namespace read_plan

namespace {

using read_plan::CopySegment;
using read_plan::FilePieces;
using read_plan::Piece;

using ckptd::v1::StoredShard;
using ckptd::v1::TensorEntry;

std::string Quote(std::string_view name) { return "'" + EscapeForLog(name) + "'"; }

std::string ShapeToString(std::span<const uint64_t> shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

std::string Hex(uint64_t v) {
  char buf[19];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// A run of pieces of one file read with one aligned buffer.
struct ReadOp {
  uint32_t file;
  uint64_t offset;  // 4096-aligned
  uint64_t length;  // 4096-aligned; covers pieces [first, end)
  uint32_t first;
  uint32_t end;
};

// What to do with pieces. Called from the I/O threads, concurrently for distinct pieces.
struct PieceSink {
  // The piece's bytes were read; `bytes` holds exactly piece.length bytes. A non-ok status stops
  // the whole read.
  std::function<Status(const FilePieces& file, const Piece& piece, const std::byte* bytes)>
      on_piece;
  // The file ended before the piece (`file_end` is where it ended). Non-ok stops the read.
  std::function<Status(const FilePieces& file, const Piece& piece, uint64_t file_end)> on_short;
  // A read failed with an I/O error. Non-ok stops the read.
  std::function<Status(const FilePieces& file, const ReadOp& op, const Status& error)> on_error;
};

// Runs work(state, i) for every i in [0, n) on up to `threads` threads (the caller's among them),
// each with its own default-constructed State; the first error stops the others before their
// next item and is returned.
template <typename State, typename Work>
Status ParallelFor(size_t n, int threads, Work work) {
  if (n == 0) return Status::Ok();
  std::atomic<size_t> next{0};
  std::atomic<bool> stop{false};
  struct {
    Mutex mu;
    Status first GUARDED_BY(mu);
  } error;
  auto worker = [&] {
    State state;
    while (!stop.load(std::memory_order_relaxed)) {
      const size_t i = next.fetch_add(1, std::memory_order_relaxed);
      if (i >= n) return;
      Status s = work(state, i);
      if (!s.ok()) {
        MutexLock lock(error.mu);
        if (error.first.ok()) error.first = std::move(s);
        stop.store(true, std::memory_order_relaxed);
      }
    }
  };
  const size_t count = std::clamp<size_t>(static_cast<size_t>(std::max(threads, 1)), 1, n);
  {
    std::vector<std::jthread> pool;
    pool.reserve(count - 1);
    for (size_t t = 1; t < count; ++t) {
      try {
        pool.emplace_back(worker);
      } catch (const std::system_error&) {
        break;  // fewer threads is slower, not wrong: this one and any started go on
      }
    }
    worker();
  }  // joins
  MutexLock lock(error.mu);
  return error.first;
}

// Cuts each file's pieces into aligned reads of up to max_read_bytes (a single piece larger than
// that is one read, issued as several PReads). Adjacent pieces — in aligned terms, so small
// shards packed one per 4 KiB block coalesce too — share a read. Pieces must be sorted per file.
std::vector<ReadOp> PlanReads(const std::vector<FilePieces>& files, uint64_t max_read_bytes) {
  std::vector<ReadOp> ops;
  for (uint32_t f = 0; f < files.size(); ++f) {
    const auto& pieces = files[f].pieces;
    for (uint32_t i = 0; i < pieces.size(); ++i) {
      const uint64_t start = AlignDown(pieces[i].file_offset, kIoAlignment);
      const uint64_t end = AlignUp(pieces[i].file_offset + pieces[i].length, kIoAlignment);
      if (!ops.empty() && ops.back().file == f) {
        ReadOp& op = ops.back();
        const uint64_t op_end = op.offset + op.length;
        if (start <= op_end && std::max(end, op_end) - op.offset <= max_read_bytes) {
          op.length = std::max(end, op_end) - op.offset;
          op.end = i + 1;
          continue;
        }
      }
      ops.push_back(ReadOp{f, start, end - start, i, i + 1});
    }
  }
  return ops;
}

class PieceReader {
 public:
  PieceReader(const CheckpointReader::Options& options, std::atomic<uint64_t>* bytes_read)
      : options_(options), bytes_read_(bytes_read) {}

  // `handles[f]` is the open data file of files[f] (null: skip its pieces).
  Status Run(const std::vector<FilePieces>& files,
             const std::vector<std::unique_ptr<File>>& handles, const PieceSink& sink) {
    const uint64_t max_read = AlignUp(std::max<uint64_t>(options_.max_read_bytes, 1), kIoAlignment);
    const std::vector<ReadOp> ops = PlanReads(files, max_read);
    // A buffer as long as the longest read, not max_read_bytes: small reads stay cheap
    // (a fresh 16 MiB costs ~4k page faults when the cache has none to lend).
    uint64_t buffer_size = 0;
    for (const ReadOp& op : ops) buffer_size = std::max(buffer_size, op.length);
    return ParallelFor<BorrowedBuffer>(
        ops.size(), options_.io_threads, [&](BorrowedBuffer& borrowed, size_t i) -> Status {
          const ReadOp& op = ops[i];
          if (handles[op.file] == nullptr) return Status::Ok();
          if (borrowed.size() < buffer_size) {
            try {
              borrowed.Reserve(buffer_size);
            } catch (const std::bad_alloc&) {
              return ResourceExhausted("cannot allocate a read buffer of " +
                                       std::to_string(buffer_size) + " bytes");
            }
          }
          return RunOne(files[op.file], *handles[op.file], op, borrowed.buffer(), max_read, sink);
        });
  }

  uint64_t bytes() const { return bytes_.load(std::memory_order_relaxed); }

 private:
  Status RunOne(const FilePieces& fp, File& file, const ReadOp& op, AlignedBuffer& buffer,
                uint64_t max_read, const PieceSink& sink) {
    // Bytes we must have; the aligned tail beyond them is padding that a file written by someone
    // else may lack, so EOF there is fine.
    uint64_t needed = 0;
    for (uint32_t p = op.first; p < op.end; ++p) {
      needed = std::max(needed, fp.pieces[p].file_offset + fp.pieces[p].length - op.offset);
    }
    uint64_t got = 0;
    while (got < needed) {
      const size_t ask = static_cast<size_t>(std::min(op.length - got, max_read));
      auto n = file.PRead(buffer.data() + got, ask, op.offset + got);
      if (!n.ok()) {
        Status s = n.status().WithContext("reading " + std::to_string(op.length) +
                                          " bytes at offset " + std::to_string(op.offset));
        return sink.on_error(fp, op, s);
      }
      got += *n;
      bytes_read_->fetch_add(*n, std::memory_order_relaxed);
      bytes_.fetch_add(*n, std::memory_order_relaxed);
      // A regular file reads short only at its end; under O_DIRECT a further read at an
      // unaligned offset would fail with EINVAL, so stop here.
      if (*n == 0 || (*n < ask && got % kIoAlignment != 0)) break;
    }
    for (uint32_t p = op.first; p < op.end; ++p) {
      const Piece& piece = fp.pieces[p];
      const uint64_t at = piece.file_offset - op.offset;
      if (at + piece.length > got) {
        RETURN_IF_ERROR(sink.on_short(fp, piece, op.offset + got));
        continue;
      }
      RETURN_IF_ERROR(sink.on_piece(fp, piece, buffer.data() + at));
    }
    return Status::Ok();
  }

  const CheckpointReader::Options& options_;
  std::atomic<uint64_t>* bytes_read_;  // the reader's counter
  std::atomic<uint64_t> bytes_{0};     // this run's
};

// Checks the fields of a stored shard that the reader relies on, so that a manifest handed to
// the constructor without validation cannot make it divide by zero or read out of bounds.
Status CheckStoredShard(const TensorEntry& t, int s, uint64_t numel, uint32_t element_size) {
  const StoredShard& shard = t.shards(s);
  const std::string ctx = "tensor " + Quote(t.name()) + " shard " + std::to_string(s);
  if (shard.chunk_size() == 0 || shard.chunk_size() % kIoAlignment != 0) {
    return InvalidArgument(ctx + ": chunk size " + std::to_string(shard.chunk_size()) +
                           " is not a positive multiple of 4096");
  }
  if (shard.offset() % kIoAlignment != 0) {
    return InvalidArgument(ctx + ": offset " + std::to_string(shard.offset()) +
                           " is not 4096-aligned");
  }
  if (shard.length() != numel * element_size) {
    return InvalidArgument(ctx + ": length " + std::to_string(shard.length()) + " but " +
                           std::to_string(numel) + " elements of " + t.dtype() + " are " +
                           std::to_string(numel * element_size) + " bytes");
  }
  if (static_cast<uint64_t>(shard.chunk_xxh3_size()) !=
      ChunkCount(shard.length(), shard.chunk_size())) {
    return InvalidArgument(ctx + ": " + std::to_string(shard.chunk_xxh3_size()) +
                           " checksums for " + std::to_string(shard.length()) + " bytes in " +
                           std::to_string(shard.chunk_size()) + "-byte chunks");
  }
  if (shard.file().empty() || shard.file().find('/') != std::string::npos || shard.file() == "." ||
      shard.file() == "..") {
    return InvalidArgument(ctx + ": data file name " + Quote(shard.file()) +
                           " is not a plain file name");
  }
  return Status::Ok();
}

Piece MakePiece(const TensorEntry& t, uint32_t tensor, uint32_t s, uint32_t index) {
  const StoredShard& shard = t.shards(static_cast<int>(s));
  const uint64_t begin = uint64_t{index} * shard.chunk_size();
  return Piece{tensor,
               s,
               index,
               shard.offset() + begin,
               std::min(shard.chunk_size(), shard.length() - begin),
               shard.chunk_xxh3(static_cast<int>(index)),
               {}};
}

// "data file <dir>/rank-00001.data (tensor 'w' shard 2 piece 5, file offset 20480, 4096 bytes)".
std::string DescribePiece(const std::string& path, const TensorEntry& t, const Piece& p) {
  return "data file " + path + " (tensor " + Quote(t.name()) + " shard " + std::to_string(p.shard) +
         " piece " + std::to_string(p.index) + ", file offset " + std::to_string(p.file_offset) +
         ", " + std::to_string(p.length) + " bytes)";
}

bool SortedByOffset(const Piece& a, const Piece& b) { return a.file_offset < b.file_offset; }

}  // namespace

Result<std::unique_ptr<CheckpointReader>> CheckpointReader::Open(FileSystem* fs,
                                                                 std::string step_dir,
                                                                 Options options) {
  ASSIGN_OR_RETURN(ckptd::v1::Manifest manifest, ReadManifest(fs, step_dir));
  return std::make_unique<CheckpointReader>(fs, std::move(step_dir), std::move(manifest), options);
}

CheckpointReader::CheckpointReader(FileSystem* fs, std::string step_dir,
                                   ckptd::v1::Manifest manifest, Options options)
    : fs_(fs), step_dir_(std::move(step_dir)), manifest_(std::move(manifest)), options_(options) {}

std::shared_ptr<const std::vector<CheckpointReader::PieceSum>> CheckpointReader::PiecesOf(
    const std::string& file) const {
  std::vector<std::pair<uint32_t, uint32_t>> shards;  // (tensor, shard) of the file
  {
    MutexLock lock(index_mu_);
    if (!files_indexed_) {  // one pass over the manifest, for every file at once
      for (int t = 0; t < manifest_.tensors_size(); ++t) {
        const auto& tensor = manifest_.tensors(t);
        for (int s = 0; s < tensor.shards_size(); ++s) {
          files_[tensor.shards(s).file()].shards.emplace_back(t, s);
        }
      }
      files_indexed_ = true;
    }
    auto it = files_.find(file);
    if (it == files_.end()) return std::make_shared<const std::vector<PieceSum>>();
    if (it->second.pieces != nullptr) return it->second.pieces;
    shards = it->second.shards;
  }
  // The file's pieces, built outside the lock: another file's checks do not wait for them.
  auto pieces = std::make_shared<std::vector<PieceSum>>();
  for (const auto& [t, s] : shards) {
    const auto& shard = manifest_.tensors(static_cast<int>(t)).shards(static_cast<int>(s));
    if (shard.chunk_size() == 0 || static_cast<uint64_t>(shard.chunk_xxh3_size()) !=
                                       ChunkCount(shard.length(), shard.chunk_size())) {
      continue;  // malformed: Read refuses it with a message
    }
    for (int i = 0; i < shard.chunk_xxh3_size(); ++i) {
      const uint64_t begin = static_cast<uint64_t>(i) * shard.chunk_size();
      pieces->push_back(PieceSum{shard.offset() + begin,
                                 std::min(shard.chunk_size(), shard.length() - begin),
                                 shard.chunk_xxh3(i), t});
    }
  }
  std::sort(pieces->begin(), pieces->end(),
            [](const PieceSum& a, const PieceSum& b) { return a.offset < b.offset; });
  MutexLock lock(index_mu_);
  auto& kept = files_[file].pieces;
  if (kept == nullptr) kept = std::move(pieces);  // else another thread built the same first
  return kept;
}

Status CheckpointReader::VerifyRange(const std::string& file, uint64_t offset,
                                     const std::byte* data, uint64_t length) const {
  const auto pieces = PiecesOf(file);
  const uint64_t end = offset + length;
  auto it = std::lower_bound(pieces->begin(), pieces->end(), offset,
                             [](const PieceSum& p, uint64_t at) { return p.offset < at; });
  // Pieces of a file never overlap: sorted by offset, the first one that runs past the range
  // ends the pieces inside it (a malformed manifest's overlapping ones are checked or not).
  for (; it != pieces->end() && it->offset + it->length <= end &&
         it->offset + it->length > it->offset;
       ++it) {
    const uint64_t actual = Xxh3(data + (it->offset - offset), it->length);
    if (actual != it->xxh3) {
      return DataLoss("checksum mismatch in " + file + " [" + std::to_string(it->offset) + ", " +
                      std::to_string(it->offset + it->length) + ") of tensor " +
                      Quote(manifest_.tensors(static_cast<int>(it->tensor)).name()) +
                      ": expected xxh3 " + Hex(it->xxh3) + ", got " + Hex(actual));
    }
  }
  return Status::Ok();
}

const TensorEntry* CheckpointReader::FindTensor(std::string_view name) const {
  for (const auto& t : manifest_.tensors()) {
    if (t.name() == name) return &t;
  }
  return nullptr;
}

Status CheckpointReader::PlanPieces(std::span<const Request> requests,
                                    std::vector<read_plan::FilePieces>* pieces) const {
  auto& files = *pieces;
  // Index of tensors by name, built per call: the reader keeps no mutable state.
  std::unordered_map<std::string_view, uint32_t> by_name;
  by_name.reserve(static_cast<size_t>(manifest_.tensors_size()));
  for (int i = 0; i < manifest_.tensors_size(); ++i) {
    by_name.emplace(manifest_.tensors(i).name(), static_cast<uint32_t>(i));
  }
  // Stored geometries of the tensors requested, converted once per call.
  std::unordered_map<uint32_t, std::vector<ShardGeometry>> stored;

  // (1) + (2): plan each request; collect the pieces all requests need, each once:
  // (tensor, shard, piece) → (file, position in the file's list).
  std::unordered_map<std::string, uint32_t> file_index;
  using PieceIndex =
      std::map<std::tuple<uint32_t, uint32_t, uint32_t>, std::pair<uint32_t, uint32_t>>;
  PieceIndex piece_index;
  const PieceIndex::value_type* last_piece = nullptr;  // map nodes are stable

  for (uint32_t ri = 0; ri < requests.size(); ++ri) {
    const Request& r = requests[ri];
    auto it = by_name.find(r.tensor);
    if (it == by_name.end()) {
      return NotFound("tensor " + Quote(r.tensor) + " is not in the checkpoint " + step_dir_ +
                      " (job " + manifest_.job() + ", step " + std::to_string(manifest_.step()) +
                      ")");
    }
    const uint32_t ti = it->second;
    const TensorEntry& t = manifest_.tensors(static_cast<int>(ti));
    const std::string ctx = "tensor " + Quote(t.name());
    if (r.dtype != t.dtype()) {
      return InvalidArgument(ctx + ": requested dtype " + r.dtype + " but the checkpoint " +
                             step_dir_ + " stores " + t.dtype());
    }
    ASSIGN_OR_RETURN(DTypeInfo dtype, LookupDType(t.dtype()), ctx);
    const uint64_t es = dtype.element_size;
    const Shape global(t.global_shape().begin(), t.global_shape().end());
    if (r.geometry.global_shape() != global) {
      return InvalidArgument(ctx + ": requested global shape " +
                             ShapeToString(r.geometry.global_shape()) + " but the checkpoint " +
                             step_dir_ + " stores " + ShapeToString(global));
    }
    if (!r.sink && r.dest.size() != r.geometry.numel() * es) {
      return InvalidArgument(ctx + ": destination holds " + std::to_string(r.dest.size()) +
                             " bytes but " + r.geometry.ToString() + " of " + t.dtype() +
                             " needs " + std::to_string(r.geometry.numel() * es));
    }
    auto [sit, fresh] = stored.try_emplace(ti);
    if (fresh) {
      sit->second.reserve(static_cast<size_t>(t.shards_size()));
      for (int s = 0; s < t.shards_size(); ++s) {
        ASSIGN_OR_RETURN(ShardGeometry g, GeometryFromProto(t.shards(s).geometry(), global),
                         ctx + " shard " + std::to_string(s));
        RETURN_IF_ERROR(CheckStoredShard(t, s, g.numel(), dtype.element_size));
        sit->second.push_back(std::move(g));
      }
    }
    ASSIGN_OR_RETURN(std::vector<CopyOp> plan, PlanCopies(t.name(), r.geometry, sit->second),
                     "checkpoint " + step_dir_);

    for (const CopyOp& op : plan) {
      const StoredShard& shard = t.shards(static_cast<int>(op.source));
      const uint64_t chunk = shard.chunk_size();
      uint64_t src = op.source_element * es;
      const uint64_t src_end = src + op.elements * es;
      uint64_t dest = op.dest_element * es;
      while (src < src_end) {
        const auto index = static_cast<uint32_t>(src / chunk);
        const uint64_t piece_begin = uint64_t{index} * chunk;
        const uint64_t n = std::min(src_end, piece_begin + chunk) - src;
        // Consecutive ops (the rows of a box) mostly hit the piece before: skip the map then.
        const std::tuple<uint32_t, uint32_t, uint32_t> key{ti, op.source, index};
        if (!last_piece || last_piece->first != key) {
          auto [pit, added] = piece_index.try_emplace(key);
          if (added) {
            auto [fit, new_file] =
                file_index.try_emplace(shard.file(), static_cast<uint32_t>(files.size()));
            if (new_file) files.push_back(FilePieces{shard.file(), {}});
            auto& list = files[fit->second].pieces;
            pit->second = {fit->second, static_cast<uint32_t>(list.size())};
            list.push_back(MakePiece(t, ti, op.source, index));
          }
          last_piece = &*pit;
        }
        const auto [fi, pi] = last_piece->second;
        files[fi].pieces[pi].copies.push_back(CopySegment{src - piece_begin, n, ri, dest});
        src += n;
        dest += n;
      }
    }
  }
  piece_index.clear();
  return Status::Ok();
}

Status CheckpointReader::Read(std::span<const Request> requests, const ReadHooks* hooks,
                              ReadStats* stats) {
  // (1) + (2): the pieces all requests need, each once.
  std::vector<FilePieces> files;
  RETURN_IF_ERROR(PlanPieces(requests, &files));

  auto tensor_of = [&](const Piece& p) -> const TensorEntry& {
    return manifest_.tensors(static_cast<int>(p.tensor));
  };
  auto mismatch = [&](const FilePieces& f, const Piece& p, uint64_t actual) {
    return DataLoss("checksum mismatch in " +
                    DescribePiece(JoinPath(step_dir_, f.name), tensor_of(p), p) +
                    ": expected xxh3 " + Hex(p.expected_xxh3) + ", read " + Hex(actual));
  };
  // Copies a verified piece out to every request that wants some of it.
  auto deliver = [&](const FilePieces& f, const Piece& p, const std::byte* bytes) -> Status {
    for (const CopySegment& c : p.copies) {
      const Request& r = requests[c.request];
      if (r.sink) {
        RETURN_IF_ERROR(
            r.sink(c.dest_offset, bytes + c.piece_offset, c.length),
            "delivering " + DescribePiece(JoinPath(step_dir_, f.name), tensor_of(p), p));
      } else {
        std::memcpy(r.dest.data() + c.dest_offset, bytes + c.piece_offset, c.length);
      }
    }
    return Status::Ok();
  };

  // Resident pieces first: verified and delivered in parallel; those that are not resident, or
  // whose resident bytes fail their checksum, stay in the lists for storage.
  uint64_t from_memory = 0;
  if (hooks != nullptr && hooks->find_resident) {
    struct Resident {
      uint32_t file;
      uint32_t piece;
      const std::byte* bytes;
    };
    std::vector<Resident> resident;
    for (uint32_t f = 0; f < files.size(); ++f) {
      for (uint32_t p = 0; p < files[f].pieces.size(); ++p) {
        const Piece& piece = files[f].pieces[p];
        const std::byte* bytes =
            hooks->find_resident(files[f].name, piece.file_offset, piece.length);
        if (bytes != nullptr) resident.push_back(Resident{f, p, bytes});
      }
    }
    std::vector<char> served(resident.size(), 0);  // each element written by one thread
    struct NoState {};
    RETURN_IF_ERROR(ParallelFor<NoState>(resident.size(), options_.io_threads,
                                         [&](NoState&, size_t i) -> Status {
                                           const Resident& res = resident[i];
                                           const Piece& piece = files[res.file].pieces[res.piece];
                                           if (Xxh3(res.bytes, piece.length) != piece.expected_xxh3)
                                             return Status::Ok();
                                           served[i] = 1;
                                           return deliver(files[res.file], piece, res.bytes);
                                         }));
    std::vector<std::vector<char>> done(files.size());
    for (uint32_t f = 0; f < files.size(); ++f) done[f].assign(files[f].pieces.size(), 0);
    for (size_t i = 0; i < resident.size(); ++i) {
      if (!served[i]) continue;
      done[resident[i].file][resident[i].piece] = 1;
      from_memory += files[resident[i].file].pieces[resident[i].piece].length;
    }
    for (uint32_t f = 0; f < files.size(); ++f) {
      size_t keep = 0;
      for (size_t p = 0; p < files[f].pieces.size(); ++p) {
        if (done[f][p]) continue;
        if (keep != p) files[f].pieces[keep] = std::move(files[f].pieces[p]);  // not onto itself
        ++keep;
      }
      files[f].pieces.resize(keep);
    }
    std::erase_if(files, [](const FilePieces& f) { return f.pieces.empty(); });
  }
  if (stats != nullptr) stats->bytes_from_memory += from_memory;

  // (3) The rest from storage: per file in offset order. Every file is opened before any thread
  // starts; a missing one fails the read naming a tensor that needs it.
  for (auto& f : files) std::sort(f.pieces.begin(), f.pieces.end(), SortedByOffset);
  std::vector<std::unique_ptr<File>> handles;
  handles.reserve(files.size());
  for (const auto& f : files) {
    const std::string path = JoinPath(step_dir_, f.name);
    OpenOptions o;
    o.try_direct = options_.try_direct;
    auto file = fs_->Open(path, o);
    if (!file.ok()) {
      const Piece& p = f.pieces.front();
      return DataLoss("cannot open data file " + path + " needed by tensor " +
                      Quote(tensor_of(p).name()) + " shard " + std::to_string(p.shard) + " piece " +
                      std::to_string(p.index) + ": " + file.status().ToString());
    }
    handles.push_back(std::move(file).value());
  }

  PieceSink sink;
  sink.on_piece = [&](const FilePieces& f, const Piece& p, const std::byte* bytes) -> Status {
    const uint64_t actual = Xxh3(bytes, p.length);
    if (actual != p.expected_xxh3) return mismatch(f, p, actual);
    RETURN_IF_ERROR(deliver(f, p, bytes));
    if (hooks != nullptr && hooks->on_storage_piece) {
      hooks->on_storage_piece(f.name, p.file_offset, bytes, p.length);
    }
    return Status::Ok();
  };
  sink.on_short = [&](const FilePieces& f, const Piece& p, uint64_t file_end) -> Status {
    return DataLoss(DescribePiece(JoinPath(step_dir_, f.name), tensor_of(p), p) +
                    ": file ends at byte " + std::to_string(file_end) + " (truncated?)");
  };
  sink.on_error = [&](const FilePieces& f, const ReadOp& op, const Status& error) -> Status {
    return error.WithContext(DescribePiece(JoinPath(step_dir_, f.name),
                                           tensor_of(f.pieces[op.first]), f.pieces[op.first]));
  };
  PieceReader reader(options_, &bytes_read_);
  Status status = reader.Run(files, handles, sink);
  if (stats != nullptr) stats->bytes_from_storage += reader.bytes();
  return status;
}

Result<std::vector<CheckpointReader::FileRange>> CheckpointReader::StorageRanges(
    std::span<const Request> requests, const ReadHooks* hooks) const {
  std::vector<FilePieces> files;
  RETURN_IF_ERROR(PlanPieces(requests, &files));
  std::vector<FileRange> out;
  for (auto& f : files) {
    std::sort(f.pieces.begin(), f.pieces.end(), SortedByOffset);
    for (const Piece& p : f.pieces) {
      if (hooks != nullptr && hooks->find_resident &&
          hooks->find_resident(f.name, p.file_offset, p.length) != nullptr) {
        continue;
      }
      if (!out.empty() && out.back().file == f.name &&
          out.back().offset + out.back().length == p.file_offset) {
        out.back().length += p.length;
      } else {
        out.push_back(FileRange{f.name, p.file_offset, p.length});
      }
    }
  }
  return out;
}

Result<std::vector<std::string>> CheckpointReader::Verify() {
  struct Problem {
    std::string file;
    uint64_t offset;
    std::string line;
    bool operator<(const Problem& o) const {
      return std::tie(file, offset, line) < std::tie(o.file, o.offset, o.line);
    }
  };
  std::vector<Problem> problems;  // before the I/O threads start, and after they end
  std::vector<FilePieces> files;
  std::unordered_map<std::string, uint32_t> file_index;
  // Per file: the shards stored in it (tensor, shard), to check the file is long enough.
  std::vector<std::vector<std::pair<uint32_t, uint32_t>>> file_shards;

  for (int ti = 0; ti < manifest_.tensors_size(); ++ti) {
    const TensorEntry& t = manifest_.tensors(ti);
    const std::string ctx = "tensor " + Quote(t.name());
    auto dtype = LookupDType(t.dtype());
    if (!dtype.ok()) {
      problems.push_back(
          {"", 0, "invalid manifest entry: " + ctx + ": " + dtype.status().message()});
      continue;
    }
    const Shape global(t.global_shape().begin(), t.global_shape().end());
    for (int s = 0; s < t.shards_size(); ++s) {
      const StoredShard& shard = t.shards(s);
      auto g = GeometryFromProto(shard.geometry(), global);
      Status ok = g.ok() ? CheckStoredShard(t, s, g->numel(), dtype->element_size)
                         : g.status().WithContext(ctx + " shard " + std::to_string(s));
      if (!ok.ok()) {
        problems.push_back(
            {shard.file(), shard.offset(), "invalid manifest entry: " + ok.message()});
        continue;
      }
      auto [fit, new_file] =
          file_index.try_emplace(shard.file(), static_cast<uint32_t>(files.size()));
      if (new_file) {
        files.push_back(FilePieces{shard.file(), {}});
        file_shards.emplace_back();
      }
      file_shards[fit->second].emplace_back(static_cast<uint32_t>(ti), static_cast<uint32_t>(s));
    }
  }

  std::vector<std::unique_ptr<File>> handles(files.size());
  for (uint32_t f = 0; f < files.size(); ++f) {
    const std::string path = JoinPath(step_dir_, files[f].name);
    OpenOptions o;
    o.try_direct = options_.try_direct;
    auto file = fs_->Open(path, o);
    if (!file.ok()) {
      const auto [ti, s] = file_shards[f].front();
      const std::string what =
          file.status().code() == StatusCode::kNotFound
              ? "missing data file " + path
              : "cannot open data file " + path + ": " + file.status().ToString();
      problems.push_back({files[f].name, 0,
                          what + " (holds " + std::to_string(file_shards[f].size()) +
                              " shards, first: tensor " +
                              Quote(manifest_.tensors(static_cast<int>(ti)).name()) + " shard " +
                              std::to_string(s) + ")"});
      continue;
    }
    auto size = (*file)->Size();
    if (!size.ok()) {
      problems.push_back(
          {files[f].name, 0, "cannot stat data file " + path + ": " + size.status().ToString()});
      continue;
    }
    for (const auto& [ti, s] : file_shards[f]) {
      const TensorEntry& t = manifest_.tensors(static_cast<int>(ti));
      const StoredShard& shard = t.shards(static_cast<int>(s));
      if (shard.offset() + shard.length() > *size) {
        problems.push_back(
            {files[f].name, shard.offset(),
             "short data file " + path + ": tensor " + Quote(t.name()) + " shard " +
                 std::to_string(s) + " needs bytes [" + std::to_string(shard.offset()) + ", " +
                 std::to_string(shard.offset() + shard.length()) + ") but the file has " +
                 std::to_string(*size) + " bytes (truncated?)"});
      }
      const uint32_t count = ChunkCount(shard.length(), shard.chunk_size());
      for (uint32_t p = 0; p < count; ++p) {
        Piece piece = MakePiece(t, ti, s, p);
        // Pieces past the end were reported with their shard above.
        if (piece.file_offset + piece.length <= *size) files[f].pieces.push_back(std::move(piece));
      }
    }
    std::sort(files[f].pieces.begin(), files[f].pieces.end(), SortedByOffset);
    handles[f] = std::move(file).value();
  }

  struct {
    Mutex mu;
    std::vector<Problem> list GUARDED_BY(mu);
  } found;
  auto note = [&](Problem p) {
    MutexLock lock(found.mu);
    found.list.push_back(std::move(p));
  };
  auto describe = [&](const FilePieces& f, const Piece& p) {
    return DescribePiece(JoinPath(step_dir_, f.name), manifest_.tensors(static_cast<int>(p.tensor)),
                         p);
  };
  PieceSink sink;
  sink.on_piece = [&](const FilePieces& f, const Piece& p, const std::byte* bytes) -> Status {
    const uint64_t actual = Xxh3(bytes, p.length);
    if (actual != p.expected_xxh3) {
      note({f.name, p.file_offset,
            "checksum mismatch in " + describe(f, p) + ": expected xxh3 " + Hex(p.expected_xxh3) +
                ", read " + Hex(actual)});
    }
    return Status::Ok();
  };
  sink.on_short = [&](const FilePieces& f, const Piece& p, uint64_t file_end) -> Status {
    note({f.name, p.file_offset,
          "short read of " + describe(f, p) + ": file ends at byte " + std::to_string(file_end)});
    return Status::Ok();
  };
  sink.on_error = [&](const FilePieces& f, const ReadOp& op, const Status& error) -> Status {
    note({f.name, op.offset,
          "read error in data file " + JoinPath(step_dir_, f.name) + " at offset " +
              std::to_string(op.offset) + " (" + std::to_string(op.end - op.first) +
              " pieces, first: " + describe(f, f.pieces[op.first]) + "): " + error.ToString()});
    return Status::Ok();
  };
  PieceReader reader(options_, &bytes_read_);
  RETURN_IF_ERROR(reader.Run(files, handles, sink), "verifying " + step_dir_);

  {
    MutexLock lock(found.mu);  // the readers are done; taken for the analysis, never contended
    problems.insert(problems.end(), std::make_move_iterator(found.list.begin()),
                    std::make_move_iterator(found.list.end()));
  }
  std::sort(problems.begin(), problems.end());
  std::vector<std::string> lines;
  lines.reserve(problems.size());
  for (auto& p : problems) lines.push_back(std::move(p.line));
  return lines;
}

}  // namespace ckpt
