// The real ckptctl binary on a checkpoint the test writes: inspect (text and --json), verify
// (clean, then a flipped byte), export to safetensors parsed back here with the selection flags
// (model weights only by default, --include-optimizer, --only PREFIX, --tensors GLOB, the old
// --only values refused), the torch converter's missing-Python error, and exit codes.
// The binary comes from $CKPT_BIN_DIR (set by ctest), else build/bin.
#include <sys/wait.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "common/step_layout.h"
#include "tests/checkpoint_builder.h"
#include "tests/test_util.h"

namespace ckpt {
namespace {

using testing::RandomBytes;
using testing::TempDir;
using testing::TestShard;
using testing::TestTensor;

// ------------------------------------------------------------------ running ckptctl

std::string BinDir() {
  const char* d = std::getenv("CKPT_BIN_DIR");
  return d && *d ? d : "build/bin";
}

std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'')
      out += "'\\''";
    else
      out += c;
  }
  return out + "'";
}

struct Run {
  int exit_code = -1;
  std::string out;  // stdout and stderr together
};

// `env`: NAME=VALUE assignments (shell-quoted by the caller) put before the command.
Run Ckptctl(const std::vector<std::string>& args, const std::string& env = "") {
  std::string cmd = env + (env.empty() ? "" : " ") + ShellQuote(BinDir() + "/ckptctl");
  for (const auto& a : args) cmd += " " + ShellQuote(a);
  cmd += " 2>&1";
  Run r;
  FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int status = ::pclose(p);
  REQUIRE(WIFEXITED(status));
  r.exit_code = WEXITSTATUS(status);
  return r;
}

bool Contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// ------------------------------------------------------------------ a tiny JSON reader

struct Json {
  using Object = std::map<std::string, Json>;
  using Array = std::vector<Json>;
  std::variant<std::nullptr_t, bool, double, std::string, Array, Object> v;

  const Json& operator[](const std::string& key) const {
    const auto& o = std::get<Object>(v);
    auto it = o.find(key);
    if (it == o.end()) throw std::runtime_error("no key " + key);
    return it->second;
  }
  const Json& operator[](size_t i) const { return std::get<Array>(v).at(i); }
  const Array& array() const { return std::get<Array>(v); }
  const Object& object() const { return std::get<Object>(v); }
  const std::string& str() const { return std::get<std::string>(v); }
  uint64_t u64() const { return static_cast<uint64_t>(std::get<double>(v)); }
};

class JsonParser {
 public:
  explicit JsonParser(std::string_view s) : s_(s) {}

  Json ParseDocument() {
    Json j = Value();
    Ws();
    if (i_ != s_.size()) Fail("trailing characters");
    return j;
  }

