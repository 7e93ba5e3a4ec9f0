// ckptctl: the operator's tool. Online commands ask a running daemon or coordinator over its
// admin endpoint (--admin host:port or unix:PATH; see online_commands.h):
//
//   ckptctl [--admin ADDR] [--json] status | list JOB | describe JOB STEP | watch | health
//   ckptctl [--admin ADDR] pin JOB STEP | unpin JOB STEP | delete JOB STEP
//   ckptctl [--admin ADDR] release-job JOB
//
// Offline commands work on a committed step directory (<root>/<job>/step-<step:010d>) without
// a daemon:
//
//   ckptctl [--json] inspect DIR        what the MANIFEST says: tensors, shards, ranks, totals
//   ckptctl [--json] verify DIR         re-read every byte and check every checksum
//   ckptctl export DIR --format safetensors|torch --out FILE [--include-optimizer]
//                      [--only PREFIX] [--tensors GLOB]
//                                      full tensors into one file, model weights only by default
//   ckptctl import FILE --storage-root ROOT --job JOB [--step N]
//                                      a torch.save state_dict as a committed step
//   (export_commands.h)
//
// Exit codes: 0 success; 1 the command ran and found a problem (a checksum mismatch, a missing or
// short data file, an export that could not be completed); 2 usage errors and checkpoints that
// cannot be opened (no MANIFEST, damaged MANIFEST).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "client/ckptctl/export_commands.h"
#include "client/ckptctl/json_writer.h"
#include "client/ckptctl/online_commands.h"
#include "common/checkpoint_reader.h"
#include "common/dtype.h"
#include "common/manifest_io.h"
#include "common/names.h"
#include "common/units.h"

