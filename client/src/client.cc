// ckpt::Client: requests over one Unix socket, replies matched by id.
//
// The connection carries frames both ways (common/frame_io.h). Requests go out under
// `send_mu_`, each with a fresh request id that is registered in `pending_` *before* its frame
// is written, so a reply can never arrive for an id nobody waits for. One reader thread blocks
// in recvmsg, decodes each DaemonMessage and either completes the pending call with that id
// (the caller sleeps on `cv_`), records an unsolicited Event (request id 0) in a small bounded
// map, or drops the reply (its caller timed out and removed the id). Callers therefore wait
// independently: a WaitSnapshot blocked for seconds does not hold up a Latest from another
// thread.
//
// Failure is sticky and never silent. `connection_` turns non-OK exactly once — when the reader
// sees EOF, an error or an undecodable frame, when a send fails, or when Close() runs — and
// every waiter is woken, so a call in flight returns kUnavailable (or kCancelled after Close)
// instead of hanging on a dead daemon; later calls fail at once with the same status.
//
// Register may need several frames (at most kMaxFdsPerFrame fds and ~8 MiB each). They are
// written back to back under one hold of `send_mu_` so no other request interleaves with a
// half-sent set, and every frame's id points at the same pending call: the daemon answers the
// last one, and an early Error on any of them ends the call too.
//
// Lock order: register_mu_ → send_mu_ → mu_. close_mu_ is taken only by Close, which takes
// mu_ and then send_mu_ but never while holding either.
#include "ckpt/client.h"

#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <utility>

#include "ckptd/v1/local.pb.h"
#include "client/src/cuda_export.h"
#include "common/dtype.h"
#include "common/frame_io.h"
#include "common/names.h"

#ifndef CKPT_CLIENT_VERSION
#define CKPT_CLIENT_VERSION "0.0.0"
#endif

namespace ckpt {
namespace {

namespace pb = ::ckptd::v1;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr uint32_t kProtocolVersion = 1;
// Register frames are cut at this much payload, far below kMaxFrameBytes so the daemon never
// holds a huge frame in memory.
constexpr size_t kRegisterFramePayload = 8u << 20;
// Unsolicited events are remembered for this many steps (the newest ones).
constexpr size_t kTrackedSteps = 32;

std::string Ms(milliseconds d) { return std::to_string(d.count()) + " ms"; }

// "CAPTURED" from STEP_STATE_CAPTURED.
std::string StateName(pb::StepState state) {
  std::string name = pb::StepState_Name(state);
  constexpr std::string_view kPrefix = "STEP_STATE_";
  if (name.starts_with(kPrefix)) name.erase(0, kPrefix.size());
  return name.empty() ? "state " + std::to_string(static_cast<int>(state)) : name;
}

Status FromDaemonError(const pb::Error& error) {
  const uint32_t c = error.code();
  std::string message =
      error.message().empty() ? "ckptd reported an error without a message" : error.message();
  if (c >= 1 && c <= static_cast<uint32_t>(StatusCode::kDataLoss)) {
    return Status(static_cast<StatusCode>(c), std::move(message));
  }
  return Status(StatusCode::kUnknown, message + " (ckptd error code " + std::to_string(c) + ")");
}

struct timeval ToTimeval(milliseconds d) {
  struct timeval tv = {};
  tv.tv_sec = static_cast<time_t>(d.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((d.count() % 1000) * 1000);
  return tv;
}

// Connects a stream socket to `path`, retrying while the daemon is not there yet (ENOENT), not
// accepting (ECONNREFUSED) or its backlog is full (EAGAIN), until `deadline`.
Result<UniqueFd> ConnectUnixSocket(const std::string& path, Clock::time_point deadline,
                                   milliseconds timeout) {
  struct sockaddr_un addr = {};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof addr.sun_path) {
    return InvalidArgument("ckptd socket path '" + path + "' is empty or longer than " +
                           std::to_string(sizeof addr.sun_path - 1) + " bytes");
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  milliseconds backoff{5};
  while (true) {
    UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!fd) return ErrnoStatus(errno, "socket(AF_UNIX)");
    // A blocking connect to a listener with a full backlog waits; SO_SNDTIMEO bounds it.
    const auto remaining =
        std::max(milliseconds(1), std::chrono::ceil<milliseconds>(deadline - Clock::now()));
    struct timeval tv = ToTimeval(remaining);
    ::setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (::connect(fd.get(), reinterpret_cast<const struct sockaddr*>(&addr), sizeof addr) == 0) {
      struct timeval none = {};
      ::setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &none, sizeof none);
      return fd;
    }
    const int err = errno;
    if (err != ENOENT && err != ECONNREFUSED && err != EAGAIN && err != EINTR) {
      return ErrnoStatus(err, "connecting to ckptd at " + path);
    }
    const auto now = Clock::now();
    if (now >= deadline) {
      return Status(StatusCode::kUnavailable,
                    "ckptd is not listening at " + path + ": " +
                        std::error_code(err, std::generic_category()).message() +
                        " (gave up after " + Ms(timeout) + "; is ckptd running?)",
                    err);
    }
    std::this_thread::sleep_for(
        std::min<Clock::duration>(backoff, deadline - now));  // retry backoff, not sync
    backoff = std::min(backoff * 2, milliseconds(200));
  }
}

// Everything that makes two registrations the same (Register's "send nothing" short cut).
struct RegisteredTensor {
  std::string name;
  std::string dtype;
  std::vector<uint64_t> global_shape;
  bool flat;
  std::vector<uint64_t> offsets, lengths;
  uint64_t flat_offset, numel;
  dev_t dev;
  ino_t ino;
  uint64_t fd_offset, nbytes;
  std::string cuda_handle;  // CUDA: the legacy IPC handle; "vmm" rows never compare equal
  bool operator==(const RegisteredTensor&) const = default;
};

bool MulOverflows(uint64_t a, uint64_t b, uint64_t* out) {
  return __builtin_mul_overflow(a, b, out);
}

// Elements of the shard `t` describes; kInvalidArgument naming the tensor when the geometry's
// ranks do not match the shape or the count overflows.
template <typename Tensor>
Result<uint64_t> ShardElements(const Tensor& t) {
  if (t.flat) return t.numel;
  const bool whole = t.offsets.empty() && t.lengths.empty();
  if (!whole &&
      (t.offsets.size() != t.global_shape.size() || t.lengths.size() != t.global_shape.size())) {
    return InvalidArgument("tensor '" + EscapeForLog(t.name) + "': box with " +
                           std::to_string(t.offsets.size()) + " offsets and " +
                           std::to_string(t.lengths.size()) + " lengths for a " +
                           std::to_string(t.global_shape.size()) + "-dimensional tensor");
  }
  uint64_t n = 1;
  for (uint64_t d : whole ? t.global_shape : t.lengths) {
    if (MulOverflows(n, d, &n)) {
      return InvalidArgument("tensor '" + EscapeForLog(t.name) + "': element count overflows");
    }
  }
  return n;
}

}  // namespace

