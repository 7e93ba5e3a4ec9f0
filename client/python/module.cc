// _ckptd: the native half of the `ckptd` Python package — a thin pybind11 wrapper of
// ckpt::Client (client/include/ckpt/client.h). The PyTorch-facing API (ckptd.Client taking
// torch tensors, Shard/FlatShard, ckptd.torch.Checkpointer) is pure Python in ckptd/; this
// module only moves plain values (ints, strings, bytes, fds) to and from the C++ client.
//
// Every call that talks to the daemon releases the GIL, so other Python threads (a data loader,
// a second client) run while one waits. Errors raise `ckptd.Error` (a RuntimeError) whose str()
// is the daemon's (or client's) message and whose `.code` is the StatusCode name
// ("INVALID_ARGUMENT", "ABORTED", "UNAVAILABLE", ...).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cmath>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/client.h"
#include "ckpt/launch_env.h"
#include "client/python/layout_check.h"
#include "client/python/offline_reader.h"
#include "common/status.h"

namespace py = pybind11;

namespace {

// The Python exception type ckptd.Error, created once at import and kept alive by the module.
PyObject* g_error_type = nullptr;

// A failed ckpt::Status on its way to Python; turned into ckptd.Error by the translator below.
class StatusError : public std::runtime_error {
 public:
  explicit StatusError(ckpt::Status status)
      : std::runtime_error(status.ToString()), status_(std::move(status)) {}
  const ckpt::Status& status() const { return status_; }

 private:
  ckpt::Status status_;
};

void ThrowIfError(const ckpt::Status& status) {
  if (!status.ok()) throw StatusError(status);
}

void RaiseError(const ckpt::Status& status) {
  py::handle type(g_error_type);
  py::object error = type(py::str(status.message()));
  error.attr("code") = py::str(std::string(ckpt::StatusCodeName(status.code())));
  error.attr("message") = py::str(status.message());
  if (status.sys_errno() != 0) error.attr("errno") = py::int_(status.sys_errno());
  PyErr_SetObject(g_error_type, error.ptr());
}

// Seconds (a Python float, None = no limit) → the client's optional milliseconds. Negative
// timeouts are rejected by the Python layer; here they clamp to 0.
std::optional<std::chrono::milliseconds> ToTimeout(std::optional<double> seconds) {
  if (!seconds) return std::nullopt;
  if (!std::isfinite(*seconds)) {
    if (*seconds > 0) return std::nullopt;  // +inf: no limit
    throw py::value_error("timeout must be a finite number of seconds or None");
  }
  const double ms = std::ceil(std::max(0.0, *seconds) * 1000.0);
  if (ms > 1e15) return std::nullopt;  // centuries: no limit
  return std::chrono::milliseconds(static_cast<int64_t>(ms));
}

ckpt::WaitState ParseWaitState(const std::string& state) {
  if (state == "captured") return ckpt::WaitState::kCaptured;
  if (state == "persisted") return ckpt::WaitState::kPersisted;
  if (state == "committed") return ckpt::WaitState::kCommitted;
  if (state == "replicated") return ckpt::WaitState::kReplicated;
  throw StatusError(
      ckpt::InvalidArgument("wait: state must be \"captured\", \"persisted\", \"committed\" "
                            "or \"replicated\", not \"" +
                            state + "\""));
}

ckpt::OnFull ParseOnFull(const std::string& on_full) {
  if (on_full == "wait") return ckpt::OnFull::kWait;
  if (on_full == "skip") return ckpt::OnFull::kSkip;
  throw StatusError(
      ckpt::InvalidArgument("save: on_full must be \"wait\" or \"skip\", not \"" + on_full + "\""));
}

// One registered shard as the Python layer hands it over:
//   (name, dtype, global_shape, flat, offsets, lengths, flat_offset, numel, fd, fd_offset, nbytes,
//    device_ptr, partial)
// device_ptr != 0: the shard is CUDA memory at that address (Tensor.data_ptr()) and fd/fd_offset
// are ignored; the C++ client exports it (never PyTorch's private IPC bytes).
using TensorTuple =
    std::tuple<std::string, std::string, std::vector<uint64_t>, bool, std::vector<uint64_t>,
               std::vector<uint64_t>, uint64_t, uint64_t, int, uint64_t, uint64_t, uint64_t, bool>;

// A CUDA stream handle passed from Python as an int (torch.cuda.Stream.cuda_stream); 0 = default.
ckpt::CudaStream ToStream(uint64_t stream) {
  return reinterpret_cast<ckpt::CudaStream>(static_cast<uintptr_t>(stream));
}

// Owns the C++ client. Close() keeps the object (other threads may still be inside a call: they
// return CANCELLED); the client itself is destroyed with the Python object.
class PyClient {
 public:
  PyClient(std::string job, uint32_t rank, uint32_t world_size, std::string socket,
           uint32_t local_rank, double connect_timeout, std::optional<double> call_timeout) {
    ckpt::ClientOptions options;
    options.job = std::move(job);
    options.rank = rank;
    options.world_size = world_size;
    options.socket = std::move(socket);
    options.local_rank = local_rank;
    if (!std::isfinite(connect_timeout) || connect_timeout < 0) {
      throw py::value_error("connect_timeout must be a non-negative number of seconds");
    }
    options.connect_timeout =
        std::chrono::milliseconds(static_cast<int64_t>(std::ceil(connect_timeout * 1000.0)));
    if (call_timeout) {  // None: CKPTD_CALL_TIMEOUT, else the client's default
      if (!std::isfinite(*call_timeout) || *call_timeout <= 0 || *call_timeout > 1e6) {
        throw py::value_error("call_timeout must be a positive number of seconds (or None)");
      }
      options.call_timeout = std::chrono::milliseconds(
          std::max<int64_t>(1, static_cast<int64_t>(std::ceil(*call_timeout * 1000.0))));
    }
    auto connected = [&] {
      py::gil_scoped_release release;
      return ckpt::Client::Connect(std::move(options));
    }();
    ThrowIfError(connected.status());
    client_ = std::move(connected).value();
  }

