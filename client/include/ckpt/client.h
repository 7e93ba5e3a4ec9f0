// ckpt::Client — the trainer's side of the local data plane (docs/design.md §1–§3).
//
// A trainer rank connects to its node's daemon over a Unix stream socket, registers its tensors
// once (names, dtype, global shape, shard geometry and a file descriptor of the host memory that
// holds the shard's bytes), and then, once per checkpoint:
//
//   client->Save(step);          // returns once the daemon accepted the request (microseconds)
//   ... forward / backward ...   // the daemon copies the registered memory in the background
//   client->WaitSnapshot();      // before the next optimizer step: the bytes are captured
//   optimizer step               // now the memory may change again
//
// Wait(step, kCommitted) blocks until the checkpoint is durable everywhere; Latest() and Load()
// restore from the daemon's host memory or from storage.
//
// GPU tensors (CudaTensor) go the same way without a copy by the trainer: Register hands the
// daemon CUDA IPC handles (or VMM fds), Save(step, extra, on_full, stream) records an event on the
// trainer's stream first so the daemon's copies follow the pending writes without any host
// synchronize, and Load(step, strict, stream) orders the stream after the daemon's H2D copies
// (proto/README.md §3).
//
// The wire protocol is proto/ckptd/v1/local.proto; this header exposes none of its types.
//
// Thread safety: every method of Client may be called from any thread, concurrently, except the
// destructor (no other call may be running or start while it runs). Calls that wait for the
// daemon do not hold each other up: each request carries its own id and a single reader thread
// hands each reply to its caller. Concurrent Register calls are serialized; a Register's frames
// are never interleaved with other requests.
//
// Errors: ckpt::Status / ckpt::Result<T>. A request the daemon refuses returns the daemon's
// code and message unchanged. After Close(), calls return kCancelled.
//
// A sick daemon never stalls the caller for long (proto/README.md, "Deadlines and re-attach"):
//   * every prompt call (Connect's hello, Register, Save, Latest, Abandon) gives up after
//     ClientOptions::call_timeout with kDeadlineExceeded naming the call and the socket; the
//     client stays usable and drops the late reply. A Save that timed out is abandoned (the
//     daemon never commits it: the trainer will modify the memory); a posted Save
//     (SaveOptions::post) returns at once, and the WaitSnapshot or Save that takes its answer
//     reports and abandons it instead;
//   * Wait, WaitSnapshot and Load keep their own timeouts, but fail with kDeadlineExceeded when
//     the daemon has answered nothing — not even a liveness probe — for call_timeout;
//   * when the connection breaks (daemon killed, restarted, upgraded), every call waiting on it
//     returns kUnavailable "connection to ckptd at <socket> lost: ..."; the next call connects
//     again, re-registers the registered tensors (their descriptors must still be open and refer
//     to the same memory, else kFailedPrecondition asks for a new Register) and proceeds. Steps
//     in flight at the break commit only if the old daemon had captured them; committed steps
//     are untouched. While the daemon stays unreachable, re-attach attempts back off (up to 5 s)
//     and calls in between fail at once with kUnavailable.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/status.h"

