#include "daemon/peer/peer_protocol.h"

#include <cstring>

#include "common/checksum.h"
#include "common/names.h"

namespace ckpt::peer {
namespace {

template <typename T>
void PutLe(std::byte* out, T v) {
  for (size_t i = 0; i < sizeof(T); ++i) {
    out[i] = static_cast<std::byte>((static_cast<uint64_t>(v) >> (8 * i)) & 0xff);
  }
}

template <typename T>
T GetLe(const std::byte* in) {
  uint64_t v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) v |= uint64_t{std::to_integer<uint8_t>(in[i])} << (8 * i);
  return static_cast<T>(v);
}

// Appends fields to a metadata string.
class MetaWriter {
 public:
  void U64(uint64_t v) { Append(v, 8); }
  void U32(uint32_t v) { Append(v, 4); }
  void Str(std::string_view s) {
    Append(s.size(), 2);
    out_.append(s);
  }
  std::string Take() { return std::move(out_); }

 private:
  void Append(uint64_t v, size_t n) {
    for (size_t i = 0; i < n; ++i) out_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
  std::string out_;
};

// Reads fields back; every read checks the remaining length.
class MetaReader {
 public:
  explicit MetaReader(std::string_view in) : in_(in) {}
  bool U64(uint64_t* v) { return Read(v, 8); }
  bool U32(uint32_t* v) {
    uint64_t x = 0;
    if (!Read(&x, 4)) return false;
    *v = static_cast<uint32_t>(x);
    return true;
  }
  bool Str(std::string* s) {
    uint64_t n = 0;
    if (!Read(&n, 2) || in_.size() < n) return false;
    s->assign(in_.substr(0, n));
    in_.remove_prefix(n);
    return true;
  }
  bool Done() const { return in_.empty(); }

