// The daemon-to-daemon data plane's wire protocol (proto/README.md, "Peer data plane"): how one
// ckptd asks another for bytes of a step's data file (FETCH), hands it a region to keep in memory
// (PUT) and tells it to forget a step (DROP). This file owns the byte layout; peer_server.h and
// peer_client.h move frames, peer_store.h keeps what PUT brings.
//
// A connection carries requests one at a time: the client writes one request frame, the server
// answers with exactly one reply frame, then the next request may follow. Every frame is
//
//   header (32 bytes, little-endian)
//     u32 magic        0x50504B43 ("CKPP" in memory order)
//     u8  version      1 (kVersion); a server answers another version with an error reply
//                      naming both and closes
//     u8  type         1 FETCH, 2 PUT, 3 DROP, 4 REPLY
//     u16 flags        0 (anything else is malformed: room for later versions)
//     u32 request_id   chosen by the client, echoed in the reply
//     u32 meta_length  bytes of the metadata that follows, at most kMaxMetaBytes (4 KiB)
//     u64 data_length  bytes of data after the metadata, at most kMaxChunkBytes (64 MiB);
//                      must be 0 for FETCH and DROP
//     u64 data_xxh3    XXH3-64 (seed 0, common/checksum.h) of the data; 0 when there is none
//   metadata (meta_length bytes)
//   data (data_length bytes)
//
// Metadata is a sequence of fields: u64 little-endian numbers and strings (u16 length, bytes).
//   FETCH  job, u64 step, file, u64 offset, u64 length      (length <= kMaxChunkBytes)
//   PUT    job, u64 step, file, u64 offset, u64 length      (length == data_length)
//   DROP   job, u64 step [, file]                           (with a file: only that data file's
//                                                            regions, the sender's own copies;
//                                                            servers before it close on it)
//   REPLY  u32 status code (ckpt::StatusCode), message      (a FETCH's OK reply carries the
//                                                            bytes as data)
// Metadata must be consumed exactly: trailing bytes are malformed.
//
// Names. `job` follows ValidateJobName (one safe path component); `file` must be a data file
// name of a step directory — [A-Za-z0-9._-], 1-128 bytes, not starting with '.', ending in
// ".data" — so no request can name a manifest, a directory or anything outside the step
// directory. A region's end must not overflow 64 bits.
//
// Errors. A frame that cannot be parsed (bad magic, version, type, flags, lengths over the
// limits, metadata that does not decode) ends the connection: the server logs why, with the
// peer's address, and closes; nothing else is affected. A well-formed request that cannot be
// served (unknown step, bad name, region not held, holder full) gets an error REPLY and the
// connection stays usable. A data checksum that does not match is kDataLoss: the receiver never
// delivers or stores such bytes (the server answers the PUT with an error reply; the client
// fails the FETCH and drops the connection).
//
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "common/status.h"

namespace ckpt::peer {

inline constexpr uint32_t kMagic = 0x50504B43;
inline constexpr uint8_t kVersion = 1;
inline constexpr size_t kHeaderBytes = 32;
inline constexpr uint32_t kMaxMetaBytes = 4096;
inline constexpr uint64_t kMaxChunkBytes = 64ull << 20;

enum class FrameType : uint8_t { kFetch = 1, kPut = 2, kDrop = 3, kReply = 4 };
std::string_view FrameTypeName(FrameType type);

struct FrameHeader {
  FrameType type = FrameType::kReply;
  uint16_t flags = 0;
  uint32_t request_id = 0;
  uint32_t meta_length = 0;
  uint64_t data_length = 0;
  uint64_t data_xxh3 = 0;
};

void EncodeHeader(const FrameHeader& header, std::byte (&out)[kHeaderBytes]);
// kInvalidArgument naming the first thing wrong (magic, version, type, flags, a length over its
// limit, data on a FETCH or DROP).
Result<FrameHeader> DecodeHeader(std::span<const std::byte, kHeaderBytes> in);

// Bytes [offset, offset + length) of data file `file` of (job, step).
struct Region {
  std::string job;
  uint64_t step = 0;
  std::string file;
  uint64_t offset = 0;
  uint64_t length = 0;
};
// "job 'j' step 7 file rank-00000.data [0, 4096)", names escaped for logs.
std::string DescribeRegion(const Region& region);

// Job and file names, length <= kMaxChunkBytes, no overflow. Messages name the region.
Status ValidateRegion(const Region& region);

std::string EncodeRegion(const Region& region);
// Decoding checks structure only (kInvalidArgument "malformed"); names are checked apart by
// ValidateRegion / ValidateJobName, because a malformed frame ends the connection while a
// hostile name only gets an error reply.
Result<Region> DecodeRegion(std::string_view meta);

struct StepRef {
  std::string job;
  uint64_t step = 0;
  std::string file;  // DROP: empty for the whole step, else one data file of it
};
std::string EncodeStep(const StepRef& step);
Result<StepRef> DecodeStep(std::string_view meta);

// A REPLY's metadata carries a Status; DecodeReply returns it (an error Status is a successful
// decode), or nullopt when the metadata is malformed.
std::string EncodeReply(const Status& status);
std::optional<Status> DecodeReply(std::string_view meta);

}  // namespace ckpt::peer

namespace ckpt::peer {
// A whole frame (header, metadata, data) in one string, its checksum computed: for small frames
// and for tests that speak the protocol by hand. The daemon sends large data without this copy.
std::string EncodeFrame(FrameType type, uint32_t request_id, std::string_view meta,
                        std::string_view data = {});
}  // namespace ckpt::peer