namespace ckpt::ctl {
namespace {

using ckptd::v1::Manifest;
using ckptd::v1::StoredShard;
using ckptd::v1::TensorEntry;

constexpr int kExitOk = 0;
constexpr int kExitProblem = 1;
constexpr int kExitUsage = 2;

// A name for a terminal: valid UTF-8 as is (tensor names are often non-ASCII), never cut short;
// control characters (C0, DEL, C1), backslash and bytes that are not UTF-8 as \xNN.
std::string Display(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t n = Utf8SequenceLength(s, i);
    const bool c1 = n == 2 && c == 0xc2 && static_cast<unsigned char>(s[i + 1]) < 0xa0;
    if (n == 0 || c1 || c < 0x20 || c == 0x7f || c == '\\') {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
      ++i;
    } else {
      out.append(s.substr(i, n));
      i += n;
    }
  }
  return out;
}

void PrintError(const std::string& what) { std::cerr << "ckptctl: error: " << what << "\n"; }

std::string ShapeText(const TensorEntry& t) {
  std::string s = "[";
  for (int i = 0; i < t.global_shape_size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(t.global_shape(i));
  }
  return s + "]";
}

Result<std::unique_ptr<CheckpointReader>> OpenOrReport(const std::string& dir) {
  auto reader = CheckpointReader::Open(PosixFileSystem(), dir);
  if (!reader.ok()) PrintError("cannot open checkpoint " + dir + ": " + reader.status().ToString());
  return reader;
}

// ---------------------------------------------------------------- inspect

std::string GeometryText(const TensorEntry& t, const StoredShard& s) {
  auto g = GeometryFromProto(s.geometry(), Shape(t.global_shape().begin(), t.global_shape().end()));
  return g.ok() ? g->ToString() : "(invalid geometry: " + g.status().message() + ")";
}

void WriteGeometryJson(JsonWriter& w, const ckptd::v1::ShardGeometry& g) {
  w.BeginObject();
  if (g.has_flat()) {
    w.Field("kind", "flat")
        .Field("flat_offset", uint64_t{g.flat().flat_offset()})
        .Field("numel", uint64_t{g.flat().numel()});
  } else {
    w.Field("kind", "box").Key("offsets").BeginArray();
    for (uint64_t o : g.box().offsets()) w.Uint(o);
    w.EndArray().Key("lengths").BeginArray();
    for (uint64_t l : g.box().lengths()) w.Uint(l);
    w.EndArray();
  }
  w.EndObject();
}

struct Totals {
  uint64_t tensors = 0;
  uint64_t shards = 0;
  uint64_t tensor_bytes = 0;  // sum of the tensors' sizes
  uint64_t stored_bytes = 0;  // sum of the stored shards' lengths (replicas count twice)
  uint64_t extra_bytes = 0;
  std::set<std::string> files;
};

Result<Totals> ComputeTotals(const Manifest& m) {
  Totals t;
  for (const auto& tensor : m.tensors()) {
    ASSIGN_OR_RETURN(TensorSize size, SizeOf(tensor));
    ++t.tensors;
    t.tensor_bytes += size.bytes;
    for (const auto& s : tensor.shards()) {
      ++t.shards;
      t.stored_bytes += s.length();
      t.files.insert(s.file());
    }
  }
  for (const auto& r : m.ranks()) t.extra_bytes += r.extra().size();
  return t;
}

int InspectJson(const std::string& dir, const Manifest& m, const Totals& totals) {
  JsonWriter w(2);
  w.BeginObject()
      .Field("dir", dir)
      .Field("job", m.job())
      .Field("step", uint64_t{m.step()})
      .Field("world_size", uint64_t{m.world_size()})
      .Field("format_version", uint64_t{m.format_version()})
      .Field("writer", m.writer())
      .Field("created_unix_ms", uint64_t{m.created_unix_ms()});
  w.Key("tensors").BeginArray();
  for (const auto& t : m.tensors()) {
    auto size = SizeOf(t);
    w.BeginObject().Field("name", t.name()).Field("dtype", t.dtype()).Key("shape").BeginArray();
    for (uint64_t d : t.global_shape()) w.Uint(d);
    w.EndArray()
        .Field("numel", size.ok() ? size->numel : 0)
        .Field("bytes", size.ok() ? size->bytes : 0)
        .Field("shard_count", static_cast<uint64_t>(t.shards_size()));
    w.Key("shards").BeginArray();
    for (const auto& s : t.shards()) {
      w.BeginObject().Key("geometry");
      WriteGeometryJson(w, s.geometry());
      w.Field("geometry_text", GeometryText(t, s))
          .Field("file", s.file())
          .Field("offset", uint64_t{s.offset()})
          .Field("length", uint64_t{s.length()})
          .Field("chunk_size", uint64_t{s.chunk_size()})
          .Field("chunks", static_cast<uint64_t>(s.chunk_xxh3_size()))
          .Field("writer_rank", uint64_t{s.writer_rank()})
          .EndObject();
    }
    w.EndArray().EndObject();
  }
  w.EndArray();
  w.Key("ranks").BeginArray();
  for (const auto& r : m.ranks()) {
    w.BeginObject()
        .Field("rank", uint64_t{r.rank()})
        .Field("node_id", r.node_id())
        .Field("extra_bytes", static_cast<uint64_t>(r.extra().size()))
        .EndObject();
  }
  w.EndArray();
  w.Key("totals")
      .BeginObject()
      .Field("tensors", totals.tensors)
      .Field("shards", totals.shards)
      .Field("bytes", totals.tensor_bytes)
      .Field("stored_bytes", totals.stored_bytes)
      .Field("data_files", static_cast<uint64_t>(totals.files.size()))
      .Field("extra_bytes", totals.extra_bytes)
      .EndObject();
  w.EndObject();
  std::cout << w.str() << "\n";
  return kExitOk;
}

int InspectText(const std::string& dir, const Manifest& m, const Totals& totals) {
  std::cout << "checkpoint  " << dir << "\n"
            << "job         " << m.job() << "\n"
            << "step        " << m.step() << "\n"
            << "world size  " << m.world_size() << "\n"
            << "format      v" << m.format_version() << "\n";
  if (!m.writer().empty()) std::cout << "writer      " << Display(m.writer()) << "\n";
  if (m.created_unix_ms() != 0)
    std::cout << "created     " << m.created_unix_ms() << " (unix ms)\n";
  std::cout << "\ntensors (" << m.tensors_size() << "):\n";
  for (const auto& t : m.tensors()) {
    auto size = SizeOf(t);
    std::cout << "  " << Display(t.name()) << "  " << t.dtype() << " " << ShapeText(t) << "  "
              << t.shards_size() << (t.shards_size() == 1 ? " shard  " : " shards  ")
              << FormatBytes(size.ok() ? size->bytes : 0) << "\n";
    for (int i = 0; i < t.shards_size(); ++i) {
      const auto& s = t.shards(i);
      std::cout << "    shard " << i << ": " << GeometryText(t, s) << "  " << s.file() << " @ "
                << s.offset() << " + " << s.length() << "  writer rank " << s.writer_rank() << "  "
                << s.chunk_xxh3_size() << " x " << FormatBytes(s.chunk_size()) << " checksums\n";
    }
  }
  std::cout << "\nranks (" << m.ranks_size() << "):\n";
  for (const auto& r : m.ranks()) {
    std::cout << "  rank " << r.rank() << "  node "
              << (r.node_id().empty() ? "-" : Display(r.node_id())) << "  extra "
              << FormatBytes(r.extra().size()) << "\n";
  }
  std::cout << "\ntotal: " << totals.tensors << " tensors, " << totals.shards << " shards, "
            << totals.tensor_bytes << " bytes (" << FormatBytes(totals.tensor_bytes) << ")";
  if (totals.stored_bytes != totals.tensor_bytes) {
    std::cout << ", " << totals.stored_bytes << " bytes stored";
  }
  std::cout << " in " << totals.files.size() << " data file"
            << (totals.files.size() == 1 ? "" : "s") << ", " << totals.extra_bytes
            << " bytes of rank extras\n";
  return kExitOk;
}

int Inspect(const std::string& dir, bool json) {
  auto reader = OpenOrReport(dir);
  if (!reader.ok()) return kExitUsage;
  auto totals = ComputeTotals((*reader)->manifest());
  if (!totals.ok()) {
    PrintError(dir + ": " + totals.status().ToString());
    return kExitUsage;
  }
  return json ? InspectJson(dir, (*reader)->manifest(), *totals)
              : InspectText(dir, (*reader)->manifest(), *totals);
}

// ---------------------------------------------------------------- verify

int Verify(const std::string& dir, bool json) {
  auto reader = OpenOrReport(dir);
  if (!reader.ok()) return kExitUsage;
  auto totals = ComputeTotals((*reader)->manifest());
  if (!totals.ok()) {
    PrintError(dir + ": " + totals.status().ToString());
    return kExitUsage;
  }
  auto problems = (*reader)->Verify();
  if (!problems.ok()) {
    PrintError("verifying " + dir + ": " + problems.status().ToString());
    return kExitProblem;
  }
  if (json) {
    JsonWriter w(2);
    w.BeginObject()
        .Field("dir", dir)
        .Field("ok", problems->empty())
        .Field("tensors", totals->tensors)
        .Field("shards", totals->shards)
        .Field("bytes", totals->stored_bytes)
        .Field("bytes_read", (*reader)->bytes_read())
        .Key("problems")
        .BeginArray();
    for (const auto& p : *problems) w.String(p);
    w.EndArray().EndObject();
    std::cout << w.str() << "\n";
  } else if (problems->empty()) {
    std::cout << "OK: " << totals->tensors << " tensors, " << totals->shards << " shards, "
              << totals->stored_bytes << " bytes verified\n";
  } else {
    for (const auto& p : *problems) std::cout << p << "\n";
    std::cout << "FAILED: " << problems->size() << " problem" << (problems->size() == 1 ? "" : "s")
              << " in " << dir << "\n";
  }
  return problems->empty() ? kExitOk : kExitProblem;
}

}  // namespace
}  // namespace ckpt::ctl