class Client::Impl {
 public:
  Impl(ClientOptions options, UniqueFd socket)
      : options_(std::move(options)), socket_(std::move(socket)) {
    reader_ = std::thread([this] { ReaderLoop(); });
  }
  ~Impl() { Close(); }

  Status Hello(Clock::time_point deadline);
  Status Register(std::span<const HostTensor> tensors, std::span<const CudaTensor> cuda);
  Status Save(uint64_t step, std::string_view extra, OnFull on_full, CudaStream stream);
  Status WaitSnapshot(std::optional<milliseconds> timeout);
  Status Wait(uint64_t step, WaitState state, std::optional<milliseconds> timeout);
  Result<std::optional<uint64_t>> Latest();
  Result<LoadResult> Load(const LoadOptions& options);
  void Close();
  const std::string& node_id() const { return node_id_; }

 private:
  struct OutgoingFrame {
    pb::ClientMessage message;
    std::vector<int> fds;
  };
  struct PendingCall {
    std::vector<uint64_t> ids;  // every frame's request id; all map to this call
    bool done = false;
    pb::DaemonMessage reply;
  };
  struct StepEvent {
    pb::StepState state;
    std::string reason;
  };

  // Sends `frames` and waits for the reply to any of their ids. Returns the reply when its
  // body is `expected`; the daemon's Error as a Status; kDeadlineExceeded "<what> timed out
  // after ..." when `timeout` passes; the connection's status when it breaks or was closed.
  Result<pb::DaemonMessage> Call(std::vector<OutgoingFrame> frames,
                                 pb::DaemonMessage::BodyCase expected,
                                 std::optional<milliseconds> timeout, std::string_view what);
  void ReaderLoop();
  void OnEvent(const pb::Event& event);
  // Records why the connection is unusable (the first reason wins) and wakes every waiter.
  void Break(Status why);
  void ForgetLocked(const PendingCall& call);        // requires mu_
  std::string LastStateLocked(uint64_t step) const;  // requires mu_
  std::string Lost(std::string_view why) const {
    return "connection to ckptd at " + options_.socket + " lost: " + std::string(why);
  }

  const ClientOptions options_;
  std::string node_id_;  // written by Hello before Connect returns; immutable afterwards

  // The socket stays open until Close() has joined the reader; only Close() closes it.
  UniqueFd socket_;
  FrameReader frame_reader_;  // owned by the reader thread

