// A small streaming JSON emitter for ckptctl's --json output and safetensors headers: enough to
// write objects, arrays, strings and unsigned/signed integers correctly, no parser, no
// dependency. Commas and nesting are tracked by the writer; misuse (a value where a key is due,
// unbalanced End*) is a programming error caught by assertions in debug builds.
//
// Strings are written as valid JSON and valid UTF-8: `"` and `\` are escaped, control characters
// become \n, \t, ... or \u00XX, DEL becomes \u007f, and bytes that are not well-formed UTF-8
// (tensor names need only be free of control characters, not valid UTF-8) become U+FFFD.
// Thread safety: none; one writer per document.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

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

  // Key + value shorthands.
  JsonWriter& Field(std::string_view key, std::string_view value) { return Key(key).String(value); }
  JsonWriter& Field(std::string_view key, const char* value) { return Key(key).String(value); }
  JsonWriter& Field(std::string_view key, uint64_t value) { return Key(key).Uint(value); }
  JsonWriter& Field(std::string_view key, bool value) { return Key(key).Bool(value); }

  const std::string& str() const { return out_; }
  std::string Take() { return std::move(out_); }

 private:
  void BeforeValue();
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
