// FakeCudaApi: a CudaApi that behaves like CUDA where the CUDA backend's logic depends on it, on
// machines without a GPU.
//
// * "Device memory" of a simulated trainer is host memory owned by the fake (Allocation); a
//   legacy IPC handle or a VMM fd (a real memfd) names it. Opening returns its address, so copies
//   are memcpys. Freeing an allocation makes its handle stale.
// * Streams are FIFO queues, each drained in order by its own thread, like a GPU stream: a copy
//   runs only after everything enqueued before it. Events follow CUDA's rules: a record bumps
//   the event's generation when enqueued and completes it when the stream reaches it; a stream
//   wait (and SynchronizeEvent) waits for the generation recorded *at the time of the call* —
//   so a wait on an event not yet recorded returns at once, as on a real GPU.
// * The simulated trainer enqueues "kernels" (callbacks) on its own stream, optionally held
//   behind a Gate the test opens, and records an interprocess event after them.
// * Faults: a device can be marked lost (every later call on it fails kUnavailable, as the real
//   shim classifies it) and the next mapping can be made to run out of memory.
//
// Counters let tests check what the backend did: opens and closes, contexts (copy streams)
// per device, host registrations, live events.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "daemon/device/cuda_api.h"

namespace ckpt::device::testing {

class FakeCudaApi final : public CudaApi {
 public:
  // One allocation of a simulated trainer.
  struct Allocation {
    std::vector<std::byte> bytes;
    int device = 0;
    bool freed = false;
  };

  // A latch the test opens to let a trainer "kernel" run.
  class Gate {
   public:
    void Open() {
      MutexLock l(mu_);
      open_ = true;
      cv_.NotifyAll();
    }
    void Pass() {
      MutexLock l(mu_);
      cv_.Wait(mu_, [&]() REQUIRES(mu_) { return open_; });
    }

   private:
    Mutex mu_;
    CondVar cv_;
    bool open_ GUARDED_BY(mu_) = false;
  };

  explicit FakeCudaApi(int devices = 2) {
    for (int i = 0; i < devices; ++i) {
      char uuid[64];
      std::snprintf(uuid, sizeof uuid, "GPU-00000000-0000-0000-0000-%012d", i + 1);
      uuids_.push_back(uuid);
    }
  }
  ~FakeCudaApi() override {
    std::map<int, std::shared_ptr<Stream>> streams;
    {
      MutexLock l(mu_);
      streams.swap(streams_);
    }
    for (auto& [id, s] : streams) s->Stop();
    streams.clear();
    retired_events_.clear();  // no stream op can reach them any more
  }

  // ---- the simulated trainer -----------------------------------------------------------------
  // A new allocation on `device` filled with `fill`; returns its legacy IPC handle.
  std::string NewIpcAllocation(int device, uint64_t size, std::byte fill = std::byte{0}) {
    MutexLock l(mu_);
    auto a = std::make_shared<Allocation>();
    a->bytes.assign(size, fill);
    a->device = device;
    std::string handle(kIpcHandleBytes, '\0');
    const uint64_t id = ++next_id_;
    std::memcpy(handle.data(), "fakeipc:", 8);
    std::memcpy(handle.data() + 8, &id, sizeof id);
    ipc_[handle] = a;
    return handle;
  }
  // A new VMM allocation; returns a memfd standing for its exported POSIX fd (caller owns it).
  int NewVmmAllocation(int device, uint64_t size, std::byte fill = std::byte{0}) {
    int fd = ::memfd_create("fake-vmm", MFD_CLOEXEC);
    struct stat st;
    ::fstat(fd, &st);
    MutexLock l(mu_);
    auto a = std::make_shared<Allocation>();
    a->bytes.assign(size, fill);
    a->device = device;
    vmm_[st.st_ino] = a;
    return fd;
  }
  std::shared_ptr<Allocation> ipc_allocation(const std::string& handle) {
    MutexLock l(mu_);
    return ipc_.at(handle);
  }
  std::shared_ptr<Allocation> vmm_allocation(int fd) {
    struct stat st;
    ::fstat(fd, &st);
    MutexLock l(mu_);
    return vmm_.at(st.st_ino);
  }
  void Free(const std::string& handle) {
    MutexLock l(mu_);
    ipc_.at(handle)->freed = true;
  }
  // The trainer's stream on `device` (created on first use; a fake "current stream").
  StreamHandle TrainerStream(int device) {
    auto s = CreateCopyStream(device);
    MutexLock l(mu_);
    --contexts_[device];  // the trainer's context is not the daemon's
    return *s;
  }
  // Enqueues a kernel on `stream` that waits for `gate` (may be null) then runs `body`.
  void EnqueueKernel(StreamHandle stream, Gate* gate, std::function<void()> body) {
    StreamOf(stream)->Enqueue([gate, body = std::move(body)] {
      if (gate != nullptr) gate->Pass();
      body();
    });
  }
  // cudaEventCreate(interprocess) + record on the trainer stream + cudaIpcGetEventHandle.
  std::string RecordTrainerEvent(int device, StreamHandle stream,
                                 EventHandle* event_out = nullptr) {
    EventHandle e =
        event_out != nullptr && *event_out != nullptr ? *event_out : *CreateEvent(device, true);
    if (event_out != nullptr) {
      *event_out = e;
    } else {  // the test has no handle to destroy it with: the fake frees it at the end
      MutexLock l(mu_);
      retired_events_.emplace_back(static_cast<Event*>(e));
    }
    (void)RecordEvent(device, e, stream);
    return *IpcEventHandle(device, e);
  }
  // Blocks until every op enqueued on `stream` so far has run.
  void Drain(StreamHandle stream) {
    auto e = *CreateEvent(0, false);
    (void)RecordEvent(0, e, stream);
    (void)SynchronizeEvent(0, e);
    DestroyEvent(0, e);
  }

