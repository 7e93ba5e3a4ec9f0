// ckptctl's one JSON path: every --json output (the offline reports built field by field, the
// Admin API's replies and events through Proto()) and the safetensors header of export. A small
// streaming emitter, no parser. Commas and nesting are tracked by the writer; misuse (a value
// where a key is due, unbalanced End*) is a programming error caught by assertions in debug
// builds.
//
// Proto() writes a message in the proto3 JSON mapping with the field names of the .proto
// (deploy/README.md promises it for the online commands): fields without presence are written
// even at their default value, repeated fields as arrays (empty too), fields with presence
// (messages, oneof members, `optional`) only when set; 64-bit integers as decimal strings, enums
// by name (the number when unknown), bytes as base64, doubles as protobuf prints them (NaN and
// infinities as "NaN", "Infinity", "-Infinity"), maps as objects. Well-known types get no special
// form (the API uses none).
//
// Strings (keys too) are written as valid JSON and valid UTF-8: `"` and `\` are escaped, control
// characters become \n, \t, ... or \u00XX (C0, DEL and C1, and U+2028/9 as \u2028/9), and each
// byte that is not part of well-formed UTF-8 becomes U+FFFD (paths on the command line and
// strings from a peer need not be UTF-8; protobuf's own printer dropped such bytes silently).
// Thread safety: none; one writer per document.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace google::protobuf {
class Message;
}

namespace ckpt::ctl {

class JsonWriter {
 public:
  // indent 0: compact, one line. Otherwise pretty-printed with that many spaces per level.
  explicit JsonWriter(int indent = 0) : indent_(indent) {}

  JsonWriter& BeginObject();
  JsonWriter& EndObject();
  JsonWriter& BeginArray();
  JsonWriter& EndArray();
  JsonWriter& Key(std::string_view key);
  JsonWriter& String(std::string_view value);
  JsonWriter& Uint(uint64_t value);
  JsonWriter& Int(int64_t value);
  JsonWriter& Bool(bool value);
  JsonWriter& Double(double value);
  JsonWriter& Float(float value);
  JsonWriter& Proto(const google::protobuf::Message& message);

  // Key + value shorthands.
  JsonWriter& Field(std::string_view key, std::string_view value) { return Key(key).String(value); }
  JsonWriter& Field(std::string_view key, const char* value) { return Key(key).String(value); }
  JsonWriter& Field(std::string_view key, uint64_t value) { return Key(key).Uint(value); }
  JsonWriter& Field(std::string_view key, bool value) { return Key(key).Bool(value); }

  const std::string& str() const { return out_; }
  std::string Take() { return std::move(out_); }

 private:
  void BeforeValue();
  template <typename T>
  JsonWriter& Real(T value, int digits, int round_trip_digits);
  void Newline();

  struct Level {
    bool array;
    bool empty = true;
  };
  int indent_;
  std::string out_;
  std::vector<Level> stack_;
  bool after_key_ = false;
};

// `s` as a JSON string literal with quotes (see the escaping rules above).
std::string JsonQuote(std::string_view s);

// Length of the well-formed UTF-8 sequence starting at s[i] (1 for ASCII), or 0 when the bytes
// there are not one (stray continuation bytes, overlong forms, surrogates, > U+10FFFF).
size_t Utf8SequenceLength(std::string_view s, size_t i);

}  // namespace ckpt::ctl
