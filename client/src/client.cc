// ckpt::Client: requests over one Unix socket, replies matched by id; deadlines on every
// prompt call; a connection that breaks is made again by the next call.
//
// A Connection is one socket and the reader thread that drains it. Requests go out under the
// connection's `send_mu`, each with a fresh request id registered in `pending_` *before* its
// frame is written, so a reply can never arrive for an id nobody waits for. The reader decodes
// each DaemonMessage and completes the pending call with that id (the caller sleeps on `cv_`),
// records an unsolicited Event (request id 0) in a small bounded map, or drops the reply (its
// caller timed out and removed the id). Every frame received also stamps `last_heard`.
//
// Deadlines (the first promise: training never waits on a sick daemon). Prompt calls — hello,
// register, save, latest, abandon — end after `call_timeout` with kDeadlineExceeded; sends are
// bounded by it too (SendFrameUntil), so a frozen daemon with a full socket buffer cannot block
// a caller. Long calls — wait, wait_snapshot, load — keep the caller's own timeout but probe: a
// call that has heard nothing for a quarter of `call_timeout` sends a Ping, and a daemon that
// has answered nothing at all for `call_timeout` fails the call with kDeadlineExceeded. A timed
// out call leaves the connection usable; its late reply is dropped.
//
// Abandon. A Save whose deadline passed may still be accepted later, and a fence that gave up
// is followed by the trainer modifying the memory: in both cases the step must never commit.
// Abandon(step) puts an Abandon frame into the socket before it returns — the daemon reads all
// of a session's input before it counts a capture as complete (daemon/session.h) — or, when
// the frame cannot be written at once (full buffer, protocol 1 daemon), shuts the connection
// down, which aborts every step of this rank not yet captured. Either way the daemon learns of it
// before the trainer's first write to the memory.
//
// Re-attach. A connection breaks when the reader sees EOF, an error or an undecodable frame, or
// a send fails part-way; every call waiting on it returns kUnavailable. The next call that needs
// the daemon connects again (retrying for at most a second within its deadline), says hello
// with its re-attach count, and re-registers the last registered tensors — checking first that
// each descriptor still refers to the same file, so a stale handle is never sent. A failed
// attempt backs off (0.1 s doubling to 5 s): meanwhile calls fail at once with kUnavailable
// instead of stalling the trainer. A WaitSnapshot for a step saved on a broken connection
// reports kUnavailable; that step commits only if the old daemon had captured it.
//
// Posted saves (SaveOptions::post). A Save normally waits for its answer: three thread wake-ups
// (the daemon's loop, this client's reader, the caller), each of which can wait milliseconds for
// a CPU on a busy node. A posted Save is written and returns; the daemon reads a session's
// frames in order, so a ConfirmSave, Abandon or WaitSnapshot written after it is handled after
// it. Its answer stays a pending call (`posted_`) that the next Save or WaitSnapshot takes
// (TakePosted) and finishes exactly as the Save would have (FinishSave): a refusal is returned
// there, and a daemon silent past the save's own deadline gets the step abandoned there —
// before the trainer may touch the memory, since the fence comes first.
//
// Register may need several frames (at most kMaxFdsPerFrame fds and ~8 MiB each). They are
// written back to back under one hold of `send_mu` so no other request interleaves with a
// half-sent set, and every frame's id points at the same pending call: the daemon answers the
// last one, and an early Error on any of them ends the call too.
//
// Lock order: post_mu_ (Save, and WaitSnapshot taking a posted answer) → register_mu_ (held by
// Register and re-attach) → Connection::send_mu → mu_.
// close_mu_ is taken only by Close, which takes mu_ but never while holding it.
#include "ckpt/client.h"

#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <utility>

#include "ckptd/v1/local.pb.h"
#include "client/src/cuda_export.h"
#include "common/dtype.h"
#include "common/frame_io.h"
#include "common/mutex.h"
#include "common/names.h"

#ifndef CKPT_CLIENT_VERSION
#define CKPT_CLIENT_VERSION "0.0.0"
#endif

namespace ckpt {
namespace {

namespace pb = ::ckptd::v1;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// The local protocol this client speaks (proto/ckptd/v1/local.proto): 2, and 1 with an older
// daemon (no Ping, no Abandon).
constexpr uint32_t kProtocolVersion = 3;
constexpr uint32_t kOldestProtocolVersion = 1;
// A re-attach keeps trying to connect for at most this long within its call's deadline.
constexpr milliseconds kReconnectWindow{1000};
constexpr milliseconds kFirstBackoff{100};
constexpr milliseconds kMaxBackoff{5000};
constexpr milliseconds kDefaultCallTimeout{10000};
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
  bool partial = false;
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

// Two registrations hold the same memory: equal in everything but a CUDA handle's bytes (a
// re-export of the same allocation may differ; VMM fds always do).
bool SameMemory(const std::vector<RegisteredTensor>& a, const std::vector<RegisteredTensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    RegisteredTensor x = a[i], y = b[i];
    x.cuda_handle.clear();
    y.cuda_handle.clear();
    if (!(x == y)) return false;
  }
  return true;
}

// CKPTD_CALL_TIMEOUT (seconds) when set and valid, else the default.
milliseconds CallTimeoutFromEnvironment() {
  const char* env = std::getenv("CKPTD_CALL_TIMEOUT");
  if (env == nullptr || *env == '\0') return kDefaultCallTimeout;
  char* end = nullptr;
  const double seconds = std::strtod(env, &end);
  if (end == env || *end != '\0' || !(seconds > 0) || seconds > 1e6) {
    spdlog::warn(
        "ckpt client: ignoring CKPTD_CALL_TIMEOUT='{}' (want a positive number of "
        "seconds); using {} ms",
        env, kDefaultCallTimeout.count());
    return kDefaultCallTimeout;
  }
  return milliseconds(static_cast<int64_t>(seconds * 1000.0 + 0.5));
}

int64_t NowNs() { return Clock::now().time_since_epoch().count(); }

// One connected socket and the thread that reads it.
struct Connection {
  explicit Connection(UniqueFd fd, uint64_t gen) : socket(std::move(fd)), generation(gen) {}
  ~Connection() {
    Shutdown();
    if (reader.joinable()) reader.join();
  }
  // Wakes the reader (EOF) and any sender (EPIPE); the fd stays open until destruction.
  void Shutdown() {
    if (socket) ::shutdown(socket.get(), SHUT_RDWR);
  }

  UniqueFd socket;
  const uint64_t generation;
  std::thread reader;
  FrameReader frames;  // the reader thread's
  // Serializes writes on `socket` (`send_mu`): a gate taken with a deadline. Not a
  // std::timed_mutex: ThreadSanitizer does not model its timed lock (pthread_mutex_clocklock)
  // and reports every later unlock as an error.
  class SendGate {
   public:
    bool TryAcquireUntil(Clock::time_point deadline) {
      MutexLock lock(mu_);
      if (!cv_.WaitUntil(mu_, deadline, [&]() REQUIRES(mu_) { return !busy_; })) return false;
      busy_ = true;
      return true;
    }
    void Release() {
      {
        MutexLock lock(mu_);
        busy_ = false;
      }
      cv_.NotifyOne();
    }

   private:
    Mutex mu_;
    CondVar cv_;
    bool busy_ GUARDED_BY(mu_) = false;
  };
  // Holds the gate for a scope once acquired.
  class SendHold {
   public:
    explicit SendHold(SendGate& gate) : gate_(gate) {}
    ~SendHold() {
      if (held_) gate_.Release();
    }
    bool TryUntil(Clock::time_point deadline) { return held_ = gate_.TryAcquireUntil(deadline); }