  // ---- faults and counters ------------------------------------------------------------------
  void SetDeviceLost(int device) {
    MutexLock l(mu_);
    lost_.insert(device);
  }
  void FailNextMappingWithOom() { oom_next_ = true; }
  int ipc_opens() const { return ipc_opens_.load(); }
  int ipc_closes() const { return ipc_closes_.load(); }
  int vmm_imports() const { return vmm_imports_.load(); }
  int vmm_unmaps() const { return vmm_unmaps_.load(); }
  int ipc_event_opens() const { return ipc_event_opens_.load(); }
  int live_events() const { return live_events_.load(); }
  int host_registers() const { return host_registers_.load(); }
  int host_unregisters() const { return host_unregisters_.load(); }
  int d2h_copies() const { return d2h_copies_.load(); }
  int h2d_copies() const { return h2d_copies_.load(); }
  int contexts(int device) {
    MutexLock l(mu_);
    return contexts_[device];
  }

  // ---- CudaApi --------------------------------------------------------------------------------
  Result<int> DeviceCount() override { return static_cast<int>(uuids_.size()); }
  Result<std::string> DeviceUuid(int device) override {
    if (device < 0 || device >= static_cast<int>(uuids_.size())) return InvalidArgument("ordinal");
    return uuids_[device];
  }

  Result<DevicePtr> OpenIpcMemHandle(int device, std::string_view handle) override {
    RETURN_IF_ERROR(Alive(device));
    if (oom_next_.exchange(false)) return ResourceExhausted("out of GPU memory: fake");
    MutexLock l(mu_);
    auto it = ipc_.find(std::string(handle));
    if (it == ipc_.end() || it->second->freed || it->second->device != device) {
      return FailedPrecondition("stale or invalid CUDA handle: cudaIpcOpenMemHandle (fake)");
    }
    const auto ptr = reinterpret_cast<DevicePtr>(it->second->bytes.data());
    if (!open_ipc_.insert(ptr).second) {
      return FailedPrecondition("cudaErrorAlreadyMapped: handle opened twice in one process");
    }
    ++ipc_opens_;
    return ptr;
  }
  Status CloseIpcMemHandle(int, DevicePtr ptr) override {
    MutexLock l(mu_);
    if (open_ipc_.erase(ptr) != 1) return Internal("closing a handle that is not open");
    ++ipc_closes_;
    return Status::Ok();
  }
  Result<DevicePtr> ImportVmmFd(int device, int fd, uint64_t size) override {
    RETURN_IF_ERROR(Alive(device));
    if (oom_next_.exchange(false)) return ResourceExhausted("out of GPU memory: fake");
    struct stat st;
    if (::fstat(fd, &st) != 0) return FailedPrecondition("stale: bad fd");
    MutexLock l(mu_);
    auto it = vmm_.find(st.st_ino);
    if (it == vmm_.end() || it->second->bytes.size() != size) {
      return FailedPrecondition("stale or invalid CUDA handle: cuMemImportFromShareableHandle");
    }
    ++vmm_imports_;
    return reinterpret_cast<DevicePtr>(it->second->bytes.data());
  }
  Status UnmapVmm(int, DevicePtr, uint64_t) override {
    ++vmm_unmaps_;
    return Status::Ok();
  }