  ~PyClient() {
    // Closing joins the client's reader thread, which never needs the GIL; release it anyway so
    // a destructor running at garbage collection never stalls other Python threads.
    if (client_ == nullptr) return;
    if (Py_IsInitialized() != 0 && PyGILState_Check() != 0) {
      py::gil_scoped_release release;
      client_.reset();
    } else {
      client_.reset();
    }
  }

  PyClient(const PyClient&) = delete;
  PyClient& operator=(const PyClient&) = delete;

  void Register(const std::vector<TensorTuple>& tensors) {
    std::vector<ckpt::HostTensor> specs;
    std::vector<ckpt::CudaTensor> cuda;
    specs.reserve(tensors.size());
    for (const TensorTuple& t : tensors) {
      ckpt::HostTensor h;
      uint64_t device_ptr = 0;
      std::tie(h.name, h.dtype, h.global_shape, h.flat, h.offsets, h.lengths, h.flat_offset,
               h.numel, h.fd, h.fd_offset, h.nbytes, device_ptr, h.partial) = t;
      if (device_ptr == 0) {
        specs.push_back(std::move(h));
        continue;
      }
      ckpt::CudaTensor c;
      c.name = std::move(h.name);
      c.dtype = std::move(h.dtype);
      c.global_shape = std::move(h.global_shape);
      c.flat = h.flat;
      c.offsets = std::move(h.offsets);
      c.lengths = std::move(h.lengths);
      c.flat_offset = h.flat_offset;
      c.numel = h.numel;
      c.device_ptr = reinterpret_cast<const void*>(static_cast<uintptr_t>(device_ptr));
      c.nbytes = h.nbytes;
      c.partial = h.partial;
      cuda.push_back(std::move(c));
    }
    ckpt::Status st;
    {
      py::gil_scoped_release release;
      st = client_->Register(specs, cuda);
    }
    ThrowIfError(st);
  }

  bool Save(uint64_t step, const py::bytes& extra, const std::string& on_full, uint64_t cuda_stream,
            bool persist, bool hold, bool replace_held, bool post) {
    const ckpt::OnFull policy = ParseOnFull(on_full);
    std::string blob = extra;  // copied with the GIL held
    ckpt::Status st;
    bool held = false;
    {
      py::gil_scoped_release release;
      ckpt::SaveOptions options{blob, policy, ToStream(cuda_stream), persist};
      options.hold = hold;
      options.replace_held = replace_held;
      options.held = &held;
      options.post = post;
      st = client_->Save(step, options);
    }
    ThrowIfError(st);
    return held;
  }