   private:
    SendGate& gate_;
    bool held_ = false;
  };
  SendGate send_mu;
  std::atomic<int64_t> last_heard_ns{0};
  // Guarded by Client::Impl::mu_.
  bool ready = false;   // hello (and re-registration) done: calls may use it
  bool broken = false;  // no reply will come any more
  uint32_t protocol = 0;
  int64_t last_ping_ns = 0;
};

}  // namespace

class Client::Impl {
 public:
  explicit Impl(ClientOptions options) : options_(std::move(options)) {
    call_timeout_ =
        options_.call_timeout.count() > 0 ? options_.call_timeout : CallTimeoutFromEnvironment();
  }
  ~Impl() { Close(); }

  // The first connection (retrying for connect_timeout while nothing listens).
  Status Connect();
  Status Register(std::span<const HostTensor> tensors, std::span<const CudaTensor> cuda);
  Status Save(uint64_t step, const SaveOptions& options);
  Status WaitSnapshot(std::optional<milliseconds> timeout);
  Status Wait(uint64_t step, WaitState state, std::optional<milliseconds> timeout);
  Result<std::optional<uint64_t>> Latest(bool restore_point);
  Result<LoadResult> Load(const LoadOptions& options);
  Status Abandon(std::optional<uint64_t> step, std::string_view reason);
  Status ConfirmSave(uint64_t step);
  void Close();
  const std::string& node_id() const { return node_id_; }
  milliseconds call_timeout() const { return call_timeout_; }
  bool registered() const { return registered_flag_.load(); }
  uint32_t reattaches() const { return reattaches_.load(); }
  uint32_t protocol() const { return protocol_.load(); }

 private:
  struct OutgoingFrame {
    pb::ClientMessage message;
    std::vector<int> fds;
  };
  struct PendingCall {
    std::vector<uint64_t> ids;  // every frame's request id; all map to this call
    bool done = false;
    bool cancelled = false;  // nobody needs the answer any more (a posted save abandoned)
    pb::DaemonMessage reply;
  };
  struct StepEvent {
    pb::StepState state;
    std::string reason;
  };
  // How long a call may take: `deadline` for the reply (none: no limit), and whether the daemon
  // must keep answering liveness probes meanwhile (long waits).
  struct Limits {
    std::optional<Clock::time_point> deadline;
    bool probe = false;
  };
  using ConnectionPtr = std::shared_ptr<Connection>;

  // The usable connection, making one first when the last broke (re-attach). `deadline` bounds
  // the re-attach.
  Result<ConnectionPtr> Attached(Clock::time_point deadline);
  // Makes a new connection: connect, hello, re-register.
  Status ReattachLocked(Clock::time_point deadline, bool first) REQUIRES(register_mu_);
  Status HelloOn(const ConnectionPtr& conn, Clock::time_point deadline, bool first);
  // `must_match`: a re-attach's re-registration, which must describe the same memory as before
  // (else kFailedPrecondition and nothing is sent).
  Status RegisterLocked(const ConnectionPtr& conn, std::span<const HostTensor> tensors,
                        std::span<const CudaTensor> cuda, Clock::time_point deadline,
                        const std::vector<RegisteredTensor>* must_match) REQUIRES(register_mu_);
  // Sends `frames` on `conn` and waits for the reply to any of their ids. Returns the reply when
  // its body is `expected`; the daemon's Error as a Status; kDeadlineExceeded "<what> timed out
  // after ..." when the deadline passes or the daemon stops answering probes; kUnavailable when
  // the connection breaks; kCancelled after Close.
  // `*unsent` (may be null) is set when the call failed because the connection had broken
  // before any byte of it was written: the daemon never saw it, and it can be made again.
  Result<pb::DaemonMessage> Call(const ConnectionPtr& conn, std::vector<OutgoingFrame> frames,
                                 pb::DaemonMessage::BodyCase expected, Limits limits,
                                 std::string_view what, bool* unsent = nullptr);
  // Writing never takes longer than a prompt call may, whatever the call's own limit.
  Clock::time_point SendDeadline(Limits limits, Clock::time_point start) const {
    return limits.deadline ? std::min(*limits.deadline, start + call_timeout_)
                           : start + call_timeout_;
  }
  // Call's two halves. Send writes the frames, each under a fresh request id registered first,
  // within `send_deadline`; Await waits for the reply (started at `start`, for messages). Await
  // forgets the call when its deadline passes, unless `keep_on_deadline` (someone awaits it
  // again later).
  Result<std::shared_ptr<PendingCall>> Send(const ConnectionPtr& conn,
                                            std::vector<OutgoingFrame> frames,
                                            Clock::time_point send_deadline, std::string_view what,
                                            bool* unsent);
  Result<pb::DaemonMessage> Await(const ConnectionPtr& conn,
                                  const std::shared_ptr<PendingCall>& call,
                                  pb::DaemonMessage::BodyCase expected, Limits limits,
                                  Clock::time_point start, std::string_view what,
                                  bool keep_on_deadline = false);
  // What a Save returns once its answer is in (or its call failed): records the accepted step,
  // abandons one whose answer came too late. `posted`: a posted save, whose held record was made
  // when it was written (and may have been confirmed since).
  Status FinishSave(uint64_t step, const std::string& what, const ConnectionPtr& conn,
                    Result<pb::DaemonMessage> reply, bool* held, bool posted);
  // Takes the answer to the posted save, if one is outstanding (SaveOptions::post), waiting
  // until `deadline` at most (and never past the save's own): what that Save would have
  // returned. When `deadline` comes first: kDeadlineExceeded, the save still outstanding, and
  // `*outstanding` (may be null) set.
  Status TakePosted(std::optional<Clock::time_point> deadline, bool* outstanding = nullptr)
      REQUIRES(post_mu_);
  // WaitSnapshot once a posted save is answered: waits until this rank's last accepted save is
  // captured (`timeout` counted from `start`).
  Status WaitForLastSave(Clock::time_point start, std::optional<milliseconds> timeout);
  // Send on the attached connection (re-attaching first if it broke, within `attach_deadline`);
  // a connection found broken before the request went out is re-attached once more. `*start`
  // (when not null): when the request that went out began (after its attach), for Await.
  Result<std::shared_ptr<PendingCall>> SendAttached(std::vector<OutgoingFrame> frames,
                                                    Limits limits,
                                                    Clock::time_point attach_deadline,
                                                    std::string_view what, ConnectionPtr* used,
                                                    Clock::time_point* start = nullptr);
  // SendAttached, then Await.
  Result<pb::DaemonMessage> CallAttached(std::vector<OutgoingFrame> frames,
                                         pb::DaemonMessage::BodyCase expected, Limits limits,
                                         Clock::time_point attach_deadline, std::string_view what,
                                         ConnectionPtr* used = nullptr);
  // Writes one frame nobody waits a reply for, within `deadline`. Returns false when it could
  // not be written whole (then the connection was shut down).
  bool SendOneWay(const ConnectionPtr& conn, pb::ClientMessage message, Clock::time_point deadline);
  void ReaderLoop(Connection* conn);
  void OnEvent(const pb::Event& event);
  // Marks `conn` broken (the first reason wins) and wakes every waiter.
  void Break(Connection* conn, Status why);
  void ForgetLocked(const PendingCall& call) REQUIRES(mu_);
  std::string LastStateLocked(uint64_t step) const REQUIRES(mu_);
  std::string Lost(std::string_view why) const {
    return "connection to ckptd at " + options_.socket + " lost: " + std::string(why);
  }
  Clock::time_point PromptDeadline() const { return Clock::now() + call_timeout_; }