namespace ckpt {

// How to reach the daemon and who this process is. Copied into the Client by Connect.
struct ClientOptions {
  // Path of the daemon's Unix socket (ckptd --socket).
  std::string socket = "/run/ckptd/ckptd.sock";
  // Job id: 1–128 bytes of [A-Za-z0-9._-]; it names the job's directory in storage.
  std::string job;
  uint32_t rank = 0;        // global rank, < world_size
  uint32_t world_size = 1;  // ranks in the job
  uint32_t local_rank = 0;  // rank on this node
  // How long Connect keeps retrying while the daemon is not (yet) listening, including the
  // hello exchange.
  std::chrono::milliseconds connect_timeout{10000};
  // The deadline of every prompt call, and how long a waiting call tolerates a daemon that
  // answers nothing. 0: the environment's CKPTD_CALL_TIMEOUT (seconds), else 10 s.
  std::chrono::milliseconds call_timeout{0};
};

// Options for this process as its launcher (torchrun, Slurm, Open MPI) describes it: job, rank,
// world size and local rank (the rank when the launcher gives none) from the environment
// (launch_env.h says which variables); the socket as given. kInvalidArgument naming the
// variables it looked for when no launcher is found or no job name (set CKPTD_JOB) is known.
Result<ClientOptions> ClientOptionsFromEnvironment(std::string socket = "/run/ckptd/ckptd.sock");

// One shard of a tensor living in host memory reachable through a file descriptor (a memfd,
// a POSIX shm fd — what PyTorch's share_memory_() uses — or any mmap-able fd).
//
// Ownership and lifetime: `fd` stays owned by the caller; Register sends a duplicate of it to
// the daemon (SCM_RIGHTS) and never closes it. Keep it open while the tensor is registered if the
// client should re-register by itself after a daemon restart (it re-sends the same descriptor). The
// memory behind the fd must stay alive and must not be modified between Save and the end of the
// WaitSnapshot that follows it.
struct HostTensor {
  std::string name;                    // fully qualified name, e.g. "layers.0.attn.wq.weight"
  std::string dtype;                   // PyTorch name: "float32", "bfloat16", "int32", ...
  std::vector<uint64_t> global_shape;  // shape of the whole (unsharded) tensor; {} for a scalar
  bool flat = false;                   // false: a box shard; true: a flat-range shard
  // Box shard: offsets[d] .. offsets[d]+lengths[d] along each dimension. Both empty = the
  // whole tensor.
  std::vector<uint64_t> offsets, lengths;
  // Flat shard: elements [flat_offset, flat_offset+numel) of the row-major flattened tensor.
  uint64_t flat_offset = 0, numel = 0;
  int fd = -1;             // host memory; owned by the caller
  uint64_t fd_offset = 0;  // where the shard's bytes start inside what the fd maps
  uint64_t nbytes = 0;     // the shard's size: its element count times the dtype's size
  // The job saves this tensor in part on purpose: a step commits even though the ranks' shards
  // leave parts of it uncovered. Without it, a step whose shards do not cover every tensor fails
  // at commit (naming the tensor and the first uncovered element) — never at restore.
  bool partial = false;
};

// One shard of a tensor living in CUDA device memory of this process (docs/design.md §3). Geometry
// fields as in HostTensor. The client finds the allocation holding `device_ptr` and hands the
// daemon a CUDA IPC handle of its base (cudaMalloc memory) or a VMM POSIX fd (cuMemCreate memory
// exportable as a POSIX fd, e.g. PyTorch expandable segments), with the GPU's UUID; the daemon
// copies from the GPU directly. No CUDA runtime is linked: the driver is loaded on first use.
//
// Lifetime: the allocation must stay alive and unmodified between Save and the end of the
// following WaitSnapshot (as for host memory); re-register after freeing it.
struct CudaTensor {
  std::string name;
  std::string dtype;
  std::vector<uint64_t> global_shape;
  bool flat = false;
  std::vector<uint64_t> offsets, lengths;
  uint64_t flat_offset = 0, numel = 0;
  const void* device_ptr = nullptr;  // first byte of the shard in device memory
  uint64_t nbytes = 0;
  bool partial = false;  // as HostTensor::partial
};

// A CUDA stream of the trainer (a CUstream / cudaStream_t, e.g. PyTorch's
// torch.cuda.current_stream().cuda_stream), or nullptr for the legacy default stream.
using CudaStream = void*;

// States that Wait can wait for (docs/design.md §2.1): this rank's bytes are in the daemon's host
// memory; the node's data is durable in storage; the checkpoint is globally committed.
// kReplicated: every rank's bytes are held in memory by its node and its `--replicas` holders
// (the peer-memory tier); a step may be replicated before or after it is committed.
enum class WaitState { kCaptured, kPersisted, kCommitted, kReplicated };

// What the daemon does when a capture does not fit into its host pool: wait for space (the
// following WaitSnapshot then waits too), or skip this checkpoint (the step fails with
// reason "skipped").
enum class OnFull { kWait, kSkip };

struct LoadResult {
  uint64_t step = 0;                 // the step that was loaded
  std::string extra;                 // this rank's opaque blob passed to Save, or see extra_rank
  uint32_t extra_rank = 0;           // whose blob `extra` is: this rank's, or for a rank beyond
                                     // the saved world (the job grew) rank % saved_world_size
  uint32_t saved_world_size = 0;     // how many ranks saved the step
  uint64_t bytes_from_memory = 0;    // served from the daemon's host memory (hot restore)
  uint64_t bytes_from_storage = 0;   // read from storage
  uint64_t bytes_from_peers = 0;     // read by other nodes' daemons and sent to this one (a
                                     // cold load across nodes); bytes_from_storage then also
                                     // counts what this load read from storage to serve others
  std::vector<std::string> missing;  // non-strict loads: registered tensors not in the step
};

// Everything a save can be asked for; Save(step, extra, on_full[, stream]) is the common case.
struct SaveOptions {
  std::string_view extra;  // this rank's opaque blob, given back by Load
  OnFull on_full = OnFull::kWait;
  CudaStream stream = nullptr;  // as in Save(step, extra, on_full, stream)
  // false: a memory-only step — captured and replicated into other daemons' memory (the
  // daemon's --replicas), never written to storage. It ends kReplicated (Wait(step,
  // kReplicated)), or fails when it could not be replicated; waits for kPersisted or
  // kCommitted fail with kFailedPrecondition. Every rank must save a step the same way.
  bool persist = true;
  // A held save (daemon protocol 3): the daemon accepts the step but reads none of the memory
  // until ConfirmSave(step), or until a Save of the same step with replace_held replaces it.
  // For bindings that verify their registration off the trainer's path (the Python client's
  // layout check): the save returns at once, the check runs meanwhile, and only memory that
  // passed it is read. Until it is confirmed, a held save is not captured: WaitSnapshot waits,
  // and closing the connection aborts the step. An older daemon ignores `hold` and starts the
  // capture at once: `held`, when set, receives whether the daemon holds the save.
  bool hold = false;
  bool replace_held = false;  // replaces this client's held save of the step (registered anew)
  bool* held = nullptr;
  // A posted save: Save returns once the request is written to the socket, without waiting for
  // the daemon's answer (the daemon reads a session's requests in order, so nothing sent after
  // it overtakes it). The answer is taken by the next Save or WaitSnapshot, and a refusal —
  // anything Save would have returned: a step that is not newer, a storage stall that skipped
  // it, a daemon silent for call_timeout (the step is then abandoned) — is returned there,
  // naming the step. A save costs the trainer one write instead of three thread wake-ups;
  // waiting for the answer is left to the fence, which waits anyway. `held`, when set,
  // receives whether the daemon will hold the save (hold with a protocol 3 daemon). Not with
  // replace_held (kInvalidArgument): the held save it replaces stays known until it answers.
  bool post = false;
};

// Everything a load can be asked for; Load(step, strict[, stream]) is the common case.
struct LoadOptions {
  std::optional<uint64_t> step;  // nullopt: the newest committed step
  bool strict = true;            // a registered tensor missing from the step is an error
  // Whose checkpoint: empty = this client's job. Another job (e.g. a fine-tuning run starting
  // from a pretraining job's checkpoint) only when the daemon's shared-jobs setting lists it;
  // otherwise kPermissionDenied naming both jobs.
  std::string job;
  CudaStream stream = nullptr;  // as in Load(step, strict, stream)
};

class Client {
 public:
  // Connects to options.socket, retrying while the socket does not exist or refuses
  // connections, and introduces this rank (job, rank, world_size, local_rank).
  // Errors: kInvalidArgument for bad options (job name, rank >= world_size, socket path too
  // long); kUnavailable when nothing listens there within connect_timeout; kDeadlineExceeded
  // when the daemon accepted but did not answer the hello in time; the daemon's own error when
  // it refuses this rank (e.g. a world_size that disagrees with the job's other ranks).
  static Result<std::unique_ptr<Client>> Connect(ClientOptions options);