 private:
  [[noreturn]] void Fail(const std::string& why) {
    throw std::runtime_error("JSON: " + why + " at byte " + std::to_string(i_));
  }
  void Ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\t' || s_[i_] == '\r'))
      ++i_;
  }
  char Peek() {
    Ws();
    if (i_ >= s_.size()) Fail("unexpected end");
    return s_[i_];
  }
  void Expect(char c) {
    if (Peek() != c) Fail(std::string("expected ") + c);
    ++i_;
  }
  Json Value() {
    const char c = Peek();
    if (c == '{') {
      ++i_;
      Json::Object o;
      if (Peek() == '}') {
        ++i_;
        return Json{o};
      }
      for (;;) {
        std::string k = String();
        Expect(':');
        if (o.count(k)) Fail("duplicate key " + k);
        o.emplace(std::move(k), Value());
        if (Peek() == ',') {
          ++i_;
          continue;
        }
        Expect('}');
        return Json{o};
      }
    }
    if (c == '[') {
      ++i_;
      Json::Array a;
      if (Peek() == ']') {
        ++i_;
        return Json{a};
      }
      for (;;) {
        a.push_back(Value());
        if (Peek() == ',') {
          ++i_;
          continue;
        }
        Expect(']');
        return Json{a};
      }
    }
    if (c == '"') return Json{String()};
    for (auto [word, value] : {std::pair{"true", Json{true}}, std::pair{"false", Json{false}},
                               std::pair{"null", Json{nullptr}}}) {
      const std::string_view w(word);
      if (s_.substr(i_, w.size()) == w) {
        i_ += w.size();
        return value;
      }
    }
    size_t end = i_;
    while (end < s_.size() &&
           (std::isdigit(static_cast<unsigned char>(s_[end])) || s_[end] == '-' || s_[end] == '.' ||
            s_[end] == 'e' || s_[end] == 'E' || s_[end] == '+')) {
      ++end;
    }
    if (end == i_) Fail("unexpected character");
    const double d = std::stod(std::string(s_.substr(i_, end - i_)));
    i_ = end;
    return Json{d};
  }
  std::string String() {
    Expect('"');
    std::string out;
    for (;;) {
      if (i_ >= s_.size()) Fail("unterminated string");
      const auto c = static_cast<unsigned char>(s_[i_++]);
      if (c == '"') return out;
      if (c < 0x20) Fail("raw control character in string");
      if (c != '\\') {
        out.push_back(static_cast<char>(c));
        continue;
      }
      if (i_ >= s_.size()) Fail("unterminated escape");
      const char e = s_[i_++];
      switch (e) {
        case '"':
          out += '"';
          break;
        case '\\':
          out += '\\';
          break;
        case '/':
          out += '/';
          break;
        case 'n':
          out += '\n';
          break;
        case 't':
          out += '\t';
          break;
        case 'r':
          out += '\r';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'u': {
          if (i_ + 4 > s_.size()) Fail("short \\u escape");
          const auto cp =
              static_cast<uint32_t>(std::stoul(std::string(s_.substr(i_, 4)), nullptr, 16));
          i_ += 4;
          if (cp >= 0xd800 && cp <= 0xdfff) Fail("surrogate escapes are not used by ckptctl");
          if (cp < 0x80) {
            out += static_cast<char>(cp);
          } else if (cp < 0x800) {
            out += static_cast<char>(0xc0 | (cp >> 6));
            out += static_cast<char>(0x80 | (cp & 0x3f));
          } else {
            out += static_cast<char>(0xe0 | (cp >> 12));
            out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
            out += static_cast<char>(0x80 | (cp & 0x3f));
          }
          break;
        }
        default:
          Fail("bad escape");
      }
    }
  }

  std::string_view s_;
  size_t i_ = 0;
};

Json ParseJson(const std::string& s) {
  try {
    return JsonParser(s).ParseDocument();
  } catch (const std::exception& e) {
    INFO("document:\n" << s);
    FAIL(e.what());
  }
  return {};
}

// ------------------------------------------------------------------ the checkpoint

// Names with characters JSON must escape and a non-ASCII one.
const char* const kOddName = "blocks.0.\"quoted\"\\back/slash.\xc3\xbc";

struct Checkpoint {
  TempDir dir;
  std::string step_dir;
  std::vector<TestTensor> tensors;