  const ClientOptions options_;
  milliseconds call_timeout_;
  std::string node_id_;  // from the first hello; immutable afterwards

  mutable Mutex mu_;
  CondVar cv_;
  ConnectionPtr conn_ GUARDED_BY(mu_);  // the newest connection (null before the first)
  Status connection_ GUARDED_BY(mu_) = Unavailable("not connected yet");  // why conn_ is unusable
  bool closed_ GUARDED_BY(mu_) = false;
  uint64_t next_request_id_ GUARDED_BY(mu_) = 1;
  std::unordered_map<uint64_t, std::shared_ptr<PendingCall>> pending_ GUARDED_BY(mu_);
  std::map<uint64_t, StepEvent> events_ GUARDED_BY(mu_);  // newest kTrackedSteps steps
  // This rank's most recent accepted Save, and the connection generation it went out on.
  std::optional<uint64_t> last_saved_step_ GUARDED_BY(mu_);
  uint64_t last_saved_generation_ GUARDED_BY(mu_) = 0;
  // The newest step this rank tried to save, accepted or not, and the connection it went out on
  // (0: none), until a re-attach's hello reports it (Hello.lost_step).
  // (step, generation).
  std::optional<std::pair<uint64_t, uint64_t>> unconfirmed_save_ GUARDED_BY(mu_);
  // The Save the daemon holds (SaveOptions::hold) until ConfirmSave, and its connection.
  struct HeldSave {
    uint64_t step;
    ConnectionPtr conn;
  };
  std::optional<HeldSave> held_save_ GUARDED_BY(mu_);
  // The posted Save whose answer nobody took yet (SaveOptions::post). Reset by an Abandon of
  // its step: its answer no longer matters.
  struct PostedSave {
    uint64_t step;
    std::string what;
    std::shared_ptr<PendingCall> call;
    ConnectionPtr conn;
    Clock::time_point start;
    Clock::time_point deadline;
  };
  std::shared_ptr<PostedSave> posted_ GUARDED_BY(mu_);
  // Serializes Save and the taking of a posted save's answer: one thread takes it, once.
  Mutex post_mu_ ACQUIRED_BEFORE(register_mu_);
  // GPUs (ordinal → UUID) holding the registered CUDA tensors; Save records an event on each.
  std::map<int, std::string> cuda_devices_ GUARDED_BY(mu_);

  Mutex register_mu_ ACQUIRED_BEFORE(mu_);  // serializes Register and re-attach
  std::optional<std::vector<RegisteredTensor>> registered_ GUARDED_BY(register_mu_);
  std::vector<HostTensor> registered_host_ GUARDED_BY(register_mu_);  // re-sent on re-attach
  std::vector<CudaTensor> registered_cuda_ GUARDED_BY(register_mu_);
  bool has_registration_ GUARDED_BY(register_mu_) = false;
  uint64_t generation_ GUARDED_BY(register_mu_) = 0;
  Clock::time_point next_attempt_ GUARDED_BY(register_mu_){};  // re-attach backoff
  milliseconds backoff_ GUARDED_BY(register_mu_){0};
  std::atomic<bool> registered_flag_{false};  // the daemon holds the registration
  std::atomic<uint32_t> reattaches_{0};
  std::atomic<uint32_t> protocol_{0};  // of the newest connection

  Mutex close_mu_;
};

Status Client::Impl::Connect() {
  MutexLock register_lock(register_mu_);
  return ReattachLocked(Clock::now() + options_.connect_timeout, /*first=*/true);
}

Result<Client::Impl::ConnectionPtr> Client::Impl::Attached(Clock::time_point deadline) {
  {
    MutexLock lock(mu_);
    if (closed_) return connection_;
    if (connection_.ok()) return conn_;
  }
  MutexLock register_lock(register_mu_);
  {
    MutexLock lock(mu_);
    if (closed_) return connection_;
    if (connection_.ok()) return conn_;  // another thread re-attached meanwhile
  }
  RETURN_IF_ERROR(ReattachLocked(deadline, /*first=*/false));
  MutexLock lock(mu_);
  if (!connection_.ok()) return connection_;
  return conn_;
}

Status Client::Impl::ReattachLocked(Clock::time_point deadline, bool first) {
  const auto now = Clock::now();
  Status why;
  ConnectionPtr old;
  {
    MutexLock lock(mu_);
    why = connection_;
    old = conn_;
  }
  if (!first && now < next_attempt_) {
    return Unavailable(why.message() + "; next attempt to reconnect in " +
                       Ms(std::chrono::ceil<milliseconds>(next_attempt_ - now)));
  }
  if (old != nullptr) {
    old->Shutdown();  // the reader ends (EOF) and is joined when `old` is destroyed
  }
  auto fail = [&](Status st) REQUIRES(register_mu_) {
    if (!first) {
      backoff_ = std::min(kMaxBackoff, std::max(kFirstBackoff, backoff_ * 2));
      next_attempt_ = Clock::now() + backoff_;
      MutexLock lock(mu_);
      if (!closed_) connection_ = Unavailable(st.message());
    }
    return st;
  };
  const auto connect_deadline = first ? deadline : std::min(deadline, now + kReconnectWindow);
  const auto window = std::chrono::ceil<milliseconds>(connect_deadline - now);
  auto fd = ConnectUnixSocket(options_.socket, connect_deadline, window);
  if (!fd.ok()) return fail(fd.status());
  auto conn = std::make_shared<Connection>(std::move(fd).value(), ++generation_);
  conn->last_heard_ns = NowNs();
  // The reader starts before the connection is published: once other threads can see it (Close
  // joins its reader), the thread object is never written again.
  conn->reader = std::thread([this, raw = conn.get()] { ReaderLoop(raw); });
  {
    MutexLock lock(mu_);
    if (closed_) return connection_;  // `conn` shuts its reader down as it goes
    conn_ = conn;
    // Calls of other threads keep failing (or waiting for register_mu_) until `ready`.
    connection_ = Unavailable(Lost("reconnecting"));
  }
  old.reset();

  if (Status st = HelloOn(conn, deadline, first); !st.ok()) {
    conn->Shutdown();
    Break(conn.get(), Unavailable(st.message()));
    return fail(st);
  }
  Status stale_registration;
  if (!first && has_registration_) {
    // The new daemon session knows nothing: send the same tensors again, if they still are.
    const std::vector<RegisteredTensor> previous =
        registered_.value_or(std::vector<RegisteredTensor>{});
    registered_.reset();
    registered_flag_ = false;
    const std::vector<HostTensor> host = registered_host_;
    const std::vector<CudaTensor> cuda = registered_cuda_;
    Status st = RegisterLocked(conn, host, cuda, deadline, &previous);
    bool broken;
    {
      MutexLock lock(mu_);
      broken = conn->broken;
    }
    if (!st.ok()) {
      if (!broken && st.code() != StatusCode::kDeadlineExceeded) {
        // The memory changed under the registration: the connection is fine, but this call
        // fails and the caller must register again.
        has_registration_ = false;
        spdlog::warn("ckpt client (job {} rank {}): re-attached, but {}", options_.job,
                     options_.rank, st.message());
        stale_registration =
            FailedPrecondition("re-attached to ckptd at " + options_.socket +
                               ", but the tensors could not be registered again (" + st.message() +
                               "); register them again");
      } else {
        conn->Shutdown();
        Break(conn.get(), Unavailable(st.message()));
        return fail(st.WithContext("re-attach to ckptd at " + options_.socket));
      }
    }
  }
  {
    MutexLock lock(mu_);
    if (closed_) return connection_;
    conn->ready = true;
    connection_ = Status::Ok();
  }
  backoff_ = milliseconds(0);
  if (!first) {
    reattaches_.fetch_add(1);
    spdlog::info("ckpt client (job {} rank {}): re-attached to ckptd at {} (connection {})",
                 options_.job, options_.rank, options_.socket, conn->generation);
  }
  return stale_registration;
}

