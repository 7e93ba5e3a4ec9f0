#include "client/python/offline_reader.h"

#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "client/python/offline_writer.h"
#include "common/checkpoint_reader.h"
#include "common/dtype.h"
#include "common/file_system.h"
#include "common/manifest_io.h"
#include "common/names.h"
#include "common/step_layout.h"

namespace py = pybind11;

namespace ckpt::python {
namespace {

// ckptd.Error, looked up once at bind time (module.cc creates it first).
py::object& ErrorType() {
  static py::object* type = new py::object();  // never destroyed: outlives the interpreter's exit
  return *type;
}

[[noreturn]] void Raise(const Status& status) {
  py::object error = ErrorType()(py::str(status.message()));
  error.attr("code") = py::str(std::string(StatusCodeName(status.code())));
  error.attr("message") = py::str(status.message());
  if (status.sys_errno() != 0) error.attr("errno") = py::int_(status.sys_errno());
  PyErr_SetObject(ErrorType().ptr(), error.ptr());
  throw py::error_already_set();
}

void ThrowIfError(const Status& status) {
  if (!status.ok()) Raise(status);
}

template <typename T>
T ValueOrRaise(Result<T> r) {
  if (!r.ok()) Raise(r.status());
  return std::move(r).value();
}

// One open committed step. Read-only after Open, so reads may run from several Python threads.
class PyCheckpointReader {
 public:
  explicit PyCheckpointReader(std::string step_dir) {
    reader_ = ValueOrRaise([&] {
      py::gil_scoped_release release;
      return CheckpointReader::Open(PosixFileSystem(), std::move(step_dir));
    }());
  }

  // {job, step, world_size, format_version, writer, created_unix_ms, step_dir}
  py::dict Info() const {
    const auto& m = reader_->manifest();
    py::dict d;
    d["job"] = m.job();
    d["step"] = m.step();
    d["world_size"] = m.world_size();
    d["format_version"] = m.format_version();
    d["writer"] = m.writer();
    d["created_unix_ms"] = m.created_unix_ms();
    d["step_dir"] = reader_->step_dir();
    return d;
  }

  // [(name, dtype, global_shape, partial, stored shard count)] in manifest order.
  py::list Tensors() const {
    py::list out;
    for (const auto& t : reader_->manifest().tensors()) {
      std::vector<uint64_t> shape(t.global_shape().begin(), t.global_shape().end());
      out.append(py::make_tuple(t.name(), t.dtype(), shape, t.partial(), t.shards_size()));
    }
    return out;
  }

  // The rank's extra blob; NOT_FOUND naming the ranks saved when the step has no such rank.
  py::bytes Extra(uint32_t rank) const {
    const auto& m = reader_->manifest();
    for (const auto& r : m.ranks()) {
      if (r.rank() == rank) return py::bytes(r.extra());
    }
    Raise(NotFound("job '" + m.job() + "' step " + std::to_string(m.step()) + " has no rank " +
                   std::to_string(rank) + " (saved by " + std::to_string(m.world_size()) +
                   " ranks)"));
  }

  // Fills `nbytes` bytes at `address` with the requested region of tensor `name`: a box
  // (offsets, lengths), a flat range (flat_offset, numel), or the whole tensor (neither).
  void Read(const std::string& name, const std::string& dtype,
            const std::vector<uint64_t>& global_shape, const std::string& kind,
            const std::vector<uint64_t>& offsets, const std::vector<uint64_t>& lengths,
            uint64_t flat_offset, uint64_t numel, uintptr_t address, uint64_t nbytes) {
    const auto& m = reader_->manifest();
    const std::string ctx = "job '" + m.job() + "' step " + std::to_string(m.step()) +
                            ", tensor '" + EscapeForLog(name) + "'";
    Result<ShardGeometry> geometry = InvalidArgument("shard kind must be whole, box or flat");
    if (kind == "whole") geometry = ShardGeometry::Full(global_shape);
    if (kind == "box") geometry = ShardGeometry::Box(global_shape, offsets, lengths);
    if (kind == "flat") geometry = ShardGeometry::Flat(global_shape, flat_offset, numel);
    if (!geometry.ok()) Raise(geometry.status().WithContext(ctx));
    const DTypeInfo info = ValueOrRaise(LookupDType(dtype));
    if (geometry->numel() * info.element_size != nbytes) {
      Raise(InvalidArgument(ctx + ": the destination holds " + std::to_string(nbytes) +
                            " bytes, the shard " +
                            std::to_string(geometry->numel() * info.element_size)));
    }
    auto* dest = reinterpret_cast<std::byte*>(address);
    CheckpointReader::Request request{name, *geometry, dtype, std::span<std::byte>(dest, nbytes),
                                      nullptr};
    Status s;
    {
      py::gil_scoped_release release;
      s = reader_->Read({&request, 1});
    }
    if (!s.ok()) Raise(std::move(s).WithContext(ctx));
  }

