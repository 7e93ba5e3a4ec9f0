#include "client/ckptctl/json_writer.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace ckpt::ctl {

namespace {

using google::protobuf::FieldDescriptor;

std::string Base64(std::string_view s) {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (size_t i = 0; i < s.size(); i += 3) {
    const size_t n = std::min<size_t>(3, s.size() - i);
    uint32_t v = 0;
    for (size_t k = 0; k < 3; ++k) {
      v = (v << 8) | (k < n ? static_cast<unsigned char>(s[i + k]) : 0u);
    }
    for (size_t k = 0; k < 4; ++k) out += k <= n ? kAlphabet[(v >> (18 - 6 * k)) & 0x3f] : '=';
  }
  return out;
}

// One value of field `f` of `m`: element `i` of a repeated field, or the singular field when i < 0.
void WriteValue(JsonWriter& w, const google::protobuf::Message& m, const FieldDescriptor* f,
                int i) {
  const auto* r = m.GetReflection();
  const bool rep = i >= 0;
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      w.Int(rep ? r->GetRepeatedInt32(m, f, i) : r->GetInt32(m, f));
      break;
    case FieldDescriptor::CPPTYPE_UINT32:
      w.Uint(rep ? r->GetRepeatedUInt32(m, f, i) : r->GetUInt32(m, f));
      break;
    case FieldDescriptor::CPPTYPE_INT64:  // 64-bit integers are strings in the proto3 mapping
      w.String(std::to_string(rep ? r->GetRepeatedInt64(m, f, i) : r->GetInt64(m, f)));
      break;
    case FieldDescriptor::CPPTYPE_UINT64:
      w.String(std::to_string(rep ? r->GetRepeatedUInt64(m, f, i) : r->GetUInt64(m, f)));
      break;
    case FieldDescriptor::CPPTYPE_DOUBLE:
      w.Double(rep ? r->GetRepeatedDouble(m, f, i) : r->GetDouble(m, f));
      break;
    case FieldDescriptor::CPPTYPE_FLOAT:
      w.Float(rep ? r->GetRepeatedFloat(m, f, i) : r->GetFloat(m, f));
      break;
    case FieldDescriptor::CPPTYPE_BOOL:
      w.Bool(rep ? r->GetRepeatedBool(m, f, i) : r->GetBool(m, f));
      break;
    case FieldDescriptor::CPPTYPE_ENUM: {
      const int n = rep ? r->GetRepeatedEnumValue(m, f, i) : r->GetEnumValue(m, f);
      const auto* value = f->enum_type()->FindValueByNumber(n);
      value != nullptr ? w.String(value->name()) : w.Int(n);
      break;
    }
    case FieldDescriptor::CPPTYPE_STRING: {
      std::string scratch;
      const std::string& s = rep ? r->GetRepeatedStringReference(m, f, i, &scratch)
                                 : r->GetStringReference(m, f, &scratch);
      w.String(f->type() == FieldDescriptor::TYPE_BYTES ? Base64(s) : s);
      break;
    }
    case FieldDescriptor::CPPTYPE_MESSAGE:
      w.Proto(rep ? r->GetRepeatedMessage(m, f, i) : r->GetMessage(m, f));
      break;
  }
}

// A map key as its JSON object key: integers in decimal, bools as true/false, strings as is.
std::string MapKey(const google::protobuf::Message& entry) {
  const auto* r = entry.GetReflection();
  const FieldDescriptor* f = entry.GetDescriptor()->map_key();
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      return std::to_string(r->GetInt32(entry, f));
    case FieldDescriptor::CPPTYPE_UINT32:
      return std::to_string(r->GetUInt32(entry, f));
    case FieldDescriptor::CPPTYPE_INT64:
      return std::to_string(r->GetInt64(entry, f));
    case FieldDescriptor::CPPTYPE_UINT64:
      return std::to_string(r->GetUInt64(entry, f));
    case FieldDescriptor::CPPTYPE_BOOL:
      return r->GetBool(entry, f) ? "true" : "false";
    default:
      return r->GetString(entry, f);
  }
}

}  // namespace

size_t Utf8SequenceLength(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const unsigned char c = b(0);
  size_t n;
  if (c < 0x80) return 1;
  if (c >= 0xc2 && c <= 0xdf)
    n = 2;
  else if (c >= 0xe0 && c <= 0xef)
    n = 3;
  else if (c >= 0xf0 && c <= 0xf4)
    n = 4;
  else
    return 0;
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((b(k) & 0xc0) != 0x80) return 0;
  }
  if (c == 0xe0 && b(1) < 0xa0) return 0;  // overlong
  if (c == 0xed && b(1) > 0x9f) return 0;  // surrogates
  if (c == 0xf0 && b(1) < 0x90) return 0;  // overlong
  if (c == 0xf4 && b(1) > 0x8f) return 0;  // above U+10FFFF
  return n;
}