  // Closes the connection (see Close). No other call may be running or start meanwhile.
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Replaces this rank's registered tensors with `tensors` and returns when the daemon has
  // opened every handle. Checks each tensor first (valid name and dtype, fd open, nbytes equal
  // to the shard's element count times the dtype size, the byte range inside the fd's file):
  // kInvalidArgument naming the tensor otherwise. Registering the same set again (same names,
  // dtypes, shapes, geometry, the same files by device+inode, offsets and sizes) sends nothing
  // and returns OK at once. Large sets travel as several frames; this is invisible here.
  // The caller keeps ownership of every fd; they may be closed once this returns.
  Status Register(std::span<const HostTensor> tensors);
  // Host and CUDA tensors together (one registration replaces the previous one). CUDA tensors
  // are exported on every call (cheap; the daemon's cache reuses what it already opened).
  // Errors for CUDA tensors: kUnavailable without a usable driver, kInvalidArgument for memory
  // that is not this process's device memory or cannot be shared, and the daemon's errors
  // (kNotFound for a GPU the daemon cannot see, kFailedPrecondition for a stale handle,
  // kResourceExhausted when the daemon runs out of GPU memory mapping it).
  Status Register(std::span<const HostTensor> host, std::span<const CudaTensor> cuda);

  // Asks the daemon to checkpoint `step` from the registered memory. Returns once the request is
  // accepted (or, posted, written: SaveOptions::post) — not when the bytes are copied. `extra` is
  // this rank's opaque blob (RNG state, data loader position), given back by Load. Errors: the
  // daemon's (e.g. kFailedPrecondition when nothing is registered or the step is not newer than the
  // last one); with OnFull::kSkip, kResourceExhausted "…skipped…" when the daemon's pool had no
  // room and the step was skipped (the memory may be modified at once).
  Status Save(uint64_t step, std::string_view extra = {}, OnFull on_full = OnFull::kWait);
  // With CUDA tensors registered: records an interprocess event on `stream` (on each GPU the
  // registered tensors live on; a stream of another GPU is replaced by that GPU's legacy default
  // stream) before sending the request, so the daemon's copies run after every write already
  // enqueued there — no host synchronize. Without CUDA tensors, `stream` is ignored.
  Status Save(uint64_t step, std::string_view extra, OnFull on_full, CudaStream stream);
  // The general form (a memory-only step, see SaveOptions).
  Status Save(uint64_t step, const SaveOptions& options);