 private:
  bool Read(uint64_t* v, size_t n) {
    if (in_.size() < n) return false;
    *v = 0;
    for (size_t i = 0; i < n; ++i) *v |= uint64_t{static_cast<uint8_t>(in_[i])} << (8 * i);
    in_.remove_prefix(n);
    return true;
  }
  std::string_view in_;
};

}  // namespace

std::string_view FrameTypeName(FrameType type) {
  switch (type) {
    case FrameType::kFetch:
      return "FETCH";
    case FrameType::kPut:
      return "PUT";
    case FrameType::kDrop:
      return "DROP";
    case FrameType::kReply:
      return "REPLY";
  }
  return "UNKNOWN";
}

void EncodeHeader(const FrameHeader& h, std::byte (&out)[kHeaderBytes]) {
  PutLe<uint32_t>(out, kMagic);
  out[4] = static_cast<std::byte>(kVersion);
  out[5] = static_cast<std::byte>(h.type);
  PutLe<uint16_t>(out + 6, h.flags);
  PutLe<uint32_t>(out + 8, h.request_id);
  PutLe<uint32_t>(out + 12, h.meta_length);
  PutLe<uint64_t>(out + 16, h.data_length);
  PutLe<uint64_t>(out + 24, h.data_xxh3);
}

Result<FrameHeader> DecodeHeader(std::span<const std::byte, kHeaderBytes> in) {
  const uint32_t magic = GetLe<uint32_t>(in.data());
  if (magic != kMagic) {
    return InvalidArgument("peer frame: bad magic 0x" + [&] {
      char buf[16];
      std::snprintf(buf, sizeof buf, "%08x", magic);
      return std::string(buf);
    }() + " (not a ckptd peer connection)");
  }
  const auto version = std::to_integer<uint8_t>(in[4]);
  if (version != kVersion) {
    return InvalidArgument("peer frame: protocol version " + std::to_string(version) +
                           " is not supported (this daemon speaks " + std::to_string(kVersion) +
                           ")");
  }
  FrameHeader h;
  const auto type = std::to_integer<uint8_t>(in[5]);
  if (type < 1 || type > 4) {
    return InvalidArgument("peer frame: unknown frame type " + std::to_string(type));
  }
  h.type = static_cast<FrameType>(type);
  h.flags = GetLe<uint16_t>(in.data() + 6);
  h.request_id = GetLe<uint32_t>(in.data() + 8);
  h.meta_length = GetLe<uint32_t>(in.data() + 12);
  h.data_length = GetLe<uint64_t>(in.data() + 16);
  h.data_xxh3 = GetLe<uint64_t>(in.data() + 24);
  const std::string what = "peer frame " + std::string(FrameTypeName(h.type));
  if (h.flags != 0) {
    return InvalidArgument(what + ": flags " + std::to_string(h.flags) + " are not defined");
  }
  if (h.meta_length > kMaxMetaBytes) {
    return InvalidArgument(what + ": metadata of " + std::to_string(h.meta_length) +
                           " bytes is over the limit of " + std::to_string(kMaxMetaBytes));
  }
  if (h.data_length > kMaxChunkBytes) {
    return InvalidArgument(what + ": data of " + std::to_string(h.data_length) +
                           " bytes is over the limit of " + std::to_string(kMaxChunkBytes));
  }
  if ((h.type == FrameType::kFetch || h.type == FrameType::kDrop) && h.data_length != 0) {
    return InvalidArgument(what + " must carry no data, has " + std::to_string(h.data_length) +
                           " bytes");
  }
  return h;
}

std::string DescribeRegion(const Region& r) {
  return "job '" + EscapeForLog(r.job) + "' step " + std::to_string(r.step) + " file " +
         EscapeForLog(r.file) + " [" + std::to_string(r.offset) + ", " +
         std::to_string(r.offset + r.length) + ")";
}

Status ValidateRegion(const Region& r) {
  RETURN_IF_ERROR(ValidateJobName(r.job), "peer region");
  RETURN_IF_ERROR(ValidateDataFileName(r.file),
                  "peer: job '" + r.job + "' step " + std::to_string(r.step));
  if (r.length > kMaxChunkBytes) {
    return InvalidArgument("peer: " + DescribeRegion(r) + ": length over the chunk limit of " +
                           std::to_string(kMaxChunkBytes) + " bytes");
  }
  if (r.offset + r.length < r.offset) {
    return InvalidArgument("peer: job '" + r.job + "' step " + std::to_string(r.step) +
                           ": region end overflows");
  }
  return Status::Ok();
}

std::string EncodeRegion(const Region& r) {
  MetaWriter w;
  w.Str(r.job);
  w.U64(r.step);
  w.Str(r.file);
  w.U64(r.offset);
  w.U64(r.length);
  return w.Take();
}

Result<Region> DecodeRegion(std::string_view meta) {
  MetaReader rd(meta);
  Region r;
  if (!rd.Str(&r.job) || !rd.U64(&r.step) || !rd.Str(&r.file) || !rd.U64(&r.offset) ||
      !rd.U64(&r.length) || !rd.Done()) {
    return InvalidArgument("peer: malformed region metadata (" + std::to_string(meta.size()) +
                           " bytes)");
  }
  return r;
}

std::string EncodeStep(const StepRef& s) {
  MetaWriter w;
  w.Str(s.job);
  w.U64(s.step);
  if (!s.file.empty()) w.Str(s.file);
  return w.Take();
}

Result<StepRef> DecodeStep(std::string_view meta) {
  MetaReader rd(meta);
  StepRef s;
  if (!rd.Str(&s.job) || !rd.U64(&s.step) || (!rd.Done() && (!rd.Str(&s.file) || s.file.empty())) ||
      !rd.Done()) {
    return InvalidArgument("peer: malformed step metadata (" + std::to_string(meta.size()) +
                           " bytes)");
  }
  return s;
}

std::string EncodeReply(const Status& status) {
  // Messages are cut so that the reply always fits kMaxMetaBytes.
  constexpr size_t kMaxMessage = kMaxMetaBytes - 64;
  MetaWriter w;
  w.U32(static_cast<uint32_t>(status.code()));
  w.Str(std::string_view(status.message()).substr(0, kMaxMessage));
  return w.Take();
}

std::optional<Status> DecodeReply(std::string_view meta) {
  MetaReader rd(meta);
  uint32_t code = 0;
  std::string message;
  if (!rd.U32(&code) || !rd.Str(&message) || !rd.Done() ||
      code > static_cast<uint32_t>(StatusCode::kDataLoss)) {
    return std::nullopt;
  }
  return Status(static_cast<StatusCode>(code), std::move(message));
}

}  // namespace ckpt::peer

namespace ckpt::peer {
std::string EncodeFrame(FrameType type, uint32_t request_id, std::string_view meta,
                        std::string_view data) {
  FrameHeader h;
  h.type = type;
  h.request_id = request_id;
  h.meta_length = static_cast<uint32_t>(meta.size());
  h.data_length = data.size();
  h.data_xxh3 = data.empty() ? 0 : Xxh3(data.data(), data.size());
  std::byte header[kHeaderBytes];
  EncodeHeader(h, header);
  std::string out(reinterpret_cast<const char*>(header), kHeaderBytes);
  out.append(meta);
  out.append(data);
  return out;
}
}  // namespace ckpt::peer
