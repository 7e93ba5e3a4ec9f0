// Session: one trainer's connection to the daemon (docs/design.md §1.2, local data plane).
//
// The session reads frames off its Unix socket on the daemon's Asio loop (non-blocking reads,
// exactly one frame at a time so received descriptors always belong to the frame they came
// with), dispatches them, and writes replies and events through a bounded queue. The first
// frame must be Hello; then Register / Save / WaitSnapshot / Wait / Latest / Load / Ping /
// Abandon in any order. Every request gets exactly one answer carrying its request_id: its reply
// or an Error. Clients of this daemon's protocol version and of the previous one are accepted.
//
// Abandon (the trainer's fence gave up and it is about to modify the saved memory) aborts the
// step. It can only be late if it is still unread in the socket when the capture finishes; so
// before a capture of this session counts as complete, NodeState has the session read everything
// already sent (DrainInput). A trainer writes its Abandon before it touches the memory, and a
// torn copy can only finish after that touch: the Abandon is then always in the socket.
//
// Bad input is that client's problem only: a semantic error (unknown dtype, bytes outside the
// descriptor, hostile names) is answered with an Error and the session continues; a broken
// stream (oversized frame, unparseable payload, descriptors mid-frame, no Hello) is answered
// with an Error and the connection is closed. The connection is the lease: on close, steps this
// rank had not finished capturing are aborted; captured ones go on without it.
//
// Registration runs off the loop. Building a plan maps every registered object with
// MAP_POPULATE (~0.7 s per GiB) and opens CUDA allocations: on the daemon's only loop that
// stalled every other session of the node (their saves, waits and loads) for seconds. So
// HandleRegister checks an unchanged registration on the loop (free, answered at once) and
// otherwise hands the build to the register pool (SessionServices::registrations); the outcome
// comes back to the loop, where the plan is installed and the reply sent. While a registration
// is in flight the session reads nothing more from its socket, so its later frames — Save,
// Load, Abandon, another Register — are handled after it, in order, exactly as if it had run
// inline. That is also what keeps the worker alone with the session's backends (host_memory_,
// cuda_memory_): on the loop only frame handlers and Close touch them, no frame is handled
// meanwhile, and Close leaves them to whichever of itself and the worker finishes last
// (InFlightRegistration), so no lock guards them.
//
// Not reading has one more consequence: a capture of this session finishing meanwhile cannot
// read an Abandon that may wait behind the registration. Its sync (NodeState's
// SaveRequest::sync_input) is then deferred until the registration is done and the input read,
// so the Abandon rule above holds as before.
//
// CUDA (daemon/device/cuda_backend.h): CUDA tensors are opened through the session's CudaBackend
// (cached per handle, closed on re-registration and disconnect); a Save carrying CUDA events
// makes each GPU's copy stream wait on them before the step's capture is started, and a Load
// into CUDA memory answers with each GPU's "loaded" event.
#pragma once

#include <boost/asio/local/stream_protocol.hpp>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "ckptd/v1/local.pb.h"
#include "common/data_layout.h"
#include "common/frame_io.h"
#include "daemon/capture_plan.h"
#include "daemon/daemon_observer.h"
#include "daemon/device/cuda_backend.h"
#include "daemon/device/host_fd_backend.h"
#include "daemon/host_memory.h"
#include "daemon/node_state.h"
#include "daemon/worker_pool.h"