  // The step directory is <temp dir>[/parent]/step-0000000042.
  explicit Checkpoint(const std::string& parent = "")
      : step_dir(JoinPath(parent.empty() ? dir.path() : dir / parent, StepDirName(42))) {
    std::mt19937_64 rng(testing::TestSeed());
    auto box = [](const Shape& s, Shape o, Shape l) { return *ShardGeometry::Box(s, o, l); };
    auto flat = [](const Shape& s, uint64_t o, uint64_t n) {
      return *ShardGeometry::Flat(s, o, n);
    };
    TestTensor w;
    w.name = "layers.0.attn.wq.weight";
    w.dtype = "float32";
    w.shape = {96, 67};
    w.data = RandomBytes(rng, 96 * 67 * 4);
    w.shards = {{box(w.shape, {0, 0}, {96, 30}), 0}, {box(w.shape, {0, 30}, {96, 37}), 1}};
    TestTensor m;
    m.name = kOddName;
    m.dtype = "bfloat16";
    m.shape = {3, 5, 701};
    m.data = RandomBytes(rng, 3 * 5 * 701 * 2);
    m.shards = {{flat(m.shape, 0, 5000), 1},
                {flat(m.shape, 5000, 10515 - 5000), 2},
                {flat(m.shape, 5000, 10515 - 5000), 0}};
    TestTensor s;
    s.name = "step_count";
    s.dtype = "int64";
    s.shape = {};
    s.data = RandomBytes(rng, 8);
    s.shards = {{*ShardGeometry::Full({}), 2}};
    TestTensor e;
    e.name = "empty.mask";
    e.dtype = "bool";
    e.shape = {0, 4};
    e.shards = {{*ShardGeometry::Full({0, 4}), 0}};
    tensors = {w, m, s, e};
    LayoutOptions layout;
    layout.checksum_chunk = 8192;
    layout.slot_size = 65536;
    REQUIRE_OK(testing::WriteTestCheckpoint(PosixFileSystem(), step_dir, "ctl-job", 42, 3, tensors,
                                            layout));
  }
};

TEST_CASE("ckptctl inspect prints the manifest as text and as JSON", "[ckptctl]") {
  Checkpoint ck;

  Run text = Ckptctl({"inspect", ck.step_dir});
  INFO(text.out);
  REQUIRE(text.exit_code == 0);
  CHECK(Contains(text.out, "ctl-job"));
  CHECK(Contains(text.out, "layers.0.attn.wq.weight"));
  CHECK(Contains(text.out, "rank-00001.data"));
  CHECK(Contains(text.out, "4 tensors, 7 shards"));

  for (const char* order : {"before", "after"}) {
    std::vector<std::string> args = {"--json", "inspect", ck.step_dir};
    if (std::string(order) == "after") args = {"inspect", ck.step_dir, "--json"};
    Run run = Ckptctl(args);
    INFO(run.out);
    REQUIRE(run.exit_code == 0);
    const Json doc = ParseJson(run.out);
    CHECK(doc["job"].str() == "ctl-job");
    CHECK(doc["step"].u64() == 42);
    CHECK(doc["world_size"].u64() == 3);
    CHECK(doc["format_version"].u64() == 1);
    const auto& tensors = doc["tensors"].array();
    REQUIRE(tensors.size() == ck.tensors.size());
    for (size_t i = 0; i < tensors.size(); ++i) {
      const auto& t = ck.tensors[i];
      CHECK(tensors[i]["name"].str() == t.name);
      CHECK(tensors[i]["dtype"].str() == t.dtype);
      REQUIRE(tensors[i]["shape"].array().size() == t.shape.size());
      for (size_t d = 0; d < t.shape.size(); ++d) CHECK(tensors[i]["shape"][d].u64() == t.shape[d]);
      CHECK(tensors[i]["shard_count"].u64() == t.shards.size());
      CHECK(tensors[i]["bytes"].u64() == t.data.size());
      REQUIRE(tensors[i]["shards"].array().size() == t.shards.size());
      for (size_t s = 0; s < t.shards.size(); ++s) {
        const Json& shard = tensors[i]["shards"][s];
        CHECK(shard["writer_rank"].u64() == t.shards[s].rank);
        CHECK(shard["file"].str() == DataFileName(t.shards[s].rank));
        CHECK(shard["offset"].u64() % 4096 == 0);
        CHECK(shard["geometry"]["kind"].str() ==
              (t.shards[s].geometry.kind() == ShardGeometry::Kind::kBox ? "box" : "flat"));
      }
    }
    CHECK(doc["tensors"][0]["shards"][1]["geometry"]["offsets"][1].u64() == 30);
    CHECK(doc["tensors"][1]["shards"][1]["geometry"]["flat_offset"].u64() == 5000);
    REQUIRE(doc["ranks"].array().size() == 3);
    CHECK(doc["ranks"][2]["extra_bytes"].u64() == std::string("extra of rank 2").size());
    CHECK(doc["totals"]["tensors"].u64() == 4);
    CHECK(doc["totals"]["shards"].u64() == 7);
    CHECK(doc["totals"]["bytes"].u64() == 96 * 67 * 4 + 10515 * 2 + 8);
  }
}