  // Serializes writes on the socket; held across all frames of one Register.
  std::mutex send_mu_;
  bool socket_closed_ = false;    // guarded by send_mu_
  uint64_t next_request_id_ = 1;  // guarded by send_mu_: ids increase in send order

  std::mutex mu_;
  std::condition_variable cv_;
  Status connection_;  // guarded by mu_: OK while usable, else why not (sticky)
  std::unordered_map<uint64_t, std::shared_ptr<PendingCall>> pending_;  // guarded by mu_
  std::map<uint64_t, StepEvent> events_;     // guarded by mu_: newest kTrackedSteps steps
  std::optional<uint64_t> last_saved_step_;  // guarded by mu_

  std::mutex register_mu_;                                   // serializes Register
  std::optional<std::vector<RegisteredTensor>> registered_;  // guarded by register_mu_
  // GPUs (ordinal → UUID) holding the registered CUDA tensors; Save records an event on each.
  std::map<int, std::string> cuda_devices_;  // guarded by mu_

  std::mutex close_mu_;
  bool closed_ = false;  // guarded by close_mu_
  std::thread reader_;
};

Result<pb::DaemonMessage> Client::Impl::Call(std::vector<OutgoingFrame> frames,
                                             pb::DaemonMessage::BodyCase expected,
                                             std::optional<milliseconds> timeout,
                                             std::string_view what) {
  const auto start = Clock::now();
  auto call = std::make_shared<PendingCall>();
  {
    std::lock_guard send_lock(send_mu_);
    {
      std::lock_guard lock(mu_);
      if (!connection_.ok()) return connection_;
      for (auto& frame : frames) {
        const uint64_t id = next_request_id_++;
        frame.message.set_request_id(id);
        call->ids.push_back(id);
        pending_.emplace(id, call);
      }
    }
    // Serialize everything first: nothing is sent when one frame is over the limit.
    std::vector<std::string> payloads(frames.size());
    for (size_t i = 0; i < frames.size(); ++i) {
      if (!frames[i].message.SerializeToString(&payloads[i]) ||
          payloads[i].size() > kMaxFrameBytes) {
        std::lock_guard lock(mu_);
        ForgetLocked(*call);
        return InvalidArgument(
            std::string(what) + ": request of " + std::to_string(payloads[i].size()) +
            " bytes cannot be framed (limit " + std::to_string(kMaxFrameBytes) + ")");
      }
    }
    for (size_t i = 0; i < frames.size(); ++i) {
      Status sent = socket_closed_ ? Unavailable("socket closed")
                                   : SendFrame(socket_.get(), payloads[i], frames[i].fds);
      if (!sent.ok()) {
        // The stream may hold part of a frame now: the connection cannot be used any more.
        // Shutting it down (the fd is open: we hold send_mu_) also wakes the reader.
        if (!socket_closed_) ::shutdown(socket_.get(), SHUT_RDWR);
        Break(Unavailable(Lost(sent.message())));
        std::lock_guard lock(mu_);
        ForgetLocked(*call);
        return connection_;
      }
    }
  }
  std::unique_lock lock(mu_);
  auto ready = [&] { return call->done || !connection_.ok(); };
  if (timeout) {
    if (!cv_.wait_until(lock, start + *timeout, ready)) {
      ForgetLocked(*call);  // a late reply finds no id and is dropped
      return DeadlineExceeded(std::string(what) + " timed out after " + Ms(*timeout));
    }
  } else {
    cv_.wait(lock, ready);
  }
  if (!call->done) {
    ForgetLocked(*call);
    return connection_;
  }
  pb::DaemonMessage reply = std::move(call->reply);
  lock.unlock();
  if (reply.has_error()) return FromDaemonError(reply.error());
  if (reply.body_case() != expected) {
    return Internal(std::string(what) + ": ckptd answered with message body " +
                    std::to_string(static_cast<int>(reply.body_case())) + ", expected " +
                    std::to_string(static_cast<int>(expected)));
  }
  return reply;
}

void Client::Impl::ForgetLocked(const PendingCall& call) {
  for (uint64_t id : call.ids) pending_.erase(id);
}

void Client::Impl::Break(Status why) {
  {
    std::lock_guard lock(mu_);
    if (!connection_.ok()) return;
    spdlog::debug("ckpt client (job {} rank {}): {}", options_.job, options_.rank, why.message());
    connection_ = std::move(why);
  }
  cv_.notify_all();
}