std::string JsonQuote(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  out.push_back('"');
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x80) {
      const size_t n = Utf8SequenceLength(s, i);
      const auto b = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
      // C1 controls (a terminal may act on them) and U+2028/9 (line ends to JavaScript) as \u.
      unsigned escape = 0;
      if (n == 2 && c == 0xc2 && b(1) < 0xa0) escape = b(1);
      if (n == 3 && c == 0xe2 && b(1) == 0x80 && (b(2) == 0xa8 || b(2) == 0xa9)) {
        escape = 0x2000u + (b(2) - 0x80u);
      }
      if (n == 0) {
        out += "\\ufffd";
        ++i;
      } else if (escape != 0) {
        char buf[16];
        std::snprintf(buf, sizeof buf, "\\u%04x", escape);
        out += buf;
        i += n;
      } else {
        out.append(s.substr(i, n));
        i += n;
      }
      continue;
    }
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20 || c == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out.push_back(static_cast<char>(c));
        }
    }
    ++i;
  }
  out.push_back('"');
  return out;
}

void JsonWriter::Newline() {
  if (indent_ == 0) return;
  out_.push_back('\n');
  out_.append(stack_.size() * static_cast<size_t>(indent_), ' ');
}

void JsonWriter::BeforeValue() {
  if (after_key_) {
    after_key_ = false;
    return;
  }
  if (stack_.empty()) return;
  assert(stack_.back().array && "a value inside an object needs a key");
  if (!stack_.back().empty) out_.push_back(',');
  stack_.back().empty = false;
  Newline();
}

JsonWriter& JsonWriter::BeginObject() {
  BeforeValue();
  out_.push_back('{');
  stack_.push_back(Level{false});
  return *this;
}

JsonWriter& JsonWriter::EndObject() {
  assert(!stack_.empty() && !stack_.back().array && !after_key_);
  const bool empty = stack_.back().empty;
  stack_.pop_back();
  if (!empty) Newline();
  out_.push_back('}');
  return *this;
}

JsonWriter& JsonWriter::BeginArray() {
  BeforeValue();
  out_.push_back('[');
  stack_.push_back(Level{true});
  return *this;
}

JsonWriter& JsonWriter::EndArray() {
  assert(!stack_.empty() && stack_.back().array);
  const bool empty = stack_.back().empty;
  stack_.pop_back();
  if (!empty) Newline();
  out_.push_back(']');
  return *this;
}

JsonWriter& JsonWriter::Key(std::string_view key) {
  assert(!stack_.empty() && !stack_.back().array && !after_key_);
  if (!stack_.back().empty) out_.push_back(',');
  stack_.back().empty = false;
  Newline();
  out_ += JsonQuote(key);
  out_ += indent_ > 0 ? ": " : ":";
  after_key_ = true;
  return *this;
}

JsonWriter& JsonWriter::String(std::string_view value) {
  BeforeValue();
  out_ += JsonQuote(value);
  return *this;
}

JsonWriter& JsonWriter::Uint(uint64_t value) {
  BeforeValue();
  out_ += std::to_string(value);
  return *this;
}

JsonWriter& JsonWriter::Int(int64_t value) {
  BeforeValue();
  out_ += std::to_string(value);
  return *this;
}

JsonWriter& JsonWriter::Bool(bool value) {
  BeforeValue();
  out_ += value ? "true" : "false";
  return *this;
}

// As protobuf prints them: the shorter precision unless it does not read back as the same value.
template <typename T>
JsonWriter& JsonWriter::Real(T value, int digits, int round_trip_digits) {
  if (std::isnan(value)) return String("NaN");
  if (std::isinf(value)) return String(value > 0 ? "Infinity" : "-Infinity");
  BeforeValue();
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.*g", digits, static_cast<double>(value));
  if (static_cast<T>(std::strtod(buf, nullptr)) != value) {
    std::snprintf(buf, sizeof buf, "%.*g", round_trip_digits, static_cast<double>(value));
  }
  out_ += buf;
  return *this;
}

JsonWriter& JsonWriter::Double(double value) { return Real(value, 15, 17); }
JsonWriter& JsonWriter::Float(float value) { return Real(value, 6, 9); }

JsonWriter& JsonWriter::Proto(const google::protobuf::Message& m) {
  const auto* d = m.GetDescriptor();
  const auto* r = m.GetReflection();
  BeginObject();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    if (f->is_map()) {
      Key(f->name()).BeginObject();
      for (int k = 0; k < r->FieldSize(m, f); ++k) {
        const auto& entry = r->GetRepeatedMessage(m, f, k);
        Key(MapKey(entry));
        WriteValue(*this, entry, entry.GetDescriptor()->map_value(), -1);
      }
      EndObject();
    } else if (f->is_repeated()) {
      Key(f->name()).BeginArray();
      for (int k = 0; k < r->FieldSize(m, f); ++k) WriteValue(*this, m, f, k);
      EndArray();
    } else if (!f->has_presence() || r->HasField(m, f)) {
      Key(f->name());
      WriteValue(*this, m, f, -1);
    }
  }
  return EndObject();
}

}  // namespace ckpt::ctl