TEST_CASE("ckptctl --json escapes a hostile directory name and still prints valid JSON",
          "[ckptctl]") {
  // Quotes, a backslash, a newline, C0 and C1 control characters, U+2028 and bytes that are not
  // UTF-8 (0xff 0xfe, and 0xc3 cut short by a space): the path comes from the command line, so
  // it may hold anything. Each byte that is not UTF-8 reads back as U+FFFD.
  const std::string parent = "odd \"dir\" \\ \n \x01 \xc2\x9b \xe2\x80\xa8 \xff\xfe \xc3 end";
  const std::string replaced =
      "odd \"dir\" \\ \n \x01 \xc2\x9b \xe2\x80\xa8 \xef\xbf\xbd\xef\xbf\xbd \xef\xbf\xbd end";
  Checkpoint ck(parent);
  const std::string expected_dir = ck.dir / replaced + "/" + StepDirName(42);

  Run inspect = Ckptctl({"--json", "inspect", ck.step_dir});
  INFO(inspect.out);
  REQUIRE(inspect.exit_code == 0);
  const Json doc = ParseJson(inspect.out);  // fails on raw control characters too
  CHECK(doc["dir"].str() == expected_dir);
  CHECK(doc["tensors"][1]["name"].str() == kOddName);

  Run verify = Ckptctl({"--json", "verify", ck.step_dir});
  INFO(verify.out);
  REQUIRE(verify.exit_code == 0);
  const Json v = ParseJson(verify.out);
  CHECK(v["dir"].str() == expected_dir);
  CHECK(std::get<bool>(v["ok"].v));
  // Every control character and every invalid byte went out escaped: the documents are printable
  // ASCII and line ends, but for the ü of a tensor name.
  for (std::string out : {inspect.out, verify.out}) {
    for (size_t at; (at = out.find("\xc3\xbc")) != std::string::npos;) out.erase(at, 2);
    size_t bad = 0;
    for (char ch : out) {
      const auto c = static_cast<unsigned char>(ch);
      bad += c != '\n' && (c < 0x20 || c >= 0x7f) ? 1 : 0;
    }
    CHECK(bad == 0);
  }
}

// The byte range [offset, offset + length) of the first stored shard of tensor 0 in its file.
std::pair<std::string, uint64_t> FirstShardByte(const Checkpoint& ck) {
  auto m = ReadManifest(PosixFileSystem(), ck.step_dir);
  REQUIRE_OK(m);
  const auto& s = m->tensors(0).shards(0);
  return {JoinPath(ck.step_dir, s.file()), s.offset() + s.length() / 2};
}

void XorByte(const std::string& path, uint64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  REQUIRE(f.good());
  f.seekg(static_cast<std::streamoff>(offset));
  char c;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x10);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
  f.close();
  REQUIRE(f.good());
}

TEST_CASE("ckptctl verify exits 0 on an intact checkpoint and 1 after a flipped byte",
          "[ckptctl]") {
  Checkpoint ck;
  uint64_t stored = 0;
  for (const auto& t : ck.tensors) {
    for (const auto& s : t.shards) stored += s.geometry.numel() * testing::ElementSize(t.dtype);
  }

  Run ok = Ckptctl({"verify", ck.step_dir});
  INFO(ok.out);
  REQUIRE(ok.exit_code == 0);
  CHECK(Contains(ok.out, "OK: 4 tensors, 7 shards, " + std::to_string(stored) + " bytes verified"));

  const auto [path, offset] = FirstShardByte(ck);
  XorByte(path, offset);
  Run bad = Ckptctl({"verify", ck.step_dir});
  INFO(bad.out);
  CHECK(bad.exit_code == 1);
  CHECK(Contains(bad.out, "checksum mismatch"));
  CHECK(Contains(bad.out, path));
  CHECK(Contains(bad.out, "layers.0.attn.wq.weight"));

  Run json = Ckptctl({"--json", "verify", ck.step_dir});
  INFO(json.out);
  CHECK(json.exit_code == 1);
  const Json doc = ParseJson(json.out);
  CHECK(std::get<bool>(doc["ok"].v) == false);
  REQUIRE(doc["problems"].array().size() == 1);
  CHECK(Contains(doc["problems"][0].str(), path));
}