void Client::Impl::ReaderLoop() {
  while (true) {
    auto frame = frame_reader_.ReadSome(socket_.get());
    if (!frame.ok()) {
      Break(Unavailable(Lost(frame.status().message())));
      return;
    }
    if (!frame->has_value()) continue;  // EAGAIN: not expected on this blocking socket
    pb::DaemonMessage message;
    if (!message.ParseFromString((*frame)->payload)) {
      ::shutdown(socket_.get(), SHUT_RDWR);  // the stream cannot be trusted any more
      Break(Unavailable(
          Lost("undecodable frame of " + std::to_string((*frame)->payload.size()) + " bytes")));
      return;
    }
    if (!(*frame)->fds.empty()) {
      spdlog::warn("ckpt client: ckptd sent {} unexpected descriptors; closed them",
                   (*frame)->fds.size());
    }
    if (message.has_event()) {
      OnEvent(message.event());
      continue;
    }
    if (message.request_id() == 0) {
      if (message.has_error()) {
        // The daemon found the stream broken (proto/README.md §2) and closes the connection.
        ::shutdown(socket_.get(), SHUT_RDWR);
        Break(Unavailable(Lost("ckptd reported: " + message.error().message())));
        return;
      }
      spdlog::warn("ckpt client: ignored an unsolicited message (body {}) from ckptd",
                   static_cast<int>(message.body_case()));
      continue;
    }
    bool delivered = false;
    {
      std::lock_guard lock(mu_);
      auto it = pending_.find(message.request_id());
      if (it != pending_.end()) {
        std::shared_ptr<PendingCall> call = it->second;
        ForgetLocked(*call);
        call->reply = std::move(message);
        call->done = true;
        delivered = true;
      }
    }
    if (delivered) {
      cv_.notify_all();
    } else {
      spdlog::debug("ckpt client: dropped a reply to request {} (timed out or unknown)",
                    message.request_id());
    }
  }
}

void Client::Impl::OnEvent(const pb::Event& event) {
  spdlog::debug("ckpt client: ckptd event: job {} step {} {}{}{}", event.job(), event.step(),
                StateName(event.state()), event.reason().empty() ? "" : ": ", event.reason());
  std::lock_guard lock(mu_);
  events_[event.step()] = StepEvent{event.state(), event.reason()};
  while (events_.size() > kTrackedSteps) events_.erase(events_.begin());
}

std::string Client::Impl::LastStateLocked(uint64_t step) const {
  auto it = events_.find(step);
  if (it == events_.end()) return "";
  std::string s = "; last state reported by ckptd: " + StateName(it->second.state);
  if (!it->second.reason.empty()) s += " (" + it->second.reason + ")";
  return s;
}

Status Client::Impl::Hello(Clock::time_point deadline) {
  OutgoingFrame frame;
  pb::Hello* hello = frame.message.mutable_hello();
  hello->set_protocol_version(kProtocolVersion);
  hello->set_job(options_.job);
  hello->set_rank(options_.rank);
  hello->set_world_size(options_.world_size);
  hello->set_local_rank(options_.local_rank);
  hello->set_client_version("ckpt-client " CKPT_CLIENT_VERSION);
  const auto remaining =
      std::max(milliseconds(1), std::chrono::ceil<milliseconds>(deadline - Clock::now()));
  std::vector<OutgoingFrame> frames;
  frames.push_back(std::move(frame));
  const std::string who = "rank " + std::to_string(options_.rank) + " of job " + options_.job;
  auto reply = Call(std::move(frames), pb::DaemonMessage::kHello, remaining, "hello");
  if (!reply.ok()) {
    if (reply.status().code() == StatusCode::kDeadlineExceeded) {
      return DeadlineExceeded("ckptd at " + options_.socket + " accepted " + who +
                              " but did not answer its hello within " +
                              Ms(options_.connect_timeout));
    }
    return reply.status().WithContext("connecting " + who + " to ckptd at " + options_.socket);
  }
  const pb::HelloReply& hr = reply->hello();
  if (hr.protocol_version() != kProtocolVersion) {
    return FailedPrecondition("ckptd at " + options_.socket + " speaks local protocol version " +
                              std::to_string(hr.protocol_version()) + "; this client speaks " +
                              std::to_string(kProtocolVersion));
  }
  node_id_ = hr.node_id();
  spdlog::debug("ckpt client: {} connected to ckptd {} on node {} (session {})", who,
                hr.daemon_version(), hr.node_id(), hr.session_id());
  return Status::Ok();
}