  // One line per problem; empty when every stored byte checks out.
  std::vector<std::string> Verify() {
    auto problems = [&] {
      py::gil_scoped_release release;
      return reader_->Verify();
    }();
    return ValueOrRaise(std::move(problems));
  }

 private:
  std::unique_ptr<CheckpointReader> reader_;
};

// (name, dtype, shape, address, nbytes) from Python.
using WriteTuple = std::tuple<std::string, std::string, std::vector<uint64_t>, uintptr_t, uint64_t>;

void Write(const std::string& root, const std::string& job, uint64_t step,
           const std::vector<WriteTuple>& tensors, const py::bytes& extra,
           const std::string& writer) {
  std::vector<OfflineTensor> specs;
  specs.reserve(tensors.size());
  for (const auto& [name, dtype, shape, address, nbytes] : tensors) {
    specs.push_back(
        OfflineTensor{name, dtype, shape, reinterpret_cast<const std::byte*>(address), nbytes});
  }
  std::string blob = extra;  // copied with the GIL held
  Status s;
  {
    py::gil_scoped_release release;
    s = WriteOfflineCheckpoint(PosixFileSystem(), root, job, step, specs, blob, writer);
  }
  ThrowIfError(s);
}

}  // namespace

void BindOfflineReader(py::module_& m) {
  ErrorType() = m.attr("Error");

  py::class_<PyCheckpointReader>(m, "CheckpointReader")
      .def(py::init<std::string>(), py::arg("step_dir"),
           "Opens a committed step directory: reads and validates its MANIFEST.")
      .def("info", &PyCheckpointReader::Info)
      .def("tensors", &PyCheckpointReader::Tensors,
           "[(name, dtype, global_shape, partial, stored_shards)] in manifest order.")
      .def("extra", &PyCheckpointReader::Extra, py::arg("rank"))
      .def("read", &PyCheckpointReader::Read, py::arg("name"), py::arg("dtype"),
           py::arg("global_shape"), py::arg("kind"), py::arg("offsets"), py::arg("lengths"),
           py::arg("flat_offset"), py::arg("numel"), py::arg("address"), py::arg("nbytes"),
           "Reads a region (kind: whole, box or flat) into nbytes bytes at address, verifying "
           "every checksum piece it touches.")
      .def("verify", &PyCheckpointReader::Verify,
           "Reads every stored byte; returns one line per problem (empty: intact).");

  m.def(
      "offline_steps",
      [](const std::string& root, const std::string& job) {
        ThrowIfError(ValidateJobName(job));
        auto steps = [&] {
          py::gil_scoped_release release;
          return ListCommittedSteps(PosixFileSystem(), JobDir(root, job));
        }();
        return ValueOrRaise(std::move(steps));
      },
      py::arg("root"), py::arg("job"), "Committed steps of the job (with a MANIFEST), ascending.");
  m.def(
      "offline_latest",
      [](const std::string& root, const std::string& job) {
        ThrowIfError(ValidateJobName(job));
        auto latest = [&] {
          py::gil_scoped_release release;
          return ResolveReadableLatest(PosixFileSystem(), JobDir(root, job));
        }();
        return ValueOrRaise(std::move(latest));
      },
      py::arg("root"), py::arg("job"),
      "The newest committed step whose MANIFEST reads and validates, or None.");
  m.def(
      "offline_step_dir",
      [](const std::string& root, const std::string& job, uint64_t step) {
        ThrowIfError(ValidateJobName(job));
        return StepDir(root, job, step);
      },
      py::arg("root"), py::arg("job"), py::arg("step"));
  m.def("offline_write", &Write, py::arg("root"), py::arg("job"), py::arg("step"),
        py::arg("tensors"), py::arg("extra"), py::arg("writer"),
        "Writes a committed world-size-1 step from [(name, dtype, shape, address, nbytes)].");
}

}  // namespace ckpt::python