bool Client::Impl::SendOneWay(const ConnectionPtr& conn, pb::ClientMessage message,
                              Clock::time_point deadline) {
  {
    MutexLock lock(mu_);
    message.set_request_id(next_request_id_++);  // its reply finds no caller and is dropped
  }
  const std::string payload = message.SerializeAsString();
  Connection::SendHold send_lock(conn->send_mu);
  size_t sent = 0;
  Status st = DeadlineExceeded("another request held the socket");
  if (send_lock.TryUntil(deadline)) {
    st = SendFrameUntil(conn->socket.get(), payload, {}, deadline, &sent);
  }
  if (st.ok()) return true;
  conn->Shutdown();
  Break(conn.get(), Unavailable(Lost("could not send a " +
                                     std::string(message.has_abandon() ? "Abandon" : "message") +
                                     " in time: " + st.message())));
  return false;
}

Result<pb::DaemonMessage> Client::Impl::CallAttached(std::vector<OutgoingFrame> frames,
                                                     pb::DaemonMessage::BodyCase expected,
                                                     Limits limits,
                                                     Clock::time_point attach_deadline,
                                                     std::string_view what, ConnectionPtr* used) {
  ConnectionPtr conn;
  Clock::time_point start{};
  auto call = SendAttached(std::move(frames), limits, attach_deadline, what, &conn, &start);
  if (used != nullptr) *used = conn;
  if (!call.ok()) return call.status();
  return Await(conn, *call, expected, limits, start, what);
}

Result<std::shared_ptr<Client::Impl::PendingCall>> Client::Impl::SendAttached(
    std::vector<OutgoingFrame> frames, Limits limits, Clock::time_point attach_deadline,
    std::string_view what, ConnectionPtr* used, Clock::time_point* start) {
  for (int attempt = 0;; ++attempt) {
    ASSIGN_OR_RETURN(*used, Attached(attach_deadline), what);
    const auto began = Clock::now();
    if (start != nullptr) *start = began;
    bool unsent = false;
    auto call = Send(*used, attempt == 0 ? frames : std::move(frames), SendDeadline(limits, began),
                     what, &unsent);
    if (call.ok() || !unsent || attempt == 1) return call;
    // The daemon went away before this request reached it: connect again and make it there.
  }
}

Result<pb::DaemonMessage> Client::Impl::Call(const ConnectionPtr& conn,
                                             std::vector<OutgoingFrame> frames,
                                             pb::DaemonMessage::BodyCase expected, Limits limits,
                                             std::string_view what, bool* unsent) {
  const auto start = Clock::now();
  ASSIGN_OR_RETURN(std::shared_ptr<PendingCall> call,
                   Send(conn, std::move(frames), SendDeadline(limits, start), what, unsent));
  return Await(conn, call, expected, limits, start, what);
}

Result<std::shared_ptr<Client::Impl::PendingCall>> Client::Impl::Send(
    const ConnectionPtr& conn, std::vector<OutgoingFrame> frames, Clock::time_point send_deadline,
    std::string_view what, bool* unsent) {
  const auto start = Clock::now();
  if (unsent != nullptr) *unsent = false;
  auto call = std::make_shared<PendingCall>();
  {
    MutexLock lock(mu_);
    if (closed_) return connection_;
    if (conn->broken) {
      if (unsent != nullptr) *unsent = true;
      return Unavailable(Lost("the connection broke"));
    }
    for (auto& frame : frames) {
      const uint64_t id = next_request_id_++;
      frame.message.set_request_id(id);
      call->ids.push_back(id);
      pending_.emplace(id, call);
    }
  }
  auto forget = [&] {
    MutexLock lock(mu_);
    ForgetLocked(*call);
  };
  // Serialize everything first: nothing is sent when one frame is over the limit.
  std::vector<std::string> payloads(frames.size());
  for (size_t i = 0; i < frames.size(); ++i) {
    if (!frames[i].message.SerializeToString(&payloads[i]) || payloads[i].size() > kMaxFrameBytes) {
      forget();
      return InvalidArgument(
          std::string(what) + ": request of " + std::to_string(payloads[i].size()) +
          " bytes cannot be framed (limit " + std::to_string(kMaxFrameBytes) + ")");
    }
  }
  Connection::SendHold send_lock(conn->send_mu);
  if (!send_lock.TryUntil(send_deadline)) {
    forget();
    return DeadlineExceeded(std::string(what) + " timed out after " +
                            Ms(std::chrono::ceil<milliseconds>(Clock::now() - start)) +
                            ": another request is still being written to ckptd at " +
                            options_.socket);
  }
  size_t total_sent = 0;
  for (size_t i = 0; i < frames.size(); ++i) {
    size_t sent = 0;
    Status st =
        SendFrameUntil(conn->socket.get(), payloads[i], frames[i].fds, send_deadline, &sent);
    total_sent += sent;
    if (st.ok()) continue;
    forget();
    if (st.code() == StatusCode::kDeadlineExceeded && total_sent == 0) {
      // Nothing went out: the stream is intact, the daemon just takes nothing (frozen?).
      return DeadlineExceeded(std::string(what) + " timed out after " + Ms(call_timeout_) +
                              ": ckptd at " + options_.socket + " takes no input");
    }
    // The stream may hold part of a request now: this connection cannot be used any more.
    conn->Shutdown();
    Break(conn.get(), Unavailable(Lost(st.message())));
    if (unsent != nullptr && total_sent == 0) *unsent = true;
    return st.code() == StatusCode::kDeadlineExceeded
               ? DeadlineExceeded(std::string(what) + " timed out after " + Ms(call_timeout_) +
                                  " while writing to ckptd at " + options_.socket)
               : Unavailable(Lost(st.message()));
  }
  return call;
}