TEST_CASE("ckptctl reports usage and open errors with exit code 2", "[ckptctl]") {
  TempDir empty;
  Run none = Ckptctl({});
  INFO(none.out);
  CHECK(none.exit_code == 2);

  Run missing = Ckptctl({"verify", empty.path() + "/does-not-exist"});
  INFO(missing.out);
  CHECK(missing.exit_code == 2);

  Run uncommitted = Ckptctl({"inspect", empty.path()});
  INFO(uncommitted.out);
  CHECK(uncommitted.exit_code == 2);
  CHECK(Contains(uncommitted.out, "MANIFEST"));

  Checkpoint ck;
  Run format = Ckptctl({"export", ck.step_dir, "--format", "pickle", "--out", empty / "x"});
  INFO(format.out);
  CHECK(format.exit_code == 2);
  Run no_out = Ckptctl({"export", ck.step_dir, "--format", "safetensors"});
  INFO(no_out.out);
  CHECK(no_out.exit_code == 2);

  Run help = Ckptctl({"--help"});
  CHECK(help.exit_code == 0);
  CHECK(Contains(help.out, "inspect"));
}

// (header, data) of a safetensors file: the 8-byte header length, the JSON header, the bytes.
std::pair<Json, std::string> ReadSafetensors(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  REQUIRE(f.good());
  std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  REQUIRE(bytes.size() >= 8);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t{static_cast<unsigned char>(bytes[i])} << (8 * i);
  REQUIRE(8 + n <= bytes.size());
  CHECK((8 + n) % 8 == 0);
  return {ParseJson(bytes.substr(8, n)), bytes.substr(8 + n)};
}

TEST_CASE("ckptctl export writes a safetensors file with every full tensor", "[ckptctl]") {
  Checkpoint ck;
  TempDir out_dir;
  const std::string out = out_dir / "model.safetensors";
  std::vector<std::string> args = {"export", ck.step_dir, "--format", "safetensors", "--out", out};
  SECTION("whole tensors") {}
  SECTION("tensors in slices of a few KiB (--max-memory)") {
    args.push_back("--max-memory");
    args.push_back("3KiB");
  }
  Run run = Ckptctl(args);
  INFO(run.out);
  REQUIRE(run.exit_code == 0);
  CHECK(!std::filesystem::exists(out + ".tmp"));

  const auto [header, data] = ReadSafetensors(out);

  CHECK(header["__metadata__"]["job"].str() == "ctl-job");
  CHECK(header["__metadata__"]["step"].str() == "42");
  REQUIRE(header.object().size() == ck.tensors.size() + 1);
  uint64_t covered = 0;
  for (const auto& t : ck.tensors) {
    INFO("tensor " << t.name);
    const Json& e = header[t.name];
    CHECK(e["dtype"].str() == std::string(LookupDType(t.dtype)->safetensors));
    REQUIRE(e["shape"].array().size() == t.shape.size());
    for (size_t d = 0; d < t.shape.size(); ++d) CHECK(e["shape"][d].u64() == t.shape[d]);
    const uint64_t begin = e["data_offsets"][0].u64();
    const uint64_t end = e["data_offsets"][1].u64();
    REQUIRE(end - begin == t.data.size());
    REQUIRE(end <= data.size());
    // (no memcmp for an empty tensor: a null pointer is undefined even for length 0)
    if (!t.data.empty()) CHECK(std::memcmp(data.data() + begin, t.data.data(), t.data.size()) == 0);
    covered += end - begin;
  }
  CHECK(covered == data.size());

  // A damaged checkpoint is not exported, and leaves no file behind.
  const auto [path, offset] = FirstShardByte(ck);
  XorByte(path, offset);
  const std::string out2 = out_dir / "bad.safetensors";
  Run bad = Ckptctl({"export", ck.step_dir, "--format", "safetensors", "--out", out2});
  INFO(bad.out);
  CHECK(bad.exit_code == 1);
  CHECK(Contains(bad.out, "checksum mismatch"));
  CHECK(!std::filesystem::exists(out2));
  CHECK(!std::filesystem::exists(out2 + ".tmp"));
}

