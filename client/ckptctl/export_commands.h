// ckptctl's conversions between a ckptd checkpoint and the files other tools read, offline (no
// daemon):
//
//   ckptctl export DIR --format safetensors|torch --out FILE [--include-optimizer]
//                      [--only PREFIX] [--tensors GLOB] [--max-memory SIZE]
//       a committed step's full tensors in one file. Model weights only by default: the
//       optimizer state that ckptd.torch.Checkpointer stores beside them
//       (optimizer.state.<param name>.<key>) is added by --include-optimizer. --only keeps the
//       tensors whose name starts with PREFIX (for optimizer state: whose parameter's name does);
//       --tensors keeps the stored names matching a glob (fnmatch; '*' matches dots too).
//       --format torch writes a file torch.load reads (the layout: ckptd/offline.py,
//       export_torch).
//   ckptctl import FILE --storage-root ROOT --job JOB [--step N]
//       a torch.save state_dict (or {"model", "optimizer", "param_names"}, what
//       `export --format torch --include-optimizer` writes) as a committed step of JOB that a
//       daemon loads and ckptd.torch.Checkpointer restores; N defaults to the step after the job's
//       newest committed one.
//
// Up to this version --only took model|optimizer|all, with every tensor exported by default.
// Those three values are refused now with a message that names the new flags: a script written
// for the old default would otherwise silently lose the optimizer state it asked for.
//
// safetensors is written here, streaming (at most --max-memory of one tensor held at a time).
// torch files are written and read by the ckptd Python package's converter, which ckptctl runs
// (export_commands.cc says why and how).
//
// Exit codes as every offline command: 0 done; 1 the conversion failed (damaged data, nothing
// selected, Python/PyTorch/the ckptd package missing); 2 usage errors and checkpoints that cannot
// be opened.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <optional>
#include <string>

#include "ckptd/v1/manifest.pb.h"
#include "common/dtype.h"
#include "common/status.h"

namespace ckpt::ctl {

// Element count and byte size of a tensor of a validated manifest (inspect and export).
struct TensorSize {
  DTypeInfo dtype;
  uint64_t numel = 0;
  uint64_t bytes = 0;
};
Result<TensorSize> SizeOf(const ckptd::v1::TensorEntry& t);

struct ExportOptions {
  std::string dir;
  std::string format;  // safetensors | torch
  std::string out;
  std::string max_memory = "256MiB";
  bool include_optimizer = false;
  std::string only;  // name prefix; empty: every name
  std::string glob;  // fnmatch of the stored name; empty: every name
};

struct ImportOptions {
  std::string file;
  std::string storage_root;
  std::string job;
  std::optional<uint64_t> step;  // none: after the job's newest committed step
};

// The export and import subcommands and what they parsed. Add them with AddConversionCommands;
// the object must outlive the app's parse (CLI11 writes the options into it).
struct ConversionCommands {
  CLI::App* export_command = nullptr;
  CLI::App* import_command = nullptr;
  ExportOptions export_options;
  ImportOptions import_options;
};

void AddConversionCommands(CLI::App& app, ConversionCommands& commands);

// Runs whichever of the two was parsed and returns ckptctl's exit code; nullopt when neither was.
std::optional<int> RunConversionCommands(const ConversionCommands& commands);

}  // namespace ckpt::ctl