Result<pb::DaemonMessage> Client::Impl::Await(const ConnectionPtr& conn,
                                              const std::shared_ptr<PendingCall>& call,
                                              pb::DaemonMessage::BodyCase expected, Limits limits,
                                              Clock::time_point start, std::string_view what,
                                              bool keep_on_deadline) {
  const auto probe_every = std::max(milliseconds(10), call_timeout_ / 4);
  MutexLock lock(mu_);
  while (!call->done && !call->cancelled && !conn->broken && !closed_) {
    const auto now = Clock::now();
    if (limits.deadline && now >= *limits.deadline) {
      if (!keep_on_deadline) ForgetLocked(*call);  // a late reply finds no id and is dropped
      return DeadlineExceeded(std::string(what) + " timed out after " +
                              Ms(std::chrono::ceil<milliseconds>(*limits.deadline - start)) +
                              " waiting for ckptd at " + options_.socket);
    }
    auto wake = limits.deadline.value_or(Clock::time_point::max());
    if (limits.probe) {
      // Silence counts from the later of the call's start and the last frame heard.
      const auto heard =
          std::max(start, Clock::time_point(Clock::duration(conn->last_heard_ns.load())));
      if (now - heard >= call_timeout_) {
        ForgetLocked(*call);
        return DeadlineExceeded(std::string(what) + ": ckptd at " + options_.socket +
                                " answered nothing, not even a liveness probe, for " +
                                Ms(call_timeout_) + " (is it frozen?)");
      }
      const auto pinged = Clock::time_point(Clock::duration(conn->last_ping_ns));
      if (now - std::max(heard, pinged) >= probe_every && conn->ready) {
        conn->last_ping_ns = NowNs();
        lock.Unlock();
        pb::ClientMessage ping;
        ping.mutable_ping();
        SendOneWay(conn, std::move(ping), Clock::now() + probe_every);
        lock.Lock();
        continue;
      }
      wake = std::min({wake, heard + call_timeout_, std::max(heard, pinged) + probe_every});
    }
    if (wake == Clock::time_point::max()) {
      cv_.Wait(mu_);
    } else {
      cv_.WaitUntil(mu_, wake);
    }
  }
  if (!call->done) {
    ForgetLocked(*call);
    if (closed_) return connection_;
    if (call->cancelled) return Status(StatusCode::kCancelled, std::string(what) + ": abandoned");
    return conn == conn_ && !connection_.ok() ? connection_
                                              : Unavailable(Lost("the connection broke"));
  }
  pb::DaemonMessage reply = std::move(call->reply);
  lock.Unlock();
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

void Client::Impl::Break(Connection* conn, Status why) {
  {
    MutexLock lock(mu_);
    if (conn->broken) return;
    conn->broken = true;
    if (conn_.get() == conn && !closed_) {
      spdlog::debug("ckpt client (job {} rank {}): {}", options_.job, options_.rank, why.message());
      connection_ = std::move(why);
    }
  }
  cv_.NotifyAll();
}

void Client::Impl::ReaderLoop(Connection* conn) {
  while (true) {
    auto frame = conn->frames.ReadSome(conn->socket.get());
    if (!frame.ok()) {
      Break(conn, Unavailable(Lost(frame.status().message())));
      return;
    }
    if (!frame->has_value()) continue;  // EAGAIN: not expected on this blocking socket
    conn->last_heard_ns = NowNs();
    pb::DaemonMessage message;
    if (!message.ParseFromString((*frame)->payload)) {
      conn->Shutdown();  // the stream cannot be trusted any more
      Break(conn, Unavailable(Lost("undecodable frame of " +
                                   std::to_string((*frame)->payload.size()) + " bytes")));
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
        conn->Shutdown();
        Break(conn, Unavailable(Lost("ckptd reported: " + message.error().message())));
        return;
      }
      spdlog::warn("ckpt client: ignored an unsolicited message (body {}) from ckptd",
                   static_cast<int>(message.body_case()));
      continue;
    }
    bool delivered = false;
    {
      MutexLock lock(mu_);
      auto it = pending_.find(message.request_id());
      if (it != pending_.end()) {
        std::shared_ptr<PendingCall> call = it->second;
        ForgetLocked(*call);
        call->reply = std::move(message);
        call->done = true;
        delivered = true;
      }
    }
    // Woken also when nothing was delivered: a prober waits for any sign of life.
    cv_.NotifyAll();
    if (!delivered && !message.has_pong() && !message.has_abandon()) {
      spdlog::debug("ckpt client: dropped a reply to request {} (timed out or unknown)",
                    message.request_id());
    }
  }
}

void Client::Impl::OnEvent(const pb::Event& event) {
  spdlog::debug("ckpt client: ckptd event: job {} step {} {}{}{}", event.job(), event.step(),
                StateName(event.state()), event.reason().empty() ? "" : ": ", event.reason());
  MutexLock lock(mu_);
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

Status Client::Impl::HelloOn(const ConnectionPtr& conn, Clock::time_point deadline, bool first) {
  OutgoingFrame frame;
  pb::Hello* hello = frame.message.mutable_hello();
  hello->set_protocol_version(kProtocolVersion);
  hello->set_job(options_.job);
  hello->set_rank(options_.rank);
  hello->set_world_size(options_.world_size);
  hello->set_local_rank(options_.local_rank);
  hello->set_client_version("ckpt-client " CKPT_CLIENT_VERSION);
  hello->set_reattach(first ? 0 : reattaches_.load() + 1);
  std::optional<uint64_t> lost_step;
  {
    MutexLock lock(mu_);
    if (unconfirmed_save_ && unconfirmed_save_->second != conn->generation) {
      lost_step = unconfirmed_save_->first;
      hello->set_lost_step(*lost_step);
    }
  }
  std::vector<OutgoingFrame> frames;
  frames.push_back(std::move(frame));
  const std::string who = "rank " + std::to_string(options_.rank) + " of job " + options_.job;
  auto reply =
      Call(conn, std::move(frames), pb::DaemonMessage::kHello, Limits{deadline, false}, "hello");
  if (!reply.ok()) {
    if (reply.status().code() == StatusCode::kDeadlineExceeded) {
      return DeadlineExceeded("ckptd at " + options_.socket + " accepted " + who +
                              " but did not answer its hello in time (" + reply.status().message() +
                              ")");
    }
    if (reply.status().code() == StatusCode::kFailedPrecondition &&
        reply.status().message().find("protocol") != std::string::npos) {
      return FailedPrecondition("ckptd at " + options_.socket +
                                " refused this client's "
                                "protocol (this client speaks local protocol versions " +
                                std::to_string(kOldestProtocolVersion) + " to " +
                                std::to_string(kProtocolVersion) +
                                "); ckptd said: " + reply.status().message());
    }
    return reply.status().WithContext("connecting " + who + " to ckptd at " + options_.socket);
  }
  const pb::HelloReply& hr = reply->hello();
  if (hr.protocol_version() < kOldestProtocolVersion || hr.protocol_version() > kProtocolVersion) {
    return FailedPrecondition("ckptd " + hr.daemon_version() + " at " + options_.socket +
                              " answered in local protocol version " +
                              std::to_string(hr.protocol_version()) + "; this client speaks " +
                              std::to_string(kOldestProtocolVersion) + " to " +
                              std::to_string(kProtocolVersion));
  }
  {
    MutexLock lock(mu_);
    conn->protocol = hr.protocol_version();
    protocol_.store(hr.protocol_version());
  }
  if (first) node_id_ = hr.node_id();
  if (lost_step) {
    MutexLock lock(mu_);
    if (unconfirmed_save_ && unconfirmed_save_->first == *lost_step) unconfirmed_save_.reset();
  }
  spdlog::debug("ckpt client: {} connected to ckptd {} on node {} (session {}, protocol {})", who,
                hr.daemon_version(), hr.node_id(), hr.session_id(), hr.protocol_version());
  return Status::Ok();
}

Status Client::Impl::Register(std::span<const HostTensor> tensors,
                              std::span<const CudaTensor> cuda) {
  const auto deadline = PromptDeadline();
  MutexLock register_lock(register_mu_);
  ConnectionPtr conn;
  {
    MutexLock lock(mu_);
    if (closed_) return connection_;
    if (connection_.ok()) conn = conn_;
  }
  if (conn == nullptr) {
    // A stale registration (kFailedPrecondition with the connection up) is what this call
    // replaces anyway.
    Status st = ReattachLocked(deadline, /*first=*/false);
    if (!st.ok() && st.code() != StatusCode::kFailedPrecondition) return st;
    MutexLock lock(mu_);
    if (!connection_.ok()) return connection_;
    conn = conn_;
  }
  Status st = RegisterLocked(conn, tensors, cuda, deadline, nullptr);
  if (st.ok()) {
    registered_host_.assign(tensors.begin(), tensors.end());
    registered_cuda_.assign(cuda.begin(), cuda.end());
    has_registration_ = true;
  }
  return st;
}

Status Client::Impl::RegisterLocked(const ConnectionPtr& conn, std::span<const HostTensor> tensors,
                                    std::span<const CudaTensor> cuda, Clock::time_point deadline,
                                    const std::vector<RegisteredTensor>* must_match) {
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
                                        {},
                                        t.partial});
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
          e.vmm ? "vmm:" + std::to_string(identity.size()) : e.device_uuid + e.ipc_handle,
          t.partial});
      exports.push_back(std::move(e));
    }
  }
  bool has_vmm = false;
  for (const auto& e : exports) has_vmm |= e.vmm;
  // The daemon has this set (VMM fds are fresh objects each time: always sent).
  if (must_match != nullptr && !SameMemory(identity, *must_match)) {
    return FailedPrecondition(
        "their descriptors no longer refer to the memory registered before the connection broke "
        "(closed or reused)");
  }
  if (must_match == nullptr && !has_vmm && registered_ && *registered_ == identity) {
    return Status::Ok();
  }

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
    spec.set_partial(t.partial);
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
  registered_flag_ = false;
  auto reply = Call(conn, std::move(frames), pb::DaemonMessage::kRegister, Limits{deadline, false},
                    "register of " + std::to_string(tensors.size() + cuda.size()) + " tensors");
  // (the exported VMM fds in `exports` were sent, duplicated by the kernel; they close here)
  if (!reply.ok()) return reply.status();
  registered_ = std::move(identity);
  registered_flag_ = true;
  {
    MutexLock lock(mu_);
    cuda_devices_ = std::move(devices);
  }
  spdlog::debug("ckpt client: registered {} tensors ({} bytes) in {} frames{}",
                reply->register_().tensors(), reply->register_().bytes(), frame_count,
                reply->register_().unchanged() ? "; unchanged" : "");
  return Status::Ok();
}

