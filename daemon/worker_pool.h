// WorkerPool: the daemon's one kind of thread pool — a fixed number of named threads running
// posted tasks, first in, first out. The storage thread, the load pool, the register pool (the
// sessions' plans, session.h) and the coordinators' commit and admin threads (TaskPool), the copy
// threads (CaptureEngine) and the writer threads
// (FlushEngine) are each an instance of their own: they never share threads, so a filesystem
// that hangs in the writer threads cannot hold up a copy or a commit.
//
// Why one class. Each of those used to run its own loop over its own queue, and each had its own
// answer to "what happens to work handed over after Stop": the task pool dropped it, the engines
// queued it for threads that were gone. Either way a trainer could wait forever for a callback
// that was never going to come. Here the rule is in one place and in the type: Post returns
// false when the pool has stopped — the task will never run — and is [[nodiscard]], so every
// caller says what its work means when it cannot be done (fail the job, answer the waiter with
// "the daemon is stopping", lower the count it raised).
//
// Stop runs everything already queued, and what those tasks post in turn, then joins. A Post
// that returns true is a promise: the task runs before Stop returns. So the pool closes only
// when it is stopping, its queue is empty and no task is running (a running task may still
// post). A pool stopped before it was started starts its threads to do so: nothing posted is
// lost because of the order of calls.
//
// Tasks run in order when the pool has one thread (the storage thread relies on it: commits and
// cleanups never race each other). A task may take the index of the worker running it
// (0 <= index < size()): the writer threads stamp their storage calls in a slot of their own.
//
// Not for fork-join work: ParallelFor in the checkpoint reader (common/checkpoint_reader.cc)
// stays as it is, because its threads live for one call with the caller working among them and
// are joined before it returns — there is nothing to stop or refuse — and common/ serves ckptctl
// and the client too, which have no daemon pools.
//
// Thread safety: every method from any thread. Stop from several threads at once: each returns
// once the threads are joined. Never call Stop from one of the pool's own tasks (it would wait
// for itself).
#pragma once

#include <cstddef>
#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"

namespace ckpt {

class WorkerPool {
 public:
  // A task that learns the index of the worker thread running it.
  using IndexedTask = std::function<void(size_t worker)>;

  // `name`: the threads are called "<name>-<index>" (as `top -H` and debuggers show them; Linux
  // keeps 15 characters). `threads` < 1 counts as 1. `nice`: of the pool's threads
  // (thread_priority.h); 0 leaves them as they are.
  WorkerPool(std::string name, int threads, int nice = 0);
  ~WorkerPool();  // Stop()
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Starts the threads; what was posted before runs now. No effect once started or stopped.
  void Start();
  // Runs what was posted (and what that posts), then joins. Safe to call more than once.
  void Stop();

  // Queues `task`. false: the pool has stopped, and the task (destroyed here, unrun) never will.
  [[nodiscard]] bool Post(std::function<void()> task);
  [[nodiscard]] bool Post(IndexedTask task);

  size_t size() const { return size_; }
  const std::string& name() const { return name_; }

 private:
  void StartLocked() REQUIRES(mu_);
  void Run(size_t worker);

  const std::string name_;
  const size_t size_;
  const int nice_;
  Mutex mu_;
  CondVar work_cv_;     // a task was queued, or the pool closed
  CondVar stopped_cv_;  // the threads were joined
  std::deque<IndexedTask> tasks_ GUARDED_BY(mu_);
  size_t running_ GUARDED_BY(mu_) = 0;  // tasks being run now
  bool started_ GUARDED_BY(mu_) = false;
  bool stopping_ GUARDED_BY(mu_) = false;  // Stop was called
  bool closed_ GUARDED_BY(mu_) = false;    // stopping, drained; Post refuses
  bool joining_ GUARDED_BY(mu_) = false;   // one Stop is joining the threads
  bool joined_ GUARDED_BY(mu_) = false;    // the threads are gone
  std::vector<std::thread> threads_ GUARDED_BY(mu_);
};

}  // namespace ckpt
