// ckptctl export / import (export_commands.h has the contract).
//
// Why torch files go through Python. A torch.save file is a zip archive whose data.pkl is a
// pickle that rebuilds every tensor through torch._utils._rebuild_tensor_v2 from storages
// stored as further zip members. Writing one from C++ is possible (a pickler for a flat dict of
// tensors, zip64 past 4 GiB, the storage-type names per dtype and PyTorch version), but reading
// one back for `import` is not a small job: the files people bring hold optimizer state_dicts
// with nested dicts, tuples, floats and whatever classes a training script pickled, and only
// PyTorch's own unpickler reads all of that faithfully. The ckptd Python package already has both
// directions on the same native reader and writer the daemon's format uses (ckptd/offline.py
// export_torch / import_torch, client/python/offline_reader.h, offline_writer.h), so ckptctl runs
// it — one implementation of what a torch file holds, and a converter that cannot disagree with
// torch.load. The cost: the Python converter holds the selected tensors in memory (torch.save
// has no streaming writer), and the machine needs Python with PyTorch and the ckptd package;
// when either is missing the error says which and how to get it. safetensors, a plain header
// plus raw bytes, stays here and streams.
//
// Which Python: $CKPTCTL_PYTHON, else python3 on PATH. Where the package is: whatever that
// Python imports, with the build tree's package (<ckptctl's dir>/../python) put first on
// PYTHONPATH when ckptctl runs from a build tree, so build/bin/ckptctl uses build/python/ckptd.
#include "client/ckptctl/export_commands.h"

#include <fnmatch.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <set>
#include <span>
#include <string_view>
#include <vector>

#include "client/ckptctl/json_writer.h"
#include "common/checkpoint_reader.h"
#include "common/dtype.h"
#include "common/file_system.h"
#include "common/geometry.h"
#include "common/names.h"
#include "common/units.h"

extern char** environ;

namespace ckpt::ctl {

Result<TensorSize> SizeOf(const ckptd::v1::TensorEntry& t) {
  TensorSize out;
  ASSIGN_OR_RETURN(out.dtype, LookupDType(t.dtype()), "tensor '" + EscapeForLog(t.name()) + "'");
  ASSIGN_OR_RETURN(out.numel, ShapeNumel(std::vector<uint64_t>(t.global_shape().begin(),
                                                               t.global_shape().end())));
  out.bytes = out.numel * out.dtype.element_size;
  return out;
}

namespace {

using ckptd::v1::Manifest;
using ckptd::v1::TensorEntry;

constexpr int kExitOk = 0;
constexpr int kExitProblem = 1;
constexpr int kExitUsage = 2;

// What ckptd.torch.Checkpointer names optimizer state tensors with (ckptd/offline.py
// OPTIMIZER_PREFIX).
constexpr std::string_view kOptimizerPrefix = "optimizer.state.";

void PrintError(const std::string& what) { std::cerr << "ckptctl: error: " << what << "\n"; }

// The message for the --only values of the previous contract (ckptd/offline.py _OLD_ONLY).
std::string OldOnlyMessage(const std::string& value) {
  return "--only takes a name prefix now, not '" + value +
         "': model weights are exported by default, --include-optimizer adds the optimizer "
         "state, and --only PREFIX / --tensors GLOB narrow by name (for tensors whose names start "
         "with '" +
         value + "', write --only '" + value + ".')";
}

bool IsOldOnly(const std::string& only) {
  return only == "model" || only == "optimizer" || only == "all";
}

// ---------------------------------------------------------------- selection

// Which tensors an export writes; the Python converter applies the same rule
// (ckptd.offline.Selection). Model tensors always, optimizer state only when asked for; --only
// matches a model tensor's name and an optimizer state tensor's parameter name (or its stored
// name), so `--only encoder. --include-optimizer` keeps the encoder's weights and their moments;
// --tensors is fnmatch(3) of the stored name without FNM_PATHNAME ('*' also matches '.').
struct Selection {
  bool include_optimizer = false;
  std::string only;
  std::string glob;

