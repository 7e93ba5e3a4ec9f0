// The data plane's wire format (daemon/peer/peer_protocol.h): headers round-trip, every field a
// hostile or broken peer could get wrong is refused with a reason, and names can never reach
// outside a step directory.
#include "daemon/peer/peer_protocol.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <vector>

#include "common/names.h"
#include "daemon/peer/peer_address.h"
#include "tests/test_util.h"

namespace ckpt::peer {
namespace {

std::span<const std::byte, kHeaderBytes> Span(const std::byte (&h)[kHeaderBytes]) {
  return std::span<const std::byte, kHeaderBytes>(h);
}

TEST_CASE("peer protocol: a header round-trips", "[peer]") {
  FrameHeader h;
  h.type = FrameType::kPut;
  h.request_id = 0xdeadbeef;
  h.meta_length = 77;
  h.data_length = kMaxChunkBytes;
  h.data_xxh3 = 0x0123456789abcdefull;
  std::byte raw[kHeaderBytes];
  EncodeHeader(h, raw);
  auto back = DecodeHeader(Span(raw));
  REQUIRE_OK(back);
  CHECK(back->type == FrameType::kPut);
  CHECK(back->request_id == 0xdeadbeef);
  CHECK(back->meta_length == 77);
  CHECK(back->data_length == kMaxChunkBytes);
  CHECK(back->data_xxh3 == 0x0123456789abcdefull);
  // The magic reads "CKPP" in memory order.
  CHECK(std::memcmp(raw, "CKPP", 4) == 0);
}

TEST_CASE("peer protocol: malformed headers are refused with a reason", "[peer]") {
  FrameHeader h;
  h.type = FrameType::kFetch;
  std::byte raw[kHeaderBytes];
  const auto refused = [&](const std::string& fragment) {
    auto r = DecodeHeader(Span(raw));
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kInvalidArgument);
    CHECK_THAT(r.status().message(), Catch::Contains(fragment));
  };
  SECTION("magic") {
    EncodeHeader(h, raw);
    std::memcpy(raw, "GET ", 4);
    refused("bad magic");
  }
  SECTION("version") {
    EncodeHeader(h, raw);
    raw[4] = std::byte{2};
    refused("protocol version 2");
  }
  SECTION("type") {
    EncodeHeader(h, raw);
    raw[5] = std::byte{9};
    refused("unknown frame type 9");
  }
  SECTION("flags") {
    h.flags = 1;
    EncodeHeader(h, raw);
    refused("flags");
  }
  SECTION("oversized metadata") {
    h.meta_length = kMaxMetaBytes + 1;
    EncodeHeader(h, raw);
    refused("over the limit");
  }
  SECTION("oversized data") {
    h.type = FrameType::kPut;
    h.data_length = kMaxChunkBytes + 1;
    EncodeHeader(h, raw);
    refused("over the limit");
  }
  SECTION("data on a FETCH") {
    h.data_length = 1;
    EncodeHeader(h, raw);
    refused("must carry no data");
  }
}

TEST_CASE("peer protocol: regions, steps and replies round-trip", "[peer]") {
  const Region r{"job-1", 42, "rank-00003.data", 1ull << 40, 4096};
  auto back = DecodeRegion(EncodeRegion(r));
  REQUIRE_OK(back);
  CHECK(back->job == r.job);
  CHECK(back->step == 42);
  CHECK(back->file == r.file);
  CHECK(back->offset == r.offset);
  CHECK(back->length == 4096);
  CHECK_OK(ValidateRegion(*back));

  auto step = DecodeStep(EncodeStep({"job-1", 9}));
  REQUIRE_OK(step);
  CHECK(step->job == "job-1");
  CHECK(step->step == 9);
  CHECK(step->file.empty());
  auto one_file = DecodeStep(EncodeStep({"job-1", 9, "rank-00003.data"}));
  REQUIRE_OK(one_file);
  CHECK(one_file->file == "rank-00003.data");

  auto reply = DecodeReply(EncodeReply(ResourceExhausted("peer pool full")));
  REQUIRE(reply.has_value());
  CHECK(reply->code() == StatusCode::kResourceExhausted);
  CHECK(reply->message() == "peer pool full");
  auto ok = DecodeReply(EncodeReply(Status::Ok()));
  REQUIRE(ok.has_value());
  CHECK(ok->ok());
  // A long message is cut so that the reply fits its metadata limit.
  CHECK(EncodeReply(Internal(std::string(100000, 'x'))).size() <= kMaxMetaBytes);
}

TEST_CASE("peer protocol: truncated or padded metadata is malformed", "[peer]") {
  const std::string meta = EncodeRegion({"job", 1, "rank-00000.data", 0, 10});
  CHECK_FALSE(DecodeRegion(meta.substr(0, meta.size() - 1)).ok());
  CHECK_FALSE(DecodeRegion(meta + "x").ok());
  CHECK_FALSE(DecodeRegion("").ok());
  // A string length pointing past the end.
  std::string lying = meta;
  lying[0] = static_cast<char>(0xff);
  CHECK_FALSE(DecodeRegion(lying).ok());
  CHECK_FALSE(DecodeStep(EncodeStep({"job", 1}) + "\x01").ok());
  CHECK_FALSE(DecodeStep(EncodeStep({"job", 1, "rank-00000.data"}) + "x").ok());
  CHECK_FALSE(DecodeStep(EncodeStep({"job", 1}) + std::string(2, '\0')).ok());  // an empty file
  CHECK_FALSE(DecodeReply("\x01").has_value());
  // A status code that does not exist.
  std::string reply = EncodeReply(Status::Ok());
  reply[0] = static_cast<char>(99);
  CHECK_FALSE(DecodeReply(reply).has_value());
}

TEST_CASE("peer protocol: hostile job and file names never pass", "[peer]") {
  for (const std::string& file : std::vector<std::string>{
           "../rank-00000.data", "a/rank-00000.data", "/etc/passwd", ".data", ".hidden.data",
           "MANIFEST", "node-x.nmf", "", std::string("rank\0.data", 10), "rank 1.data",
           std::string(200, 'a') + ".data", "rank-00000.data.tmp"}) {
    INFO("file '" << file << "'");
    CHECK_FALSE(ValidateDataFileName(file).ok());
    CHECK_FALSE(ValidateRegion({"job", 1, file, 0, 1}).ok());
  }
  CHECK_OK(ValidateDataFileName("rank-00000.data"));
  for (const std::string& job :
       std::vector<std::string>{"..", ".", "a/b", "../../etc", "", std::string(300, 'j')}) {
    INFO("job '" << job << "'");
    CHECK_FALSE(ValidateRegion({job, 1, "rank-00000.data", 0, 1}).ok());
  }
  // Too long for one chunk, or an end past 2^64.
  CHECK_FALSE(ValidateRegion({"job", 1, "rank-00000.data", 0, kMaxChunkBytes + 1}).ok());
  CHECK_FALSE(ValidateRegion({"job", 1, "rank-00000.data", ~uint64_t{0}, 2}).ok());
}

TEST_CASE("peer protocol: host:port parsing", "[peer]") {
  auto v4 = ParseHostPort("127.0.0.1:0");
  REQUIRE_OK(v4);
  CHECK(v4->host == "127.0.0.1");
  CHECK(v4->port == 0);
  auto v6 = ParseHostPort("[::1]:7470");
  REQUIRE_OK(v6);
  CHECK(v6->host == "::1");
  CHECK(v6->port == 7470);
  for (const char* bad : {"127.0.0.1", ":80", "h:99999", "h:x", "::1:80", "h:"}) {
    INFO(bad);
    CHECK_FALSE(ParseHostPort(bad).ok());
  }
}

}  // namespace
}  // namespace ckpt::peer