// A checkpoint as ckptd.torch.Checkpointer names it: model tensors under their state_dict names,
// optimizer state under optimizer.state.<param name>.<key>.
TEST_CASE("ckptctl export: model weights unless --include-optimizer, --only and --tensors narrow",
          "[ckptctl]") {
  TempDir dir;
  const std::string step_dir = JoinPath(dir.path(), StepDirName(7));
  std::mt19937_64 rng(testing::TestSeed());
  std::vector<TestTensor> tensors;
  auto add = [&](const std::string& name, Shape shape) {
    TestTensor t;
    t.name = name;
    t.shape = shape;
    t.data = RandomBytes(rng, *ShapeNumel(shape) * 4);
    t.shards = {{*ShardGeometry::Full(shape), 0}};
    tensors.push_back(t);
  };
  add("fc1.weight", {8, 4});
  add("fc1.bias", {8});
  add("fc2.weight", {2, 8});
  add("optimizer.state.fc1.weight.exp_avg", {8, 4});
  add("optimizer.state.fc1.weight.step", {});
  add("optimizer.state.fc2.weight.exp_avg", {2, 8});
  REQUIRE_OK(testing::WriteTestCheckpoint(PosixFileSystem(), step_dir, "sel-job", 7, 1, tensors,
                                          LayoutOptions()));
  TempDir out_dir;
  const std::string out = out_dir / "out.safetensors";
  auto export_names = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = {"export", step_dir, "--format", "safetensors", "--out", out};
    args.insert(args.end(), extra.begin(), extra.end());
    Run run = Ckptctl(args);
    INFO(run.out);
    REQUIRE(run.exit_code == 0);
    const auto [header, data] = ReadSafetensors(out);
    std::vector<std::string> names;
    uint64_t covered = 0;
    for (const auto& [key, entry] : header.object()) {
      if (key == "__metadata__") continue;
      const std::string name = key;
      names.push_back(name);
      const auto& t = *std::find_if(tensors.begin(), tensors.end(),
                                    [&](const TestTensor& x) { return x.name == name; });
      const uint64_t begin = entry["data_offsets"][0].u64();
      REQUIRE(entry["data_offsets"][1].u64() - begin == t.data.size());
      CHECK(std::memcmp(data.data() + begin, t.data.data(), t.data.size()) == 0);
      covered += t.data.size();
    }
    CHECK(covered == data.size());
    return names;  // sorted: the header is read into a map
  };
  using Names = std::vector<std::string>;
  const Names all = {"fc1.bias",
                     "fc1.weight",
                     "fc2.weight",
                     "optimizer.state.fc1.weight.exp_avg",
                     "optimizer.state.fc1.weight.step",
                     "optimizer.state.fc2.weight.exp_avg"};
  // Model weights only by default; --include-optimizer adds the optimizer state.
  CHECK(export_names({}) == Names{"fc1.bias", "fc1.weight", "fc2.weight"});
  CHECK(export_names({"--include-optimizer"}) == all);
  // --only PREFIX: a model tensor's name, an optimizer state tensor's parameter name.
  CHECK(export_names({"--only", "fc1."}) == Names{"fc1.bias", "fc1.weight"});
  CHECK(export_names({"--only", "fc1.", "--include-optimizer"}) ==
        Names{"fc1.bias", "fc1.weight", "optimizer.state.fc1.weight.exp_avg",
              "optimizer.state.fc1.weight.step"});
  CHECK(export_names({"--only", "optimizer.state.", "--include-optimizer"}) ==
        Names{"optimizer.state.fc1.weight.exp_avg", "optimizer.state.fc1.weight.step",
              "optimizer.state.fc2.weight.exp_avg"});
  // --tensors GLOB: the stored name.
  CHECK(export_names({"--tensors", "*.weight"}) == Names{"fc1.weight", "fc2.weight"});
  CHECK(export_names({"--include-optimizer", "--tensors", "*fc2*"}) ==
        Names{"fc2.weight", "optimizer.state.fc2.weight.exp_avg"});

  // Nothing selected: an error, and no file.
  const std::string none = out_dir / "none.safetensors";
  Run empty = Ckptctl(
      {"export", step_dir, "--format", "safetensors", "--out", none, "--tensors", "decoder.*"});
  INFO(empty.out);
  CHECK(empty.exit_code == 1);
  CHECK(Contains(empty.out, "no tensor"));
  CHECK(!std::filesystem::exists(none));
  Run optimizer_only = Ckptctl(
      {"export", step_dir, "--format", "safetensors", "--out", none, "--only", "optimizer."});
  INFO(optimizer_only.out);
  CHECK(optimizer_only.exit_code == 1);
  CHECK(Contains(optimizer_only.out, "model weights only"));

  // The previous contract's --only model|optimizer|all: a usage error naming the new flags, for
  // both formats, before anything is read or written.
  for (const std::string format : {"safetensors", "torch"}) {
    for (const std::string old : {"model", "optimizer", "all"}) {
      Run run = Ckptctl({"export", step_dir, "--format", format, "--out", none, "--only", old});
      INFO(format << " --only " << old << ": " << run.out);
      CHECK(run.exit_code == 2);
      CHECK(Contains(run.out, "--only takes a name prefix now, not '" + old + "'"));
      CHECK(Contains(run.out, "--include-optimizer"));
      CHECK(Contains(run.out, "--only '" + old + ".'"));
      CHECK(!std::filesystem::exists(none));
    }
  }
  Run help = Ckptctl({"export", "--help"});
  CHECK(Contains(help.out, "--include-optimizer"));
  CHECK(help.exit_code == 0);
  CHECK(Contains(help.out, "--only"));
  CHECK(Contains(help.out, "--tensors"));
}