Status Client::Impl::Save(uint64_t step, const SaveOptions& options) {
  const CudaStream stream = options.stream;
  const std::string what = "save of step " + std::to_string(step);
  if (options.post && options.replace_held) {
    // Until the daemon answers, the held save it replaces must stay known (to be confirmed if
    // the replacement is refused): a replacement waits for its answer.
    return InvalidArgument(what + ": a replacement of a held save cannot be posted");
  }
  MutexLock post_lock(post_mu_);
  if (Status st = TakePosted(Clock::now() + call_timeout_); !st.ok()) {
    // A save is answered before the next one goes out, as if it had waited for its answer.
    return Status(st.code(), what + " not sent: " + st.message());
  }
  // This save's own time starts once the one before it is answered.
  const auto deadline = Clock::now() + call_timeout_;
  {
    // One held save at a time: the daemon would read nothing of an older one until it ends.
    MutexLock lock(mu_);
    if (held_save_ && !held_save_->conn->broken &&
        !(options.replace_held && held_save_->step == step)) {
      return FailedPrecondition(what + ": step " + std::to_string(held_save_->step) +
                                " is held (SaveOptions::hold); confirm or replace it first");
    }
    if (options.replace_held && (!held_save_ || held_save_->step != step)) {
      return FailedPrecondition(what + ": no save of it is held to replace");
    }
    // A held save stays known until its replacement is accepted (or the step is abandoned).
    if (held_save_ && held_save_->conn->broken) held_save_.reset();
  }
  RETURN_IF_ERROR(Attached(deadline).status(), what);  // re-registers after a re-attach
  OutgoingFrame frame;
  pb::Save* save = frame.message.mutable_save();
  save->set_step(step);
  std::map<int, std::string> devices;
  {
    MutexLock lock(mu_);
    devices = cuda_devices_;
  }
  if (!devices.empty()) {
    // Record first, send after: the daemon's wait must see this record (a wait on an event not
    // yet recorded returns at once).
    ASSIGN_OR_RETURN(detail::CudaExporter * exporter, detail::CudaExporter::Get(), what);
    for (const auto& [ordinal, uuid] : devices) {
      ASSIGN_OR_RETURN(std::string handle, exporter->RecordSaveEvent(ordinal, stream), what);
      pb::CudaEvent* e = save->add_cuda_events();
      e->set_device_uuid(uuid);
      e->set_ipc_event_handle(std::move(handle));
    }
  }
  save->set_extra(std::string(options.extra));
  save->set_on_full(options.on_full == OnFull::kSkip ? pb::FULL_POLICY_SKIP : pb::FULL_POLICY_WAIT);
  save->set_memory_only(!options.persist);
  save->set_hold(options.hold);
  save->set_replace_held(options.replace_held);
  if (options.held != nullptr) *options.held = false;
  {
    // From here on, what is known of this step number comes from this save (WaitSnapshot
    // trusts the step's events); an older save's record would be stale.
    MutexLock lock(mu_);
    events_.erase(step);
  }
  std::vector<OutgoingFrame> frames;
  frames.push_back(std::move(frame));
  ConnectionPtr conn;
  if (!options.post) {
    auto reply = CallAttached(std::move(frames), pb::DaemonMessage::kSave, Limits{deadline, false},
                              deadline, what, &conn);
    return FinishSave(step, what, conn, std::move(reply), options.held, /*posted=*/false);
  }
  // Posted: written, and answered later (TakePosted).
  auto call = SendAttached(std::move(frames), Limits{deadline, false}, deadline, what, &conn);
  if (!call.ok()) return FinishSave(step, what, conn, call.status(), options.held, false);
  MutexLock lock(mu_);
  // Whatever becomes of it, this rank does not save the step again (Hello.lost_step).
  unconfirmed_save_.emplace(step, conn->generation);
  const bool held = options.hold && conn->protocol >= 3;
  if (options.held != nullptr) *options.held = held;
  // Held from now on, for ConfirmSave; a refusal taken later ends it.
  held_save_.reset();
  if (held) held_save_ = HeldSave{step, conn};
  // Its answer is awaited for call_timeout from the moment it is written.
  const auto sent = Clock::now();
  posted_ =
      std::make_shared<PostedSave>(PostedSave{step, what, *call, conn, sent, sent + call_timeout_});
  return Status::Ok();
}

Status Client::Impl::FinishSave(uint64_t step, const std::string& what, const ConnectionPtr& conn,
                                Result<pb::DaemonMessage> reply, bool* held, bool posted) {
  {
    // Whatever became of it, this rank does not save the step again: if the connection breaks,
    // the next re-attach says so (Hello.lost_step).
    MutexLock lock(mu_);
    if (!posted) unconfirmed_save_.emplace(step, conn != nullptr ? conn->generation : 0);
    if (posted && (!reply.ok() || reply->save().skipped()) && held_save_ &&
        held_save_->step == step && held_save_->conn == conn) {
      held_save_.reset();  // refused: nothing is held (a confirm sent meanwhile is ignored)
    }
  }
  if (!reply.ok()) {
    if (conn == nullptr) return reply.status();
    if (reply.status().code() == StatusCode::kDeadlineExceeded) {
      // The daemon may still accept it later, while the trainer goes on changing the memory.
      pb::ClientMessage abandon;
      abandon.mutable_abandon()->set_step(step);
      abandon.mutable_abandon()->set_reason("its save timed out in the client");
      bool v1;
      {
        MutexLock lock(mu_);
        v1 = conn->protocol < 2;
      }
      if (v1 || !SendOneWay(conn, std::move(abandon), Clock::now() + milliseconds(100))) {
        conn->Shutdown();
        Break(conn.get(), Unavailable(Lost("abandoned after a save timed out")));
      }
    }
    return reply.status();
  }
  if (reply->save().skipped()) {
    // on_full = skip and the pool had no room: nothing of this step is saved.
    return Status(StatusCode::kResourceExhausted, what + " " + reply->save().reason());
  }
  if (held != nullptr) *held = reply->save().held();
  MutexLock lock(mu_);
  last_saved_step_ = step;
  last_saved_generation_ = conn->generation;
  if (!posted) {
    held_save_.reset();  // none, or replaced by this save
    if (reply->save().held()) held_save_ = HeldSave{step, conn};
  }
  return Status::Ok();
}