  bool Keeps(const std::string& name) const {
    std::string_view subject = name;
    if (subject.starts_with(kOptimizerPrefix)) {
      if (!include_optimizer) return false;
      subject.remove_prefix(kOptimizerPrefix.size());
    }
    if (!only.empty() && !subject.starts_with(only) && !name.starts_with(only)) return false;
    return glob.empty() || ::fnmatch(glob.c_str(), name.c_str(), 0) == 0;
  }
  std::string ToString() const {
    std::string s = include_optimizer ? "--include-optimizer" : "model weights only";
    if (!only.empty()) s += " --only '" + only + "'";
    if (!glob.empty()) s += " --tensors '" + glob + "'";
    return s;
  }
};

std::vector<const TensorEntry*> Select(const Manifest& m, const Selection& selection) {
  std::vector<const TensorEntry*> out;
  for (const auto& t : m.tensors()) {
    if (selection.Keeps(t.name())) out.push_back(&t);
  }
  return out;
}

// ---------------------------------------------------------------- safetensors

// The safetensors header: {"<name>": {"dtype", "shape", "data_offsets"}, ..., "__metadata__"}
// padded with spaces so that the data starts at a multiple of 8.
Result<std::string> SafetensorsHeader(const Manifest& m,
                                      std::span<const TensorEntry* const> tensors) {
  JsonWriter w;
  w.BeginObject();
  std::set<std::string> keys;
  uint64_t offset = 0;
  for (const TensorEntry* entry : tensors) {
    const TensorEntry& t = *entry;
    ASSIGN_OR_RETURN(TensorSize size, SizeOf(t));
    if (t.name() == "__metadata__") {
      return InvalidArgument(
          "tensor '__metadata__' cannot be exported: the name is reserved by "
          "safetensors");
    }
    // Names that are not valid UTF-8 are written with U+FFFD; two such names may collide.
    if (!keys.insert(JsonQuote(t.name())).second) {
      return InvalidArgument("tensor '" + EscapeForLog(t.name()) +
                             "' has the same safetensors name as another tensor once its "
                             "invalid UTF-8 is replaced");
    }
    w.Key(t.name()).BeginObject().Field("dtype", size.dtype.safetensors).Key("shape").BeginArray();
    for (uint64_t d : t.global_shape()) w.Uint(d);
    w.EndArray().Key("data_offsets").BeginArray().Uint(offset).Uint(offset + size.bytes).EndArray();
    w.EndObject();
    offset += size.bytes;
  }
  w.Key("__metadata__")
      .BeginObject()
      .Field("format", "pt")  // what Hugging Face loaders expect
      .Field("job", m.job())
      .Field("step", std::to_string(m.step()))  // safetensors metadata values are strings
      .Field("world_size", std::to_string(m.world_size()))
      .EndObject();
  w.EndObject();
  std::string header = w.Take();
  header.append((8 - header.size() % 8) % 8, ' ');
  return header;
}

// Appends the bytes of `tensors` to `out` from `offset` on, tensor by tensor, at most
// `slice_bytes` at a time (at least one element).
Status WriteTensorData(CheckpointReader& reader, std::span<const TensorEntry* const> tensors,
                       File& out, uint64_t offset, uint64_t slice_bytes) {
  std::vector<std::byte> buffer;
  for (const TensorEntry* entry : tensors) {
    const TensorEntry& t = *entry;
    ASSIGN_OR_RETURN(TensorSize size, SizeOf(t));
    if (size.bytes == 0) continue;
    Shape shape(t.global_shape().begin(), t.global_shape().end());
    const uint64_t es = size.dtype.element_size;
    const uint64_t slice_numel = std::max<uint64_t>(slice_bytes / es, 1);
    for (uint64_t first = 0; first < size.numel; first += slice_numel) {
      const uint64_t n = std::min(slice_numel, size.numel - first);
      // The whole tensor when it fits one slice; flat slices of it otherwise.
      auto geometry =
          n == size.numel ? ShardGeometry::Full(shape) : ShardGeometry::Flat(shape, first, n);
      RETURN_IF_ERROR(geometry, "tensor '" + EscapeForLog(t.name()) + "'");
      buffer.resize(n * es);
      CheckpointReader::Request request{t.name(), *geometry, t.dtype(), buffer};
      RETURN_IF_ERROR(reader.Read({&request, 1}));
      RETURN_IF_ERROR(out.PWriteAll(buffer.data(), buffer.size(), offset));
      offset += buffer.size();
    }
  }
  return Status::Ok();
}

Status ExportSafetensors(CheckpointReader& reader, std::span<const TensorEntry* const> tensors,
                         const std::string& out_path, uint64_t slice_bytes) {
  FileSystem* fs = PosixFileSystem();
  ASSIGN_OR_RETURN(std::string header, SafetensorsHeader(reader.manifest(), tensors));
  const std::string tmp = out_path + ".tmp";
  OpenOptions o;
  o.write = o.create = o.truncate = true;
  ASSIGN_OR_RETURN(auto file, fs->Open(tmp, o));
  auto fail = [&](Status s) {
    file->Close().IgnoreError();
    fs->Remove(tmp).IgnoreError();
    return s;
  };
  char length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  Status s = file->PWriteAll(length, sizeof length, 0);
  if (s.ok()) s = file->PWriteAll(header.data(), header.size(), sizeof length);
  if (s.ok()) {
    s = WriteTensorData(reader, tensors, *file, sizeof length + header.size(), slice_bytes);
  }
  if (s.ok()) s = file->DataSync();
  if (s.ok()) s = file->Close();
  if (s.ok()) s = fs->Rename(tmp, out_path);
  if (!s.ok()) return fail(std::move(s));
  return fs->SyncDir(DirName(out_path));
}

int RunSafetensorsExport(const ExportOptions& o, CheckpointReader& reader,
                         std::span<const TensorEntry* const> tensors) {
  auto slice_bytes = ParseByteSize(o.max_memory);
  if (!slice_bytes.ok() || *slice_bytes == 0) {
    PrintError("--max-memory: " + (slice_bytes.ok() ? std::string("must be positive")
                                                    : slice_bytes.status().message()));
    return kExitUsage;
  }
  const Manifest& m = reader.manifest();
  Status s = ExportSafetensors(reader, tensors, o.out, *slice_bytes);
  if (!s.ok()) {
    PrintError("exporting " + o.dir + " to " + o.out + ": " + s.ToString());
    return kExitProblem;
  }
  uint64_t bytes = 0;
  for (const TensorEntry* t : tensors) {
    auto size = SizeOf(*t);
    if (size.ok()) bytes += size->bytes;
  }
  std::cout << "exported " << tensors.size() << " of " << m.tensors_size() << " tensors (" << bytes
            << " bytes) of job " << m.job() << " step " << m.step() << " to " << o.out << "\n";
  return kExitOk;
}

// ---------------------------------------------------------------- the Python converter

// Run by `python3 -c`: checks for PyTorch and the package first, so that a missing one is
// reported as such (not as a traceback), then hands the arguments to ckptd.offline.main.
constexpr const char* kConverterBootstrap = R"py(
import sys
what = "ckptctl " + sys.argv[1] + (" --format torch" if sys.argv[1] == "export" else "")
try:
    import torch  # noqa: F401
except ImportError as e:
    sys.stderr.write("ckptctl: error: %s needs PyTorch in the Python it runs (%s): %s; install "
                     "it (Debian: apt install python3-torch) or point CKPTCTL_PYTHON at a Python "
                     "that has it\n" % (what, sys.executable, e))
    sys.exit(1)
try:
    import ckptd.offline
except ImportError as e:
    sys.stderr.write("ckptctl: error: %s needs the ckptd Python package in the Python it runs "
                     "(%s): %s; pip install ./client/python, or set PYTHONPATH to a build tree's "
                     "python/ directory\n" % (what, sys.executable, e))
    sys.exit(1)
sys.exit(ckptd.offline.main(sys.argv[1:], prog="ckptctl"))
)py";

// The build tree's package directory (<dir of this executable>/../python) when it holds the
// ckptd package, else empty.
std::string BuildTreePythonPath() {
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "";
  const std::filesystem::path python = exe.parent_path().parent_path() / "python";
  return std::filesystem::exists(python / "ckptd" / "offline.py", ec) ? python.string() : "";
}

// Runs the converter with `args` (ckptd.offline.main's command line); its output goes to ours.
// Returns its exit code, or kExitProblem when it could not be started or died of a signal.
int RunPythonConverter(const std::vector<std::string>& args) {
  const char* env_python = std::getenv("CKPTCTL_PYTHON");
  const std::string python = env_python != nullptr && *env_python != '\0' ? env_python : "python3";
  std::vector<std::string> argv_storage = {python, "-c", kConverterBootstrap};
  argv_storage.insert(argv_storage.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_storage) argv.push_back(a.data());
  argv.push_back(nullptr);

  std::vector<std::string> env_storage;
  const std::string build_tree = BuildTreePythonPath();
  for (char** e = environ; *e != nullptr; ++e) {
    std::string_view entry = *e;
    if (!build_tree.empty() && entry.starts_with("PYTHONPATH=")) continue;
    env_storage.emplace_back(entry);
  }
  if (!build_tree.empty()) {
    const char* old = std::getenv("PYTHONPATH");
    env_storage.push_back("PYTHONPATH=" + build_tree +
                          (old != nullptr && *old != '\0' ? ":" + std::string(old) : ""));
  }
  std::vector<char*> envp;
  for (auto& e : env_storage) envp.push_back(e.data());
  envp.push_back(nullptr);

  std::cout.flush();
  pid_t pid = 0;
  const int rc = ::posix_spawnp(&pid, python.c_str(), nullptr, nullptr, argv.data(), envp.data());
  if (rc != 0) {
    PrintError(
        args[0] + " of torch files runs the ckptd Python package's converter with '" + python +
        "' (CKPTCTL_PYTHON chooses another), which could not be started: " + std::strerror(rc));
    return kExitProblem;
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) {
      PrintError("waiting for the converter '" + python + "' (pid " + std::to_string(pid) +
                 "): " + std::strerror(errno));
      return kExitProblem;
    }
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  PrintError("the converter '" + python + "' (pid " + std::to_string(pid) + ") was killed by " +
             (WIFSIGNALED(status) ? std::string(strsignal(WTERMSIG(status))) : "a signal") +
             " before it finished " + args[0]);
  return kExitProblem;
}

int RunExport(const ExportOptions& o) {
  if (IsOldOnly(o.only)) {
    PrintError(OldOnlyMessage(o.only));
    return kExitUsage;
  }
  Selection selection{o.include_optimizer, o.only, o.glob};
  // Both formats open the step and apply the selection here first, so that a directory that is
  // no committed step or a selection matching nothing fails the same way, without Python.
  auto reader = CheckpointReader::Open(PosixFileSystem(), o.dir);
  if (!reader.ok()) {
    PrintError("cannot open checkpoint " + o.dir + ": " + reader.status().ToString());
    return kExitUsage;
  }
  const Manifest& m = (*reader)->manifest();
  const std::vector<const TensorEntry*> tensors = Select(m, selection);
  if (tensors.empty()) {
    // An empty weights file is never what was meant: most likely a mistyped prefix or glob.
    PrintError("no tensor of " + o.dir + " matches " + selection.ToString() + " (" +
               std::to_string(m.tensors_size()) + " tensors in the checkpoint)");
    return kExitProblem;
  }
  if (o.format == "safetensors") return RunSafetensorsExport(o, **reader, tensors);
  std::vector<std::string> args = {"export", o.dir, "--out", o.out};
  if (o.include_optimizer) args.push_back("--include-optimizer");
  if (!o.only.empty()) args.insert(args.end(), {"--only", o.only});
  if (!o.glob.empty()) args.insert(args.end(), {"--tensors", o.glob});
  return RunPythonConverter(args);
}

int RunImport(const ImportOptions& o) {
  if (Status s = ValidateJobName(o.job); !s.ok()) {
    PrintError("import into job '" + EscapeForLog(o.job) + "': " + s.ToString());
    return kExitUsage;
  }
  std::vector<std::string> args = {"import",       o.file,  "--storage-root",
                                   o.storage_root, "--job", o.job};
  if (o.step) args.insert(args.end(), {"--step", std::to_string(*o.step)});
  return RunPythonConverter(args);
}

}  // namespace