// torch files are converted by the ckptd Python package, run with $CKPTCTL_PYTHON (default
// python3); the conversions themselves are tested with PyTorch in tests/python/test_offline.py.
TEST_CASE("ckptctl export --format torch and import name the Python they could not start",
          "[ckptctl]") {
  Checkpoint ck;
  TempDir out_dir;
  const std::string missing = out_dir / "no-such-python";
  const std::string env = "CKPTCTL_PYTHON=" + ShellQuote(missing);
  const std::string out = out_dir / "model.pt";
  Run exp = Ckptctl({"export", ck.step_dir, "--format", "torch", "--out", out}, env);
  INFO(exp.out);
  CHECK(exp.exit_code == 1);
  CHECK(Contains(exp.out, missing));
  CHECK(Contains(exp.out, "CKPTCTL_PYTHON"));
  CHECK(!std::filesystem::exists(out));

  const std::string file = out_dir / "weights.pt";
  std::ofstream(file) << "not read";
  Run imp = Ckptctl({"import", file, "--storage-root", out_dir.path(), "--job", "j"}, env);
  INFO(imp.out);
  CHECK(imp.exit_code == 1);
  CHECK(Contains(imp.out, missing));
  CHECK(!std::filesystem::exists(out_dir / "j"));

  Run bad_job = Ckptctl({"import", file, "--storage-root", out_dir.path(), "--job", "../up"});
  INFO(bad_job.out);
  CHECK(bad_job.exit_code == 2);
  CHECK(Contains(bad_job.out, "../up"));
}

}  // namespace
}  // namespace ckpt