  // Lets the daemon read the held save of `step` (SaveOptions::hold). Returns once the request
  // is in the socket, never waiting for the daemon; a step that ended meanwhile is left alone.
  // kUnavailable when the connection broke since the save (which aborted the held step).
  Status ConfirmSave(uint64_t step);

  // Waits until this rank's most recent Save is captured: after OK the saved memory may be
  // modified again. Errors: the step's failure reason from the daemon (e.g. kAborted,
  // kResourceExhausted for a skipped step); a posted save's refusal (SaveOptions::post),
  // returned once the save accepted before it is captured — kDeadlineExceeded among them when
  // the daemon left the posted save unanswered for call_timeout (that step is then abandoned);
  // kDeadlineExceeded naming the step when `timeout` passes first (the memory must then still be
  // kept unchanged: the capture goes on).
  Status WaitSnapshot(std::optional<std::chrono::milliseconds> timeout = std::nullopt);

  // Waits until `step` of this job reaches `state` (kCaptured: this rank's bytes; kPersisted:
  // this node's; kCommitted: the global checkpoint; kReplicated: in other nodes' memory too).
  // Errors: kAborted when the step ended ABORTED or FAILED (the message says which, and why);
  // kFailedPrecondition with the reason when it will not be replicated (too few holders, a
  // holder full or lost) or, for a memory-only step, never reaches `state`;
  // kDeadlineExceeded naming the step and state when `timeout` passes first.
  Status Wait(uint64_t step, WaitState state,
              std::optional<std::chrono::milliseconds> timeout = std::nullopt);

  // The newest step of this job that restores now, or nullopt when there is none: the newest
  // committed step, or a newer memory-only step whose every rank is held in memory by a live
  // daemon (with a coordinator that follows replication).
  Result<std::optional<uint64_t>> Latest();

  // The step this job restores from after a restart, or nullopt when none is committed: the
  // newest committed step, resolved once for the whole job — every rank of the same world size
  // that asks gets the same answer, once, even when a step of the previous incarnation commits
  // between two ranks' calls (that step is then restored by none; save steps after it, since a
  // committed step number is never saved again). Load(nullopt) restores this step.
  Result<std::optional<uint64_t>> RestorePoint();

  // Fills the registered tensors from `step` (nullopt: the job's restore point, RestorePoint()),
  // whatever layout the checkpoint was written with. With strict, a registered tensor missing
  // from the step is an error (kNotFound naming it); otherwise it is left untouched and listed in
  // LoadResult::missing. The registered memory must not be used until this returns.
  Result<LoadResult> Load(std::optional<uint64_t> step = std::nullopt, bool strict = true);
  // As above; when CUDA tensors were filled, `stream` is made to wait on the daemon's "loaded"
  // events before this returns, so work enqueued on it afterwards sees the loaded bytes.
  Result<LoadResult> Load(std::optional<uint64_t> step, bool strict, CudaStream stream);
  // The general form (another job's checkpoint, see LoadOptions).
  Result<LoadResult> Load(const LoadOptions& options);

  // Tells the daemon that this rank gives up on `step` (nullopt: the most recent Save) and is
  // about to modify its memory: the step is aborted and never committed. For a fence that timed
  // out (WaitSnapshot's kDeadlineExceeded) before the trainer goes on. Returns once the daemon is
  // sure to learn it before it could count the capture complete — the request is in the socket,
  // or the connection was shut down (which aborts every uncaptured step of this rank) — never
  // waiting for the daemon itself. Always OK unless closed.
  Status Abandon(std::optional<uint64_t> step = std::nullopt, std::string_view reason = {});

  // Shuts the connection down and joins the reader thread. Calls waiting in other threads return
  // kCancelled promptly; later calls return kCancelled. Idempotent; safe to call concurrently
  // with other calls (but not with the destructor). The daemon treats the closed connection as
  // the end of this rank's lease: a step already captured is still persisted and committed.
  void Close();

  // The daemon's node id, from its first hello. Valid as long as the Client lives.
  const std::string& node_id() const;
  // The call timeout in force (ClientOptions::call_timeout after the environment's default).
  std::chrono::milliseconds call_timeout() const;
  // Whether the daemon holds this client's registration (false before Register, and after a
  // re-attach that could not re-register).
  bool registered() const;
  // How often this client connected again after losing its connection.
  uint32_t reattaches() const;
  // The local protocol version of the newest connection (proto/README.md, "Versions"; 0 before
  // the first). 3 and later hold saves (SaveOptions::hold).
  uint32_t protocol() const;

 private:
  class Impl;
  explicit Client(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ckpt