Status Client::Impl::Register(std::span<const HostTensor> tensors,
                              std::span<const CudaTensor> cuda) {
  std::lock_guard register_lock(register_mu_);
  {
    std::lock_guard lock(mu_);
    if (!connection_.ok()) return connection_;
  }
  // Check every tensor and compute its identity.
  std::vector<RegisteredTensor> identity;
  identity.reserve(tensors.size());
  std::unordered_map<int, struct stat> stats;
  for (const HostTensor& t : tensors) {
    RETURN_IF_ERROR(ValidateTensorName(t.name), "register");
    const std::string label = "register: tensor '" + EscapeForLog(t.name) + "'";
    ASSIGN_OR_RETURN(DTypeInfo dtype, LookupDType(t.dtype), label);
    if (t.fd < 0)
      return InvalidArgument(label + ": no file descriptor (fd " + std::to_string(t.fd) + ")");
    auto st = stats.find(t.fd);
    if (st == stats.end()) {
      struct stat s;
      if (::fstat(t.fd, &s) != 0) {
        const int err = errno;
        if (err == EBADF) {
          return InvalidArgument(label + ": fd " + std::to_string(t.fd) + " is not open");
        }
        return ErrnoStatus(err, label + ": fstat of fd " + std::to_string(t.fd));
      }
      st = stats.emplace(t.fd, s).first;
    }
    ASSIGN_OR_RETURN(uint64_t elements, ShardElements(t), "register");
    uint64_t expected_bytes = 0;
    if (MulOverflows(elements, dtype.element_size, &expected_bytes) || t.nbytes != expected_bytes) {
      return InvalidArgument(label + ": nbytes is " + std::to_string(t.nbytes) + " but its " +
                             std::to_string(elements) + " " + std::string(dtype.name) +
                             " elements take " + std::to_string(expected_bytes));
    }
    uint64_t end = 0;
    if (__builtin_add_overflow(t.fd_offset, t.nbytes, &end) ||
        (S_ISREG(st->second.st_mode) && end > static_cast<uint64_t>(st->second.st_size))) {
      return InvalidArgument(label + ": bytes [" + std::to_string(t.fd_offset) + ", " +
                             std::to_string(t.fd_offset) + "+" + std::to_string(t.nbytes) +
                             ") lie past the end of fd " + std::to_string(t.fd) + " (" +
                             std::to_string(st->second.st_size) + " bytes)");
    }
    identity.push_back(RegisteredTensor{t.name,
                                        t.dtype,
                                        t.global_shape,
                                        t.flat,
                                        t.offsets,
                                        t.lengths,
                                        t.flat_offset,
                                        t.numel,
                                        st->second.st_dev,
                                        st->second.st_ino,
                                        t.fd_offset,
                                        t.nbytes,
                                        {}});
  }
  // CUDA tensors: exported on every call — an address says nothing about which allocation is
  // there now (a freed and re-allocated address gets a new handle).
  std::vector<detail::CudaExport> exports;
  exports.reserve(cuda.size());
  std::map<int, std::string> devices;
  if (!cuda.empty()) {
    ASSIGN_OR_RETURN(detail::CudaExporter * exporter, detail::CudaExporter::Get(), "register");
    for (const CudaTensor& t : cuda) {
      RETURN_IF_ERROR(ValidateTensorName(t.name), "register");
      const std::string label = "register: tensor '" + EscapeForLog(t.name) + "'";
      ASSIGN_OR_RETURN(DTypeInfo dtype, LookupDType(t.dtype), label);
      ASSIGN_OR_RETURN(uint64_t elements, ShardElements(t), "register");
      uint64_t expected_bytes = 0;
      if (MulOverflows(elements, dtype.element_size, &expected_bytes) ||
          t.nbytes != expected_bytes) {
        return InvalidArgument(label + ": nbytes is " + std::to_string(t.nbytes) + " but its " +
                               std::to_string(elements) + " " + std::string(dtype.name) +
                               " elements take " + std::to_string(expected_bytes));
      }
      if (t.device_ptr == nullptr) return InvalidArgument(label + ": no device pointer");
      ASSIGN_OR_RETURN(detail::CudaExport e, exporter->Export(t.device_ptr, t.nbytes), label);
      devices[e.device] = e.device_uuid;
      identity.push_back(RegisteredTensor{
          t.name, t.dtype, t.global_shape, t.flat, t.offsets, t.lengths, t.flat_offset, t.numel, 0,
          0, e.offset, t.nbytes,
          e.vmm ? "vmm:" + std::to_string(identity.size()) : e.device_uuid + e.ipc_handle});
      exports.push_back(std::move(e));
    }
  }
  bool has_vmm = false;
  for (const auto& e : exports) has_vmm |= e.vmm;
  // The daemon has this set (VMM fds are fresh objects each time: always sent).
  if (!has_vmm && registered_ && *registered_ == identity) return Status::Ok();

  // One spec per tensor, with the descriptor it needs sent along (host fd or VMM fd).
  struct Pending {
    pb::TensorSpec spec;
    int fd = -1;
  };
  std::vector<Pending> pending;
  pending.reserve(tensors.size() + cuda.size());
  auto fill_geometry = [](pb::TensorSpec& spec, const auto& t) {
    spec.set_name(t.name);
    spec.set_dtype(t.dtype);
    for (uint64_t d : t.global_shape) spec.add_global_shape(d);
    if (t.flat) {
      pb::FlatGeometry* flat = spec.mutable_geometry()->mutable_flat();
      flat->set_flat_offset(t.flat_offset);
      flat->set_numel(t.numel);
    } else {
      // An empty box means the whole tensor; the daemon always gets it spelled out.
      pb::BoxGeometry* box = spec.mutable_geometry()->mutable_box();
      if (t.offsets.empty() && t.lengths.empty()) {
        for (uint64_t d : t.global_shape) {
          box->add_offsets(0);
          box->add_lengths(d);
        }
      } else {
        for (uint64_t o : t.offsets) box->add_offsets(o);
        for (uint64_t l : t.lengths) box->add_lengths(l);
      }
    }
  };
  for (const HostTensor& t : tensors) {
    Pending p;
    fill_geometry(p.spec, t);
    pb::HostMemory* host = p.spec.mutable_host();
    host->set_offset(t.fd_offset);
    host->set_length(t.nbytes);
    host->set_fd_index(static_cast<uint32_t>(kMaxFdsPerFrame));  // sized like the real index
    p.fd = t.fd;
    pending.push_back(std::move(p));
  }
  for (size_t i = 0; i < cuda.size(); ++i) {
    const detail::CudaExport& e = exports[i];
    Pending p;
    fill_geometry(p.spec, cuda[i]);
    pb::CudaMemory* m = p.spec.mutable_cuda();
    m->set_device_uuid(e.device_uuid);
    m->set_allocation_size(e.allocation_size);
    m->set_offset(e.offset);
    m->set_length(cuda[i].nbytes);
    if (e.vmm) {
      m->set_vmm_fd_index(static_cast<uint32_t>(kMaxFdsPerFrame));
      p.fd = e.vmm_fd.get();
    } else {
      m->set_ipc_handle(e.ipc_handle);
    }
    pending.push_back(std::move(p));
  }

  // Build the frames: ≤ kMaxFdsPerFrame fds (each fd once per frame) and ~8 MiB each.
  std::vector<OutgoingFrame> frames;
  std::unordered_map<int, uint32_t> fd_index;  // of the frame being built
  size_t payload = 0;
  auto start_frame = [&] {
    frames.emplace_back();
    frames.back().message.mutable_register_();
    fd_index.clear();
    payload = 0;
  };
  start_frame();
  for (Pending& p : pending) {
    const size_t spec_bytes = p.spec.ByteSizeLong() + 16;  // + tag and length prefix
    const bool new_fd = p.fd >= 0 && !fd_index.contains(p.fd);
    const bool frame_has_tensors = frames.back().message.register_().tensors_size() > 0;
    if (frame_has_tensors && ((new_fd && frames.back().fds.size() == kMaxFdsPerFrame) ||
                              payload + spec_bytes > kRegisterFramePayload)) {
      start_frame();
    }
    if (p.fd >= 0) {
      auto [it, inserted] =
          fd_index.try_emplace(p.fd, static_cast<uint32_t>(frames.back().fds.size()));
      if (inserted) frames.back().fds.push_back(p.fd);
      if (p.spec.has_host()) {
        p.spec.mutable_host()->set_fd_index(it->second);
      } else {
        p.spec.mutable_cuda()->set_vmm_fd_index(it->second);
      }
    }
    payload += spec_bytes;
    *frames.back().message.mutable_register_()->add_tensors() = std::move(p.spec);
  }
  for (size_t i = 0; i + 1 < frames.size(); ++i) {
    frames[i].message.mutable_register_()->set_more(true);
  }
  const size_t frame_count = frames.size();
  registered_.reset();  // until the daemon confirms the new set
  auto reply = Call(std::move(frames), pb::DaemonMessage::kRegister, std::nullopt,
                    "register of " + std::to_string(tensors.size() + cuda.size()) + " tensors");
  // (the exported VMM fds in `exports` were sent, duplicated by the kernel; they close here)
  if (!reply.ok()) return reply.status();
  registered_ = std::move(identity);
  {
    std::lock_guard lock(mu_);
    cuda_devices_ = std::move(devices);
  }
  spdlog::debug("ckpt client: registered {} tensors ({} bytes) in {} frames{}",
                reply->register_().tensors(), reply->register_().bytes(), frame_count,
                reply->register_().unchanged() ? "; unchanged" : "");
  return Status::Ok();
}