Status Client::Impl::TakePosted(std::optional<Clock::time_point> deadline, bool* outstanding) {
  if (outstanding != nullptr) *outstanding = false;
  std::shared_ptr<PostedSave> posted;
  {
    MutexLock lock(mu_);
    posted = posted_;
  }
  if (posted == nullptr) return Status::Ok();
  const bool own_deadline = !deadline || posted->deadline <= *deadline;
  auto reply = Await(posted->conn, posted->call, pb::DaemonMessage::kSave,
                     Limits{own_deadline ? posted->deadline : *deadline, false}, posted->start,
                     posted->what, /*keep_on_deadline=*/!own_deadline);
  if (!own_deadline && !reply.ok() && reply.status().code() == StatusCode::kDeadlineExceeded) {
    if (outstanding != nullptr) *outstanding = true;
    return reply.status();  // the caller's time is up, not the save's: it stays outstanding
  }
  {
    MutexLock lock(mu_);
    if (posted_ != posted) return Status::Ok();  // abandoned meanwhile: its answer is moot
    posted_.reset();
  }
  Status st = FinishSave(posted->step, posted->what, posted->conn, std::move(reply), nullptr,
                         /*posted=*/true);
  // The daemon's refusals name the step; a broken connection does not.
  if (st.code() == StatusCode::kUnavailable) return st.WithContext(posted->what);
  return st;
}

Status Client::Impl::ConfirmSave(uint64_t step) {
  ConnectionPtr conn;
  {
    MutexLock lock(mu_);
    if (closed_) return Status(StatusCode::kCancelled, "the client is closed");
    if (!held_save_ || held_save_->step != step) {
      return FailedPrecondition("confirm of step " + std::to_string(step) +
                                ": no save of it is held");
    }
    conn = held_save_->conn;
    held_save_.reset();
    if (conn->broken) {
      return Unavailable("confirm of step " + std::to_string(step) + ": " +
                         Lost("the connection broke after the save, which aborted the step"));
    }
  }
  pb::ClientMessage confirm;
  confirm.mutable_confirm_save()->set_step(step);
  if (!SendOneWay(conn, std::move(confirm), Clock::now() + call_timeout_)) {
    return Unavailable("confirm of step " + std::to_string(step) + ": " +
                       Lost("it could not be sent in time"));
  }
  return Status::Ok();
}

Status Client::Impl::Abandon(std::optional<uint64_t> step, std::string_view reason) {
  ConnectionPtr conn;  // stays null when no Abandon needs to go out
  uint32_t protocol = 0;
  bool cancelled_posted = false;
  {
    MutexLock lock(mu_);
    if (posted_ && (!step || *step == posted_->step)) {
      step = posted_->step;  // the most recent save, its answer not taken: it no longer matters
      ForgetLocked(*posted_->call);
      posted_->call->cancelled = true;  // a thread taking it returns once woken, below
      posted_.reset();
      cancelled_posted = true;
    }
    if (!step) step = last_saved_step_;
    if (step) {
      if (last_saved_step_ == step) last_saved_step_.reset();
      if (held_save_ && held_save_->step == *step) held_save_.reset();  // aborted, never confirmed
      // A broken connection already aborted every step of this rank that was not captured.
      if (!closed_ && connection_.ok() && conn_ != nullptr) {
        conn = conn_;
        protocol = conn->protocol;
      }
    }
  }
  if (cancelled_posted) cv_.NotifyAll();
  if (conn == nullptr) return Status::Ok();
  if (protocol >= 2) {
    pb::ClientMessage abandon;
    abandon.mutable_abandon()->set_step(*step);
    abandon.mutable_abandon()->set_reason(std::string(reason));
    // Not written at once, SendOneWay shuts the connection down: the step is aborted all the same.
    SendOneWay(conn, std::move(abandon), Clock::now() + std::min(call_timeout_, milliseconds(100)));
    return Status::Ok();
  }
  // A protocol 1 daemon has no Abandon: ending the connection aborts the step just as well.
  conn->Shutdown();
  Break(conn.get(), Unavailable(Lost("step " + std::to_string(*step) + " abandoned")));
  return Status::Ok();
}

Status Client::Impl::WaitSnapshot(std::optional<milliseconds> timeout) {
  const auto start = Clock::now();
  // A posted save's refusal is this fence's answer — once the save before it, which the trainer
  // may not have fenced, is captured: the refused step reads nothing, but that one may still.
  Status refusal;
  {
    MutexLock post_lock(post_mu_);
    bool outstanding = false;
    refusal = TakePosted(timeout ? std::optional(start + *timeout) : std::nullopt, &outstanding);
    if (outstanding) return refusal;  // the fence's time is up before the answer came
  }
  RETURN_IF_ERROR(WaitForLastSave(start, timeout));
  return refusal;
}

Status Client::Impl::WaitForLastSave(Clock::time_point start, std::optional<milliseconds> timeout) {
  std::optional<uint64_t> step;
  ConnectionPtr conn;
  {
    MutexLock lock(mu_);
    step = last_saved_step_;
    if (closed_) return connection_;
    if (!step && !connection_.ok()) return Status::Ok();  // nothing saved here: memory is free
    if (step &&
        (conn_ == nullptr || conn_->generation != last_saved_generation_ || !connection_.ok())) {
      // Saved on a connection that broke: this daemon session never saw it.
      last_saved_step_.reset();
      return Unavailable("step " + std::to_string(*step) + " of job " + options_.job +
                         " was saved on a connection to ckptd at " + options_.socket +
                         " that broke before its capture was confirmed; it commits only if that "
                         "daemon had captured it (" +
                         connection_.message() + ")");
    }
    conn = conn_;
    if (step) {
      // The daemon already said how the step went (events of this connection's steps): no need
      // to ask — a daemon frozen right after the capture must not make a safe step look lost.
      auto it = events_.find(*step);
      if (it != events_.end()) {
        switch (it->second.state) {
          case pb::STEP_STATE_CAPTURED:
          case pb::STEP_STATE_PERSISTING:
          case pb::STEP_STATE_PERSISTED:
          case pb::STEP_STATE_COMMITTED:
            return Status::Ok();
          default:
            break;
        }
      }
    }
  }
  const std::string what =
      step ? "wait_snapshot for step " + std::to_string(*step) + " of job " + options_.job
           : "wait_snapshot (no save yet) of job " + options_.job;
  OutgoingFrame frame;
  frame.message.mutable_wait_snapshot();
  std::vector<OutgoingFrame> frames;
  frames.push_back(std::move(frame));
  Limits limits{std::nullopt, true};
  if (timeout) limits.deadline = start + *timeout;
  auto reply = Call(conn, std::move(frames), pb::DaemonMessage::kWait, limits, what);
  if (!reply.ok()) {
    if (reply.status().code() == StatusCode::kDeadlineExceeded && step) {
      MutexLock lock(mu_);
      return DeadlineExceeded(reply.status().message() + LastStateLocked(*step));
    }
    return reply.status();
  }
  const pb::StepState state = reply->wait().state();
  if (state == pb::STEP_STATE_ABORTED || state == pb::STEP_STATE_FAILED) {
    MutexLock lock(mu_);
    return Aborted("step " + std::to_string(reply->wait().step()) + " of job " + options_.job +
                   " is " + StateName(state) + LastStateLocked(reply->wait().step()));
  }
  return Status::Ok();
}