  Result<StreamHandle> CreateCopyStream(int device) override {
    RETURN_IF_ERROR(Alive(device));
    MutexLock l(mu_);
    const int id = ++next_stream_;
    auto s = std::make_shared<Stream>();
    streams_[id] = s;
    ++contexts_[device];
    return reinterpret_cast<StreamHandle>(static_cast<intptr_t>(id));
  }
  void DestroyStream(int, StreamHandle stream) override {
    std::shared_ptr<Stream> s;
    {
      MutexLock l(mu_);
      auto it = streams_.find(static_cast<int>(reinterpret_cast<intptr_t>(stream)));
      if (it == streams_.end()) return;
      s = it->second;
      streams_.erase(it);
    }
    s->Stop();
  }

  Result<EventHandle> CreateEvent(int device, bool) override {
    RETURN_IF_ERROR(Alive(device));
    ++live_events_;
    return static_cast<EventHandle>(new Event());
  }
  void DestroyEvent(int, EventHandle event) override {
    --live_events_;
    auto* e = static_cast<Event*>(event);
    // Opened IPC events are references to the trainer's: only drop the reference.
    if (e->opened_from != nullptr) {
      delete e;
      return;
    }
    MutexLock l(mu_);
    for (auto it = ipc_events_.begin(); it != ipc_events_.end();) {
      it = it->second == e ? ipc_events_.erase(it) : std::next(it);
    }
    // As cudaEventDestroy: a record still queued on a stream completes first, so the event's
    // memory lives until the streams are gone (the destructor), not just until this call.
    retired_events_.emplace_back(e);
  }
  Result<std::string> IpcEventHandle(int device, EventHandle event) override {
    RETURN_IF_ERROR(Alive(device));
    MutexLock l(mu_);
    std::string handle(kIpcHandleBytes, '\0');
    std::memcpy(handle.data(), "fakeevt:", 8);
    auto* e = static_cast<Event*>(event);
    std::memcpy(handle.data() + 8, &e, sizeof e);
    ipc_events_[handle] = e;
    return handle;
  }
  Result<EventHandle> OpenIpcEventHandle(int device, std::string_view handle) override {
    RETURN_IF_ERROR(Alive(device));
    MutexLock l(mu_);
    auto it = ipc_events_.find(std::string(handle));
    if (it == ipc_events_.end()) {
      return FailedPrecondition("stale or invalid CUDA handle: cudaIpcOpenEventHandle (fake)");
    }
    ++ipc_event_opens_;
    ++live_events_;
    auto* ref = new Event();
    ref->opened_from = it->second;
    return static_cast<EventHandle>(ref);
  }
  Status RecordEvent(int device, EventHandle event, StreamHandle stream) override {
    RETURN_IF_ERROR(Alive(device));
    Event* e = Target(event);
    uint64_t gen;
    {
      MutexLock l(e->mu);
      gen = ++e->recorded;
    }
    StreamOf(stream)->Enqueue([e, gen] {
      MutexLock l(e->mu);
      e->completed = std::max(e->completed, gen);
      e->cv.NotifyAll();
    });
    return Status::Ok();
  }
  Status StreamWaitEvent(int device, StreamHandle stream, EventHandle event) override {
    RETURN_IF_ERROR(Alive(device));
    Event* e = Target(event);
    uint64_t target;
    {
      MutexLock l(e->mu);
      target = e->recorded;  // the most recent record at the time of the call
    }
    auto s = StreamOf(stream);
    s->Enqueue([e, target, s] {
      // Re-checks `stopping` now and then: nothing notifies this event when the fake shuts down.
      MutexLock l(e->mu);
      while (e->completed < target && !s->stopping()) {
        e->cv.WaitFor(e->mu, std::chrono::milliseconds(5));
      }
    });
    return Status::Ok();
  }
  Status SynchronizeEvent(int device, EventHandle event) override {
    Event* e = Target(event);
    {
      MutexLock l(e->mu);
      const uint64_t target = e->recorded;
      e->cv.Wait(e->mu, [&]() REQUIRES(e->mu) { return e->completed >= target; });
    }
    return Alive(device);  // a lost device reports it when its work is waited for
  }
  Status CopyDeviceToHostAsync(int device, void* dst, DevicePtr src, uint64_t bytes,
                               StreamHandle stream) override {
    RETURN_IF_ERROR(Alive(device));
    ++d2h_copies_;
    StreamOf(stream)->Enqueue([this, device, dst, src, bytes] {
      if (!Alive(device).ok()) return;  // a lost device copies nothing
      std::memcpy(dst, reinterpret_cast<const void*>(src), bytes);
    });
    return Status::Ok();
  }
  Status CopyHostToDeviceAsync(int device, DevicePtr dst, const void* src, uint64_t bytes,
                               StreamHandle stream) override {
    RETURN_IF_ERROR(Alive(device));
    ++h2d_copies_;
    StreamOf(stream)->Enqueue([this, device, dst, src, bytes] {
      if (!Alive(device).ok()) return;
      std::memcpy(reinterpret_cast<void*>(dst), src, bytes);
    });
    return Status::Ok();
  }
  Status HostRegister(int device, void*, uint64_t) override {
    RETURN_IF_ERROR(Alive(device));
    ++host_registers_;
    return Status::Ok();
  }
  Status HostUnregister(int, void*) override {
    ++host_unregisters_;
    return Status::Ok();
  }