Status Client::Impl::Save(uint64_t step, std::string_view extra, OnFull on_full,
                          CudaStream stream) {
  OutgoingFrame frame;
  pb::Save* save = frame.message.mutable_save();
  save->set_step(step);
  std::map<int, std::string> devices;
  {
    std::lock_guard lock(mu_);
    devices = cuda_devices_;
  }
  if (!devices.empty()) {
    // Record first, send after: the daemon's wait must see this record (a wait on an event not
    // yet recorded returns at once).
    ASSIGN_OR_RETURN(detail::CudaExporter * exporter, detail::CudaExporter::Get(),
                     "save of step " + std::to_string(step));
    for (const auto& [ordinal, uuid] : devices) {
      ASSIGN_OR_RETURN(std::string handle, exporter->RecordSaveEvent(ordinal, stream),
                       "save of step " + std::to_string(step));
      pb::CudaEvent* e = save->add_cuda_events();
      e->set_device_uuid(uuid);
      e->set_ipc_event_handle(std::move(handle));
    }
  }
  save->set_extra(std::string(extra));
  save->set_on_full(on_full == OnFull::kSkip ? pb::FULL_POLICY_SKIP : pb::FULL_POLICY_WAIT);
  std::vector<OutgoingFrame> frames;
  frames.push_back(std::move(frame));
  auto reply = Call(std::move(frames), pb::DaemonMessage::kSave, std::nullopt,
                    "save of step " + std::to_string(step));
  if (!reply.ok()) return reply.status();
  if (reply->save().skipped()) {
    // on_full = skip and the pool had no room: nothing of this step is saved.
    return Status(StatusCode::kResourceExhausted,
                  "save of step " + std::to_string(step) + " " + reply->save().reason());
  }
  std::lock_guard lock(mu_);
  last_saved_step_ = step;
  return Status::Ok();
}

