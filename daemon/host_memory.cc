#include "daemon/host_memory.h"

#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <mutex>

namespace ckpt {

namespace {

// Faults the whole mapping in once, at registration, instead of one page fault per 4 KiB during
// every capture and load (measured: a 2 GiB hot restore spent 48% of its time in page faults;
// populated, it ran 2.5x faster, for ~130 ms more at registration).
//
// In chunks, not with MAP_POPULATE: that faults in the whole object under one hold of the
// process's mmap lock, seconds for gigabytes, and once any other thread of the daemon asks for
// the lock to map or unmap (a large malloc, a thread's stack), every page fault of every thread
// queues behind it — the loop included. Measured (daemon_register_test.cpp, 4 GiB registered on
// the register pool): with MAP_POPULATE another session's save + wait once took 2.7 s of the
// registration's 3.4 s; in chunks the worst was 31 ms. Each madvise takes the lock for one chunk
// only. Best effort, as MAP_POPULATE was: a chunk that fails
// (the object shrank meanwhile) leaves the rest to be faulted on use. false: the kernel does not
// know MADV_POPULATE_READ.
constexpr uint64_t kPopulateChunk = 32ull << 20;

bool Populate(std::byte* data, uint64_t size) {
  for (uint64_t offset = 0; offset < size; offset += kPopulateChunk) {
    const uint64_t length = std::min(kPopulateChunk, size - offset);
    if (::madvise(data + offset, length, MADV_POPULATE_READ) != 0) {
      return !(errno == EINVAL && offset == 0);
    }
  }
  return true;
}

}  // namespace

Result<std::shared_ptr<HostMapping>> HostMapping::Map(int fd) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoStatus(errno, "fstat of a registered descriptor");
  if (!S_ISREG(st.st_mode)) {
    return InvalidArgument("registered descriptor is not a shared memory object or file");
  }
  if (st.st_size <= 0) return InvalidArgument("registered descriptor refers to an empty object");
  const auto size = static_cast<uint64_t>(st.st_size);
  bool writable = true;
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED && (errno == EACCES || errno == EPERM)) {
    writable = false;
    p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  }
  if (p == MAP_FAILED) return ErrnoStatus(errno, "mmap of a registered descriptor");
  if (!Populate(static_cast<std::byte*>(p), size)) {
    // A kernel without MADV_POPULATE_READ (before 5.14): populate the old way, in one call.
    ::munmap(p, size);
    const int prot = writable ? PROT_READ | PROT_WRITE : PROT_READ;
    p = ::mmap(nullptr, size, prot, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (p == MAP_FAILED) return ErrnoStatus(errno, "mmap of a registered descriptor");
  }
  return std::shared_ptr<HostMapping>(
      new HostMapping(static_cast<std::byte*>(p), size, writable, st.st_dev, st.st_ino));
}

HostMapping::~HostMapping() { ::munmap(data_, size_); }

Result<std::shared_ptr<HostMapping>> MappingCache::Get(int fd) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoStatus(errno, "fstat of a registered descriptor");
  auto key = std::make_pair(st.st_dev, st.st_ino);
  auto it = by_identity_.find(key);
  // A cached mapping is reused only if the object did not change size since it was mapped.
  if (it != by_identity_.end() && it->second->size() == static_cast<uint64_t>(st.st_size)) {
    return it->second;
  }
  ASSIGN_OR_RETURN(auto mapping, HostMapping::Map(fd));
  by_identity_[key] = mapping;
  return mapping;
}

void MappingCache::DropUnused() {
  std::erase_if(by_identity_, [](const auto& kv) { return kv.second.use_count() == 1; });
}

namespace {

thread_local sigjmp_buf* t_copy_guard = nullptr;
struct sigaction g_previous_sigbus;

void OnSigbus(int sig, siginfo_t* info, void* context) {
  if (t_copy_guard != nullptr) siglongjmp(*t_copy_guard, 1);
  // Not ours: behave as before we were installed.
  if (g_previous_sigbus.sa_flags & SA_SIGINFO) {
    g_previous_sigbus.sa_sigaction(sig, info, context);
    return;
  }
  if (g_previous_sigbus.sa_handler != SIG_IGN && g_previous_sigbus.sa_handler != SIG_DFL) {
    g_previous_sigbus.sa_handler(sig);
    return;
  }
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

void InstallSigbusHandler() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa = {};
    sa.sa_sigaction = OnSigbus;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGBUS, &sa, &g_previous_sigbus);
  });
}

}  // namespace

Status GuardedCopy(void* dst, const void* src, size_t size) {
  InstallSigbusHandler();
  sigjmp_buf jump;
  // savemask=0: SA_NODEFER keeps SIGBUS unblocked, so no mask needs restoring (and no syscall).
  if (sigsetjmp(jump, 0) != 0) {
    t_copy_guard = nullptr;
    return DataLoss(
        "trainer memory vanished during a copy (SIGBUS: the shared object was "
        "truncated after registration)");
  }
  t_copy_guard = &jump;
  std::memcpy(dst, src, size);
  t_copy_guard = nullptr;
  return Status::Ok();
}

}  // namespace ckpt