void AddConversionCommands(CLI::App& app, ConversionCommands& c) {
  ExportOptions& e = c.export_options;
  c.export_command = app.add_subcommand(
      "export",
      "write a committed step's full tensors to a safetensors or torch.save file (model weights "
      "only unless --include-optimizer)");
  auto* exp = c.export_command;
  exp->add_option("DIR", e.dir, "step directory")->required()->check(CLI::ExistingDirectory);
  exp->add_option("--format", e.format,
                  "safetensors (written here, streaming) or torch (a torch.load-able file, "
                  "written by the ckptd Python package: needs Python with PyTorch)")
      ->required()
      ->check(CLI::IsMember({"safetensors", "torch"}));
  exp->add_option("--out", e.out, "output file (written to FILE.tmp, then renamed)")->required();
  exp->add_flag("--include-optimizer", e.include_optimizer,
                "add the optimizer state (tensors named optimizer.state.*, as "
                "ckptd.torch.Checkpointer saves it); with --format torch and a Checkpointer's "
                "step, {\"model\", \"optimizer\", \"extra_state\", \"param_names\"}");
  exp->add_option("--only", e.only,
                  "only tensors whose name starts with PREFIX (optimizer state: whose "
                  "parameter's name does), e.g. 'encoder.'")
      ->type_name("PREFIX");
  exp->add_option("--tensors", e.glob,
                  "only tensors whose stored names match this glob (fnmatch; '*' matches dots "
                  "too), e.g. 'layers.*.weight'")
      ->type_name("GLOB");
  exp->add_option("--max-memory", e.max_memory,
                  "safetensors: largest part of one tensor held in memory at a time (e.g. 1GiB)")
      ->capture_default_str();

  ImportOptions& i = c.import_options;
  c.import_command = app.add_subcommand(
      "import",
      "write a torch.save state_dict (or {\"model\", \"optimizer\", \"param_names\"}) as a "
      "committed step that a daemon loads and ckptd.torch.Checkpointer restores (needs Python "
      "with PyTorch)");
  auto* imp = c.import_command;
  imp->add_option("FILE", i.file, "torch.save file")->required()->check(CLI::ExistingFile);
  imp->add_option("--storage-root", i.storage_root, "the daemons' storage root")
      ->required()
      ->check(CLI::ExistingDirectory);
  imp->add_option("--job", i.job, "job name")->required();
  imp->add_option("--step", i.step,
                  "step to write (default: after the job's newest committed step; 0 for a new "
                  "job); never at or below a committed step");
}

std::optional<int> RunConversionCommands(const ConversionCommands& c) {
  if (c.export_command != nullptr && c.export_command->parsed()) return RunExport(c.export_options);
  if (c.import_command != nullptr && c.import_command->parsed()) return RunImport(c.import_options);
  return std::nullopt;
}

}  // namespace ckpt::ctl