Status Client::Impl::WaitSnapshot(std::optional<milliseconds> timeout) {
  std::optional<uint64_t> step;
  {
    std::lock_guard lock(mu_);
    step = last_saved_step_;
  }
  const std::string what =
      step ? "wait_snapshot for step " + std::to_string(*step) + " of job " + options_.job
           : "wait_snapshot (no save yet) of job " + options_.job;
  OutgoingFrame frame;
  frame.message.mutable_wait_snapshot();
  std::vector<OutgoingFrame> frames;
  frames.push_back(std::move(frame));
  auto reply = Call(std::move(frames), pb::DaemonMessage::kWait, timeout, what);
  if (!reply.ok()) {
    if (reply.status().code() == StatusCode::kDeadlineExceeded && step) {
      std::lock_guard lock(mu_);
      return DeadlineExceeded(reply.status().message() + LastStateLocked(*step));
    }
    return reply.status();
  }
  const pb::StepState state = reply->wait().state();
  if (state == pb::STEP_STATE_ABORTED || state == pb::STEP_STATE_FAILED) {
    std::lock_guard lock(mu_);
    return Aborted("step " + std::to_string(reply->wait().step()) + " of job " + options_.job +
                   " is " + StateName(state) + LastStateLocked(reply->wait().step()));
  }
  return Status::Ok();
}

Status Client::Impl::Wait(uint64_t step, WaitState state, std::optional<milliseconds> timeout) {
  OutgoingFrame frame;
  pb::Wait* wait = frame.message.mutable_wait();
  wait->set_step(step);
  const char* state_name = "committed";
  switch (state) {
    case WaitState::kCaptured:
      wait->set_state(pb::STEP_STATE_CAPTURED);
      state_name = "captured";
      break;
    case WaitState::kPersisted:
      wait->set_state(pb::STEP_STATE_PERSISTED);
      state_name = "persisted";
      break;
    case WaitState::kCommitted:
      wait->set_state(pb::STEP_STATE_COMMITTED);
      break;
  }
  std::vector<OutgoingFrame> frames;
  frames.push_back(std::move(frame));
  auto reply = Call(
      std::move(frames), pb::DaemonMessage::kWait, timeout,
      "wait for step " + std::to_string(step) + " of job " + options_.job + " to be " + state_name);
  if (!reply.ok()) {
    if (reply.status().code() == StatusCode::kDeadlineExceeded) {
      std::lock_guard lock(mu_);
      return DeadlineExceeded(reply.status().message() + LastStateLocked(step));
    }
    return reply.status();
  }
  const pb::StepState reached = reply->wait().state();
  if (reached == pb::STEP_STATE_ABORTED || reached == pb::STEP_STATE_FAILED) {
    std::lock_guard lock(mu_);
    return Aborted("step " + std::to_string(step) + " of job " + options_.job + " is " +
                   StateName(reached) + LastStateLocked(step));
  }
  return Status::Ok();
}

Result<std::optional<uint64_t>> Client::Impl::Latest() {
  OutgoingFrame frame;
  frame.message.mutable_latest();
  std::vector<OutgoingFrame> frames;
  frames.push_back(std::move(frame));
  auto reply = Call(std::move(frames), pb::DaemonMessage::kLatest, std::nullopt,
                    "latest of job " + options_.job);
  if (!reply.ok()) return reply.status();
  if (!reply->latest().has_step()) return std::optional<uint64_t>();
  return std::optional<uint64_t>(reply->latest().step());
}