namespace ckpt {

class LoadService;

// What sessions need from the rest of the daemon; owned by the daemon, outlives sessions.
struct SessionServices {
  NodeState* node = nullptr;
  LoadService* loads = nullptr;         // may be null: loads unsupported
  device::CudaDevices* cuda = nullptr;  // may be null: no GPU on this machine / no CUDA build
  LayoutOptions layout;
  std::string node_id;
  std::string version;
  size_t max_queued_reply_bytes = 64ull << 20;
  DaemonObserver* observer = nullptr;  // may be null: connects, disconnects and loads unobserved
  std::set<std::string> shared_jobs;   // jobs whose checkpoints any session may load
  // Builds registrations' plans off the loop (see the file comment); may be null: they are then
  // built on the loop (the fuzzers, which drive one session synchronously).
  WorkerPool* registrations = nullptr;
};

class Session : public EventSink, public std::enable_shared_from_this<Session> {
 public:
  Session(boost::asio::local::stream_protocol::socket socket, uint64_t id, int32_t peer_pid,
          uint32_t peer_uid, SessionServices* services);
  ~Session() override;

  void Start();
  void Close(const std::string& why);
  void OnEvent(const ckptd::v1::Event& event) override;

  uint64_t id() const { return id_; }
  bool closed() const { return closed_; }

 private:
  void ArmRead();
  void OnReadable();
  // Reads and handles every complete frame already received; never blocks. Stops early while a
  // registration is in flight (the rest is read once it is done).
  void DrainInput();
  // SaveRequest::sync_input: reads what the trainer sent, then `caught_up()` — at once, or once
  // the registration in flight is done and the input behind it read.
  void SyncInput(std::function<void()> caught_up);
  void Dispatch(Frame frame);
  void Handle(const ckptd::v1::ClientMessage& m, std::vector<UniqueFd> fds);
  void HandleHello(uint64_t id, const ckptd::v1::Hello& hello);
  void HandleRegister(uint64_t id, const ckptd::v1::Register& reg, std::vector<UniqueFd> fds);
  struct InFlightRegistration;
  // On the register pool (or inline without one): builds the plan through the backends.
  void BuildRegistration(InFlightRegistration& registration);
  // On the loop: installs the plan and answers, then reads what waited behind it.
  void FinishRegistration(const std::shared_ptr<InFlightRegistration>& registration);
  // Closes every mapping and allocation of this client (the session is closed).
  void ReleaseBackends();
  void HandleSave(uint64_t id, const ckptd::v1::Save& save);
  void HandleWait(uint64_t id, uint64_t step, ckptd::v1::StepState state);
  void HandleLoad(uint64_t id, const ckptd::v1::Load& load);

  void Send(const ckptd::v1::DaemonMessage& m);
  void SendError(uint64_t request_id, const Status& status);
  void WriteNext();
  // A callback that answers request `id` if the session is still open.
  std::function<void(Status)> WaitReplier(uint64_t id, uint64_t step, ckptd::v1::StepState state);

  boost::asio::local::stream_protocol::socket socket_;
  const uint64_t id_;
  const int32_t peer_pid_;
  const uint32_t peer_uid_;
  SessionServices* services_;
  FrameReader reader_;
  bool closed_ = false;

  // After Hello.
  bool hello_ = false;
  uint32_t protocol_ = 0;  // the version this session speaks (the lower of client and daemon)
  std::string job_;
  uint32_t rank_ = 0;
  uint32_t world_size_ = 0;

  // Registration being received (Register frames with more=true) and the current one.
  std::vector<ckptd::v1::TensorSpec> pending_specs_;
  std::vector<UniqueFd> pending_fds_;
  Status pending_error_;
  // Open handles of this client, by kind (daemon/device/device_backend.h).
  HostFdBackend host_memory_;
  std::unique_ptr<device::CudaBackend> cuda_memory_;  // created with the first CUDA tensor
  std::shared_ptr<const CapturePlan> plan_;
  std::optional<uint64_t> last_saved_step_;
  // The registration on the register pool; null when none is. While set, no frame is read.
  std::shared_ptr<InFlightRegistration> registering_;
  // Syncs of finished captures waiting for that registration (SyncInput).
  std::vector<std::function<void()>> deferred_syncs_;
  bool read_armed_ = false;  // a wait for readability is pending

  std::deque<std::string> out_;
  size_t out_bytes_ = 0;
  bool writing_ = false;
};

}  // namespace ckpt