int main(int argc, char** argv) {
  using namespace ckpt::ctl;
  CLI::App app{
      "ckptctl: observe ckptd daemons and inspect, verify, export and import their checkpoints.\n"
      "Online commands (status, list, describe, watch, health, pin, unpin, delete, release-job)\n"
      "ask a daemon or coordinator over its admin endpoint; offline commands (inspect, verify,\n"
      "export) work on a committed step directory (<storage-root>/<job>/step-<step:010d>),\n"
      "import on a storage root."};
  app.require_subcommand(1);
  app.fallthrough();  // subcommands inherit it: `ckptctl inspect DIR --json` works too
  bool json = false;
  app.add_flag("--json", json, "print JSON instead of text");

  // ---- online commands ----
  AdminTarget target;
  if (const char* env = std::getenv("CKPTCTL_ADMIN"); env != nullptr && *env != '\0') {
    target.address = env;
  }
  app.add_option("--admin", target.address,
                 "admin endpoint: host:port or unix:PATH (default $CKPTCTL_ADMIN or " +
                     std::string(kDefaultAdminAddress) + ")");
  std::string timeout = "10s";
  app.add_option("--timeout", timeout, "deadline of one call (not of watch), e.g. 5s");
  app.add_option("--tls-ca", target.tls_ca, "connect with TLS, trusting this PEM CA");
  app.add_option("--tls-cert", target.tls_cert, "PEM client certificate");
  app.add_option("--tls-key", target.tls_key, "PEM key of --tls-cert");
  app.add_option("--tls-server-name", target.tls_server_name,
                 "name expected in the server's certificate");
  std::string job;
  uint64_t step = 0;
  auto* status = app.add_subcommand("status", "node, pool, clients, steps in flight, failures");
  auto* list = app.add_subcommand("list", "committed checkpoints of a job");
  list->add_option("JOB", job, "job name")->required();
  auto* describe = app.add_subcommand(
      "describe", "a committed checkpoint's manifest (a memory-only step's, from the coordinator)");
  describe->add_option("JOB", job, "job name")->required();
  describe->add_option("STEP", step, "step")->required();
  WatchOptions watch_options;
  auto* watch = app.add_subcommand("watch", "follow state changes and progress of checkpoints");
  watch->add_option("--job", watch_options.job, "only this job");
  watch->add_option("--max-events", watch_options.max_events, "stop after N events");
  watch
      ->add_option("--interval-ms", watch_options.progress_interval_ms,
                   "progress sample interval (at least 100)")
      ->capture_default_str();
  auto* pin = app.add_subcommand("pin", "keep a committed checkpoint from retention (durable)");
  pin->add_option("JOB", job, "job name")->required();
  pin->add_option("STEP", step, "step")->required();
  auto* unpin = app.add_subcommand("unpin", "hand a pinned checkpoint back to retention");
  unpin->add_option("JOB", job, "job name")->required();
  unpin->add_option("STEP", step, "step")->required();
  auto* del = app.add_subcommand(
      "delete", "remove a committed checkpoint (never the newest, a pinned or an in-flight one)");
  del->add_option("JOB", job, "job name")->required();
  del->add_option("STEP", step, "step")->required();
  auto* release = app.add_subcommand(
      "release-job",
      "drop a finished job's copies in other nodes' memory now (coordinator; no rank registered)");
  release->add_option("JOB", job, "job name")->required();
  std::string health_service;
  auto* health = app.add_subcommand(
      "health", "print SERVING or NOT_SERVING; exit 0 only when SERVING (for exec probes)");
  health->add_option("--service", health_service, "service name to check (default: the server)");

  std::string dir;
  auto* inspect = app.add_subcommand("inspect", "show a checkpoint's manifest");
  inspect->add_option("DIR", dir, "step directory")->required()->check(CLI::ExistingDirectory);
  auto* verify = app.add_subcommand(
      "verify",
      "re-read every byte of a checkpoint and check every checksum (exit 1 on any problem)");
  verify->add_option("DIR", dir, "step directory")->required()->check(CLI::ExistingDirectory);
  ConversionCommands conversions;
  AddConversionCommands(app, conversions);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);  // prints help, or the error and a hint
    return rc == 0 ? kExitOk : kExitUsage;
  }
  target.json = json;
  if (status->parsed() || list->parsed() || describe->parsed() || watch->parsed() ||
      health->parsed() || pin->parsed() || unpin->parsed() || del->parsed() || release->parsed()) {
    auto t = ckpt::ParseDuration(timeout);
    if (!t.ok() || t->count() <= 0) {
      PrintError("--timeout '" + timeout +
                 "': " + (t.ok() ? "must be positive" : t.status().message()));
      return kExitUsage;
    }
    target.timeout = *t;
  }
  if (status->parsed()) return RunStatus(target);
  if (list->parsed()) return RunList(target, job);
  if (describe->parsed()) return RunDescribe(target, job, step);
  if (watch->parsed()) return RunWatch(target, watch_options);
  if (health->parsed()) return RunHealth(target, health_service);
  if (pin->parsed()) return RunStepOperation(target, StepOperation::kPin, job, step);
  if (unpin->parsed()) return RunStepOperation(target, StepOperation::kUnpin, job, step);
  if (del->parsed()) return RunStepOperation(target, StepOperation::kDelete, job, step);
  if (release->parsed()) return RunReleaseJob(target, job);
  if (inspect->parsed()) return Inspect(dir, json);
  if (verify->parsed()) return Verify(dir, json);
  if (auto rc = RunConversionCommands(conversions)) return *rc;
  return kExitUsage;
}