Result<LoadResult> Client::Impl::Load(const LoadOptions& options) {
  const std::optional<uint64_t> step = options.step;
  const CudaStream stream = options.stream;
  const std::string& job = options.job.empty() ? options_.job : options.job;
  OutgoingFrame frame;
  pb::Load* load = frame.message.mutable_load();
  load->set_has_step(step.has_value());
  load->set_step(step.value_or(0));
  load->set_strict(options.strict);
  if (!options.job.empty() && options.job != options_.job) load->set_job(options.job);
  std::vector<OutgoingFrame> frames;
  frames.push_back(std::move(frame));
  auto reply = Call(std::move(frames), pb::DaemonMessage::kLoad, std::nullopt,
                    step ? "load of step " + std::to_string(*step) + " of job " + job
                         : "load of the latest step of job " + job);
  if (!reply.ok()) return reply.status();
  const pb::LoadReply& lr = reply->load();
  LoadResult result;
  result.step = lr.step();
  result.extra = lr.extra();
  result.bytes_from_memory = lr.bytes_from_memory();
  result.bytes_from_storage = lr.bytes_from_storage();
  result.missing.assign(lr.missing().begin(), lr.missing().end());
  if (lr.cuda_events_size() > 0) {
    ASSIGN_OR_RETURN(detail::CudaExporter * exporter, detail::CudaExporter::Get(), "load");
    for (const auto& e : lr.cuda_events()) {
      RETURN_IF_ERROR(exporter->WaitLoaded(e.device_uuid(), e.ipc_event_handle(), stream),
                      "load of step " + std::to_string(lr.step()));
    }
  }
  return result;
}

void Client::Impl::Close() {
  std::lock_guard close_lock(close_mu_);
  if (closed_) return;
  closed_ = true;
  Break(Status(StatusCode::kCancelled,
               "connection to ckptd at " + options_.socket + " was closed by Client::Close()"));
  // Not under send_mu_: a sender may be blocked in sendmsg holding it; the shutdown wakes it
  // (EPIPE) as well as the reader (EOF). The fd stays open until both are done with it.
  ::shutdown(socket_.get(), SHUT_RDWR);
  if (reader_.joinable()) reader_.join();
  std::lock_guard send_lock(send_mu_);
  socket_ = UniqueFd();
  socket_closed_ = true;
}

Result<std::unique_ptr<Client>> Client::Connect(ClientOptions options) {
  RETURN_IF_ERROR(ValidateJobName(options.job), "ckpt client options");
  if (options.world_size == 0 || options.rank >= options.world_size) {
    return InvalidArgument("ckpt client options: rank " + std::to_string(options.rank) +
                           " is not below world_size " + std::to_string(options.world_size));
  }
  const auto deadline = Clock::now() + options.connect_timeout;
  ASSIGN_OR_RETURN(UniqueFd fd,
                   ConnectUnixSocket(options.socket, deadline, options.connect_timeout));
  auto impl = std::make_unique<Impl>(std::move(options), std::move(fd));
  RETURN_IF_ERROR(impl->Hello(deadline));
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() { Close(); }

Status Client::Register(std::span<const HostTensor> tensors) {
  return impl_->Register(tensors, {});
}
Status Client::Register(std::span<const HostTensor> host, std::span<const CudaTensor> cuda) {
  return impl_->Register(host, cuda);
}
Status Client::Save(uint64_t step, std::string_view extra, OnFull on_full) {
  return impl_->Save(step, extra, on_full, nullptr);
}
Status Client::Save(uint64_t step, std::string_view extra, OnFull on_full, CudaStream stream) {
  return impl_->Save(step, extra, on_full, stream);
}
Status Client::WaitSnapshot(std::optional<milliseconds> timeout) {
  return impl_->WaitSnapshot(timeout);
}
Status Client::Wait(uint64_t step, WaitState state, std::optional<milliseconds> timeout) {
  return impl_->Wait(step, state, timeout);
}
Result<std::optional<uint64_t>> Client::Latest() { return impl_->Latest(); }
Result<LoadResult> Client::Load(std::optional<uint64_t> step, bool strict) {
  return impl_->Load(LoadOptions{step, strict, {}, nullptr});
}
Result<LoadResult> Client::Load(std::optional<uint64_t> step, bool strict, CudaStream stream) {
  return impl_->Load(LoadOptions{step, strict, {}, stream});
}
Result<LoadResult> Client::Load(const LoadOptions& options) { return impl_->Load(options); }
void Client::Close() { impl_->Close(); }
const std::string& Client::node_id() const { return impl_->node_id(); }

}  // namespace ckpt