 private:
  struct Event {
    Mutex mu;
    CondVar cv;
    uint64_t recorded GUARDED_BY(mu) = 0;  // generations
    uint64_t completed GUARDED_BY(mu) = 0;
    Event* opened_from = nullptr;  // an opened IPC handle refers to the exporter's event
  };
  // A FIFO op queue drained by one thread.
  class Stream {
   public:
    Stream() : worker_([this] { Run(); }) {}
    ~Stream() { Stop(); }
    void Enqueue(std::function<void()> op) {
      MutexLock l(mu_);
      ops_.push_back(std::move(op));
      cv_.NotifyAll();
    }
    bool stopping() const { return stop_.load(); }
    void Stop() {
      stop_.store(true);
      {
        MutexLock l(mu_);
        cv_.NotifyAll();
      }
      if (worker_.joinable() && worker_.get_id() != std::this_thread::get_id()) worker_.join();
    }

   private:
    void Run() {
      while (true) {
        std::function<void()> op;
        {
          MutexLock l(mu_);
          cv_.Wait(mu_, [&]() REQUIRES(mu_) { return stop_.load() || !ops_.empty(); });
          if (ops_.empty()) return;
          op = std::move(ops_.front());
          ops_.pop_front();
        }
        op();
      }
    }
    Mutex mu_;
    CondVar cv_;
    std::deque<std::function<void()>> ops_ GUARDED_BY(mu_);
    std::atomic<bool> stop_{false};
    std::thread worker_;
  };

  static Event* Target(EventHandle h) {
    auto* e = static_cast<Event*>(h);
    return e->opened_from != nullptr ? e->opened_from : e;
  }
  std::shared_ptr<Stream> StreamOf(StreamHandle h) {
    MutexLock l(mu_);
    return streams_.at(static_cast<int>(reinterpret_cast<intptr_t>(h)));
  }
  Status Alive(int device) {
    MutexLock l(mu_);
    if (lost_.count(device)) {
      return Unavailable("GPU lost or unusable: cudaErrorDevicesUnavailable (fake)");
    }
    return Status::Ok();
  }

  std::vector<std::string> uuids_;
  Mutex mu_;
  uint64_t next_id_ GUARDED_BY(mu_) = 0;
  int next_stream_ GUARDED_BY(mu_) = 0;
  std::map<std::string, std::shared_ptr<Allocation>> ipc_ GUARDED_BY(mu_);
  std::map<ino_t, std::shared_ptr<Allocation>> vmm_ GUARDED_BY(mu_);
  std::set<DevicePtr> open_ipc_ GUARDED_BY(mu_);
  std::map<std::string, Event*> ipc_events_ GUARDED_BY(mu_);
  // Freed once the streams are gone (a queued record may still reach them): destroyed events,
  // and the trainer events RecordTrainerEvent made without handing them out.
  std::vector<std::unique_ptr<Event>> retired_events_ GUARDED_BY(mu_);
  std::map<int, std::shared_ptr<Stream>> streams_ GUARDED_BY(mu_);
  std::map<int, int> contexts_ GUARDED_BY(mu_);
  std::set<int> lost_ GUARDED_BY(mu_);
  std::atomic<bool> oom_next_{false};
  std::atomic<int> ipc_opens_{0}, ipc_closes_{0}, vmm_imports_{0}, vmm_unmaps_{0},
      ipc_event_opens_{0}, live_events_{0}, host_registers_{0}, host_unregisters_{0},
      d2h_copies_{0}, h2d_copies_{0};
};

}  // namespace ckpt::device::testing
