// ckptctl's one JSON writer (client/ckptctl/json_writer.h): escaping of hostile strings (quotes,
// backslashes, control characters, bytes that are not UTF-8) in values and keys, layout, and
// Proto(), the proto3 mapping the online commands print, on the Admin API's own messages.
#include "client/ckptctl/json_writer.h"

#include <cmath>
#include <limits>
#include <string>

#include "ckptd/v1/admin.pb.h"
#include "tests/test_util.h"

namespace ckpt::ctl {
namespace {

using namespace std::string_literals;

// Every byte of `s` is printable ASCII or part of a well-formed UTF-8 sequence.
bool PrintableUtf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f) return false;
    const size_t n = Utf8SequenceLength(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

TEST_CASE("JsonQuote escapes what JSON must and replaces bytes that are not UTF-8", "[json]") {
  CHECK(JsonQuote("plain.name") == R"("plain.name")");
  CHECK(JsonQuote("a\"b\\c/d") == R"("a\"b\\c/d")");
  CHECK(JsonQuote("\n\r\t\b\f") == R"("\n\r\t\b\f")");
  CHECK(JsonQuote("\x01\x1f\x7f"s) == R"("\u0001\u001f\u007f")");
  CHECK(JsonQuote("nul\0byte"s) == R"("nul\u0000byte")");
  // C1 controls and the JavaScript line ends U+2028/9 are escaped too; U+00A0 and U+202F are not.
  CHECK(JsonQuote("\xc2\x80\xc2\x9b\xc2\xa0") == "\"\\u0080\\u009b\xc2\xa0\"");
  CHECK(JsonQuote("\xe2\x80\xa8\xe2\x80\xa9\xe2\x80\xaf") == "\"\\u2028\\u2029\xe2\x80\xaf\"");
  // Well-formed UTF-8 (2, 3 and 4 bytes) is kept as is.
  CHECK(JsonQuote("\xc3\xbc\xe2\x82\xac\xf0\x9f\x98\x80") ==
        "\"\xc3\xbc\xe2\x82\xac\xf0\x9f\x98\x80\"");
  // Not UTF-8: a stray byte, a lone continuation byte, an overlong '/', a UTF-16 surrogate, a
  // code point past U+10FFFF and a sequence cut short by the end: one U+FFFD per byte.
  CHECK(JsonQuote("\xff") == R"("\ufffd")");
  CHECK(JsonQuote("a\x80z") == R"("a\ufffdz")");
  CHECK(JsonQuote("\xc0\xaf") == R"("\ufffd\ufffd")");
  CHECK(JsonQuote("\xed\xa0\x80") == R"("\ufffd\ufffd\ufffd")");
  CHECK(JsonQuote("\xf4\x90\x80\x80") == R"("\ufffd\ufffd\ufffd\ufffd")");
  CHECK(JsonQuote("end\xe2\x82") == R"("end\ufffd\ufffd")");

  std::string every_byte;
  for (int c = 0; c < 256; ++c) every_byte += static_cast<char>(c);
  CHECK(PrintableUtf8(JsonQuote(every_byte)));
}

TEST_CASE("JsonWriter escapes keys like values and tracks commas and nesting", "[json]") {
  const std::string hostile = "k\"\\\n\x01\xff";
  JsonWriter w;
  w.BeginObject().Field(hostile, hostile).Key("a").BeginArray().Uint(1).Int(-2).Bool(true);
  w.BeginObject().EndObject().BeginArray().EndArray().EndArray().EndObject();
  CHECK(w.str() == R"({"k\"\\\n\u0001\ufffd":"k\"\\\n\u0001\ufffd","a":[1,-2,true,{},[]]})");

  JsonWriter pretty(2);
  pretty.BeginObject().Field("x", uint64_t{1}).Key("y").BeginArray().String("z").EndArray();
  pretty.Key("e").BeginArray().EndArray().EndObject();
  CHECK(pretty.str() == "{\n  \"x\": 1,\n  \"y\": [\n    \"z\"\n  ],\n  \"e\": []\n}");
}

TEST_CASE("JsonWriter::Proto writes the proto3 mapping with the .proto field names", "[json]") {
  ckptd::v1::DescribeCheckpointResponse reply;
  reply.set_path("/ckpt/j/step-0000000042");
  auto& m = *reply.mutable_manifest();
  m.set_format_version(1);
  m.set_job("j\"ob\\\n\x01\xff");  // what a hostile peer could put in a string field
  m.set_step(42);
  m.set_world_size(3);
  auto& t = *m.add_tensors();
  t.set_name("t\"\\/\x7f\xc3\xbc\xed\xa0\x80");
  t.set_dtype("float32");
  t.add_global_shape(2);
  t.add_global_shape(3);
  auto& s = *t.add_shards();
  auto& box = *s.mutable_geometry()->mutable_box();  // a oneof: only the member that is set
  box.add_offsets(0);
  box.add_lengths(std::numeric_limits<uint64_t>::max());
  s.set_file("rank-00000.data");
  s.set_length(24);
  s.add_chunk_xxh3(0xfedcba9876543210);
  auto& r = *m.add_ranks();
  r.set_extra(
      "\0\xff"
      "ab"s);
  r.set_node_id("n");

  CHECK(JsonWriter().Proto(reply).str() ==
        R"({"manifest":{"format_version":1,"job":"j\"ob\\\n\u0001\ufffd","step":"42",)"
        R"("world_size":3,"tensors":[{"name":"t\"\\/\u007f)"
        "\xc3\xbc"
        R"(\ufffd\ufffd\ufffd","dtype":"float32","global_shape":["2","3"],)"
        R"("shards":[{"geometry":{"box":{"offsets":["0"],"lengths":["18446744073709551615"]}},)"
        R"("file":"rank-00000.data","offset":"0","length":"24","chunk_size":"0",)"
        R"("chunk_xxh3":["18364758544493064720"],"writer_rank":0}],"partial":false}],)"
        R"("ranks":[{"rank":0,"extra":"AP9hYg==","node_id":"n"}],"created_unix_ms":"0",)"
        R"("writer":""},"path":"/ckpt/j/step-0000000042","memory_only":false,"copies":[]})");

  // An unset message field is left out.
  ckptd::v1::DescribeCheckpointResponse empty;
  CHECK(JsonWriter().Proto(empty).str() == R"({"path":"","memory_only":false,"copies":[]})");
}