  void ConfirmSave(uint64_t step) {
    ckpt::Status st;
    {
      py::gil_scoped_release release;
      st = client_->ConfirmSave(step);
    }
    ThrowIfError(st);
  }

  void WaitSnapshot(std::optional<double> timeout) {
    const auto limit = ToTimeout(timeout);
    ckpt::Status st;
    {
      py::gil_scoped_release release;
      st = client_->WaitSnapshot(limit);
    }
    ThrowIfError(st);
  }

  void Wait(uint64_t step, const std::string& state, std::optional<double> timeout) {
    const ckpt::WaitState target = ParseWaitState(state);
    const auto limit = ToTimeout(timeout);
    ckpt::Status st;
    {
      py::gil_scoped_release release;
      st = client_->Wait(step, target, limit);
    }
    ThrowIfError(st);
  }

  std::optional<uint64_t> Latest(bool restore_point) {
    auto latest = [&] {
      py::gil_scoped_release release;
      return restore_point ? client_->RestorePoint() : client_->Latest();
    }();
    ThrowIfError(latest.status());
    return *latest;
  }

  // (step, extra, bytes_from_memory, bytes_from_storage, missing, extra_rank, saved_world_size,
  //  bytes_from_peers)
  py::tuple Load(std::optional<uint64_t> step, bool strict, uint64_t cuda_stream,
                 const std::string& job) {
    auto result = [&] {
      py::gil_scoped_release release;
      return client_->Load(ckpt::LoadOptions{step, strict, job, ToStream(cuda_stream)});
    }();
    ThrowIfError(result.status());
    py::list missing;
    for (const std::string& name : result->missing) missing.append(py::str(name));
    return py::make_tuple(result->step, py::bytes(result->extra), result->bytes_from_memory,
                          result->bytes_from_storage, missing, result->extra_rank,
                          result->saved_world_size, result->bytes_from_peers);
  }

  void Abandon(std::optional<uint64_t> step, const std::string& reason) {
    ckpt::Status st;
    {
      py::gil_scoped_release release;
      st = client_->Abandon(step, reason);
    }
    ThrowIfError(st);
  }

  void Close() {
    py::gil_scoped_release release;
    client_->Close();
  }

  std::string node_id() const { return client_->node_id(); }
  double call_timeout() const {
    return static_cast<double>(client_->call_timeout().count()) / 1000.0;
  }
  bool registered() const { return client_->registered(); }
  uint32_t protocol() const { return client_->protocol(); }
  uint32_t reattaches() const { return client_->reattaches(); }

 private:
  std::unique_ptr<ckpt::Client> client_;
};

}  // namespace