Status Client::Impl::Wait(uint64_t step, WaitState state, std::optional<milliseconds> timeout) {
  const auto start = Clock::now();
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
    case WaitState::kReplicated:
      wait->set_state(pb::STEP_STATE_REPLICATED);
      state_name = "replicated";
      break;
  }
  const std::string what =
      "wait for step " + std::to_string(step) + " of job " + options_.job + " to be " + state_name;
  Limits limits{std::nullopt, true};
  if (timeout) limits.deadline = start + *timeout;
  const auto attach_deadline =
      limits.deadline ? std::min(*limits.deadline, start + call_timeout_) : start + call_timeout_;
  std::vector<OutgoingFrame> frames;
  frames.push_back(std::move(frame));
  auto reply =
      CallAttached(std::move(frames), pb::DaemonMessage::kWait, limits, attach_deadline, what);
  if (!reply.ok()) {
    if (reply.status().code() == StatusCode::kDeadlineExceeded) {
      MutexLock lock(mu_);
      return DeadlineExceeded(reply.status().message() + LastStateLocked(step));
    }
    return reply.status();
  }
  const pb::StepState reached = reply->wait().state();
  if (reached == pb::STEP_STATE_ABORTED || reached == pb::STEP_STATE_FAILED) {
    MutexLock lock(mu_);
    return Aborted("step " + std::to_string(step) + " of job " + options_.job + " is " +
                   StateName(reached) + LastStateLocked(step));
  }
  return Status::Ok();
}

Result<std::optional<uint64_t>> Client::Impl::Latest(bool restore_point) {
  const auto deadline = PromptDeadline();
  const std::string what =
      (restore_point ? "restore point of job " : "latest of job ") + options_.job;
  OutgoingFrame frame;
  frame.message.mutable_latest()->set_restore_point(restore_point);
  std::vector<OutgoingFrame> frames;
  frames.push_back(std::move(frame));
  auto reply = CallAttached(std::move(frames), pb::DaemonMessage::kLatest, Limits{deadline, false},
                            deadline, what);
  if (!reply.ok()) return reply.status();
  if (!reply->latest().has_step()) return std::optional<uint64_t>();
  return std::optional<uint64_t>(reply->latest().step());
}

Result<LoadResult> Client::Impl::Load(const LoadOptions& options) {
  const std::optional<uint64_t> step = options.step;
  const CudaStream stream = options.stream;
  const std::string& job = options.job.empty() ? options_.job : options.job;
  const std::string what = step ? "load of step " + std::to_string(*step) + " of job " + job
                                : "load of the latest step of job " + job;
  OutgoingFrame frame;
  pb::Load* load = frame.message.mutable_load();
  load->set_has_step(step.has_value());
  load->set_step(step.value_or(0));
  load->set_strict(options.strict);
  if (!options.job.empty() && options.job != options_.job) load->set_job(options.job);
  std::vector<OutgoingFrame> frames;
  frames.push_back(std::move(frame));
  // As long as it takes (reading storage), while the daemon answers probes.
  auto reply = CallAttached(std::move(frames), pb::DaemonMessage::kLoad, Limits{std::nullopt, true},
                            PromptDeadline(), what);
  if (!reply.ok()) return reply.status();
  const pb::LoadReply& lr = reply->load();
  LoadResult result;
  result.step = lr.step();
  result.extra = lr.extra();
  result.extra_rank = lr.extra_rank();
  result.saved_world_size = lr.saved_world_size();
  result.bytes_from_memory = lr.bytes_from_memory();
  result.bytes_from_storage = lr.bytes_from_storage();
  result.bytes_from_peers = lr.bytes_from_peers();
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
  MutexLock close_lock(close_mu_);
  ConnectionPtr conn;
  {
    MutexLock lock(mu_);
    if (closed_) return;
    closed_ = true;
    posted_.reset();
    connection_ = Status(StatusCode::kCancelled, "connection to ckptd at " + options_.socket +
                                                     " was closed by Client::Close()");
    conn = std::move(conn_);
  }
  cv_.NotifyAll();
  // A sender may be blocked in sendmsg holding send_mu; the shutdown wakes it (EPIPE) as well as
  // the reader (EOF). The reader is joined when the last reference to the connection goes.
  if (conn != nullptr) {
    conn->Shutdown();
    if (conn->reader.joinable()) conn->reader.join();
  }
}

Result<std::unique_ptr<Client>> Client::Connect(ClientOptions options) {
  RETURN_IF_ERROR(ValidateJobName(options.job), "ckpt client options");
  if (options.world_size == 0 || options.rank >= options.world_size) {
    return InvalidArgument("ckpt client options: rank " + std::to_string(options.rank) +
                           " is not below world_size " + std::to_string(options.world_size));
  }
  if (options.call_timeout.count() < 0) {
    return InvalidArgument("ckpt client options: call_timeout must not be negative");
  }
  auto impl = std::make_unique<Impl>(std::move(options));
  RETURN_IF_ERROR(impl->Connect());
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
  return impl_->Save(step, SaveOptions{extra, on_full, nullptr, true});
}
Status Client::Save(uint64_t step, std::string_view extra, OnFull on_full, CudaStream stream) {
  return impl_->Save(step, SaveOptions{extra, on_full, stream, true});
}
Status Client::Save(uint64_t step, const SaveOptions& options) {
  return impl_->Save(step, options);
}
Status Client::ConfirmSave(uint64_t step) { return impl_->ConfirmSave(step); }
Status Client::WaitSnapshot(std::optional<milliseconds> timeout) {
  return impl_->WaitSnapshot(timeout);
}
Status Client::Wait(uint64_t step, WaitState state, std::optional<milliseconds> timeout) {
  return impl_->Wait(step, state, timeout);
}
Result<std::optional<uint64_t>> Client::Latest() { return impl_->Latest(false); }
Result<std::optional<uint64_t>> Client::RestorePoint() { return impl_->Latest(true); }
Result<LoadResult> Client::Load(std::optional<uint64_t> step, bool strict) {
  return impl_->Load(LoadOptions{step, strict, {}, nullptr});
}
Result<LoadResult> Client::Load(std::optional<uint64_t> step, bool strict, CudaStream stream) {
  return impl_->Load(LoadOptions{step, strict, {}, stream});
}
Result<LoadResult> Client::Load(const LoadOptions& options) { return impl_->Load(options); }
Status Client::Abandon(std::optional<uint64_t> step, std::string_view reason) {
  return impl_->Abandon(step, reason);
}
void Client::Close() { impl_->Close(); }
const std::string& Client::node_id() const { return impl_->node_id(); }
std::chrono::milliseconds Client::call_timeout() const { return impl_->call_timeout(); }
bool Client::registered() const { return impl_->registered(); }
uint32_t Client::reattaches() const { return impl_->reattaches(); }
uint32_t Client::protocol() const { return impl_->protocol(); }

}  // namespace ckpt