TEST_CASE("JsonWriter::Proto: optional fields, enums, doubles and signed 64-bit integers",
          "[json]") {
  ckptd::v1::ListCheckpointsResponse list;
  // No latest: none committed. Repeated fields are printed even when empty.
  CHECK(JsonWriter().Proto(list).str() == R"({"steps":[],"pinned":[]})");
  list.add_steps(0);
  list.set_latest(0);  // set, even to 0: written
  CHECK(JsonWriter().Proto(list).str() == R"({"steps":["0"],"latest":"0","pinned":[]})");

  ckptd::v1::WatchEventsResponse event;
  event.set_unix_time_ms(-5);
  auto& c = *event.mutable_state_change();
  c.set_job("j");
  c.set_state(ckptd::v1::STEP_STATE_COMMITTED);
  const std::string json = JsonWriter().Proto(event).str();
  CHECK(json.find(R"({"unix_time_ms":"-5","state_change":{"job":"j",)") == 0);
  CHECK(json.find(R"("state":"STEP_STATE_COMMITTED")") != std::string::npos);
  CHECK(json.find("progress") == std::string::npos);   // the other oneof member
  c.set_state(static_cast<ckptd::v1::StepState>(99));  // from a newer peer: by number
  CHECK(JsonWriter().Proto(event).str().find(R"("state":99)") != std::string::npos);

  ckptd::v1::StorageStatus storage;
  const auto with = [&](double a, double b) {
    storage.set_oldest_call_seconds(a);
    storage.set_stall_timeout_seconds(b);
    return JsonWriter().Proto(storage).str();
  };
  CHECK(with(0.1, 100000) == R"({"calls_in_flight":0,"oldest_call_seconds":0.1,"stalled":false,)"
                             R"("stall_timeout_seconds":100000})");
  CHECK(with(1.0 / 3, 1e20) == R"({"calls_in_flight":0,"oldest_call_seconds":0.33333333333333331,)"
                               R"("stalled":false,"stall_timeout_seconds":1e+20})");
  CHECK(with(std::nan(""), -std::numeric_limits<double>::infinity()) ==
        R"({"calls_in_flight":0,"oldest_call_seconds":"NaN","stalled":false,)"
        R"("stall_timeout_seconds":"-Infinity"})");
}

TEST_CASE("JsonWriter::Proto pretty-prints with the writer's indent", "[json]") {
  ckptd::v1::ListCheckpointsResponse list;
  list.add_steps(3);
  list.add_steps(7);
  list.set_latest(7);
  CHECK(JsonWriter(1).Proto(list).str() ==
        "{\n \"steps\": [\n  \"3\",\n  \"7\"\n ],\n \"latest\": \"7\",\n \"pinned\": []\n}");
}

}  // namespace
}  // namespace ckpt::ctl