PYBIND11_MODULE(_ckptd, m) {
  m.doc() =
      "Native part of the ckptd Python client (wraps the C++ ckpt::Client). "
      "Use the `ckptd` package, not this module.";

  g_error_type = PyErr_NewExceptionWithDoc(
      "ckptd.Error",
      "An error from ckptd or its client. str(e) is the message; e.code is the status code "
      "name (e.g. \"INVALID_ARGUMENT\", \"ABORTED\", \"UNAVAILABLE\", \"DEADLINE_EXCEEDED\").",
      PyExc_RuntimeError, nullptr);
  if (g_error_type == nullptr) throw py::error_already_set();
  py::handle error_type(g_error_type);
  error_type.attr("code") = py::str("UNKNOWN");
  error_type.attr("message") = py::str("");
  error_type.attr("errno") = py::none();
  m.add_object("Error", error_type);  // the module keeps a reference; g_error_type keeps ours

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& e) {
      RaiseError(e.status());
    }
  });

  // What cmake/Cuda.cmake chose for the client library this module links (setup.py prints it at
  // build time; this tells an installed package).
  m.def(
      "built_with_cuda",
      [] {
#if CKPT_HAVE_CUDA
        return true;
#else
        return false;
#endif
      },
      "True when the client was built with the CUDA path (CUDA tensors handed over as IPC "
      "handles); False: CUDA tensors raise UNIMPLEMENTED.");

  m.def(
      "launch_environment",
      [] {
        auto env = ckpt::ReadLaunchEnvironment();
        ThrowIfError(env.status());
        py::dict d;
        d["launcher"] = env->launcher.empty() ? py::object(py::none()) : py::str(env->launcher);
        d["rank"] = env->rank;
        d["world_size"] = env->world_size;
        d["local_rank"] = env->local_rank;
        d["job"] = env->job;
        d["looked_for"] = ckpt::LaunchVariablesLookedFor();
        return d;
      },
      "Who this process is as its launcher (torchrun, Slurm, Open MPI) says: a dict of launcher, "
      "rank, world_size, local_rank, job (None where unknown) and looked_for.");

  ckpt::python::BindLayoutCheck(m);
  // The TensorProbe table this module reads (tensor_probe.h): a _ckptd_torch of another build,
  // which may lay it out otherwise, is not used.
  m.attr("tensor_probe_capsule") = ckpt::python::kTensorProbeCapsule;
  ckpt::python::BindOfflineReader(m);

  py::class_<PyClient>(m, "Client")
      .def(py::init<std::string, uint32_t, uint32_t, std::string, uint32_t, double,
                    std::optional<double>>(),
           py::arg("job"), py::arg("rank"), py::arg("world_size"), py::arg("socket"),
           py::arg("local_rank"), py::arg("connect_timeout"), py::arg("call_timeout") = py::none(),
           "Connects to the daemon (retrying for connect_timeout seconds) and says hello. "
           "call_timeout: seconds every prompt call may take (None: $CKPTD_CALL_TIMEOUT or 10).")
      .def("register", &PyClient::Register, py::arg("tensors"),
           "Registers shards given as tuples (name, dtype, global_shape, flat, offsets, lengths, "
           "flat_offset, numel, fd, fd_offset, nbytes, device_ptr, partial). The fds stay the "
           "caller's; device_ptr != 0 marks CUDA memory; partial: saved in part on purpose.")
      .def("save", &PyClient::Save, py::arg("step"), py::arg("extra"), py::arg("on_full"),
           py::arg("cuda_stream") = 0, py::arg("persist") = true, py::arg("hold") = false,
           py::arg("replace_held") = false, py::arg("post") = false,
           "cuda_stream: the trainer's current stream (int handle) when CUDA tensors are "
           "registered; an event is recorded on it before the request is sent. persist=False: "
           "a memory-only step (replicated to peers' memory, never written to storage). "
           "hold: the daemon reads nothing until confirm_save(step), or until a save of the "
           "step with replace_held replaces it. Returns whether the daemon holds the save "
           "(an older daemon ignores hold). post: returns once the request is written; the "
           "daemon's answer is taken, and a refusal raised, by the next save or "
           "wait_snapshot.")
      .def("confirm_save", &PyClient::ConfirmSave, py::arg("step"),
           "Lets the daemon read the held save of `step`.")
      .def("wait_snapshot", &PyClient::WaitSnapshot, py::arg("timeout"))
      .def("wait", &PyClient::Wait, py::arg("step"), py::arg("state"), py::arg("timeout"))
      .def("latest", &PyClient::Latest, py::arg("restore_point") = false)
      .def("load", &PyClient::Load, py::arg("step"), py::arg("strict"), py::arg("cuda_stream") = 0,
           py::arg("job") = std::string(),
           "Returns (step, extra, bytes_from_memory, bytes_from_storage, missing). job: "
           "another job's checkpoint (empty: this client's job).")
      .def("abandon", &PyClient::Abandon, py::arg("step") = py::none(),
           py::arg("reason") = std::string(),
           "Gives up on a step (None: the last saved): the daemon aborts it; returns without "
           "waiting for the daemon.")
      .def("close", &PyClient::Close)
      .def_property_readonly("node_id", &PyClient::node_id)
      .def_property_readonly("call_timeout", &PyClient::call_timeout)
      .def_property_readonly("registered", &PyClient::registered)
      .def_property_readonly("protocol", &PyClient::protocol)
      .def_property_readonly("reattaches", &PyClient::reattaches);
}
