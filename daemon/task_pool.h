// TaskPool: a WorkerPool (worker_pool.h) of plain tasks, one thread unless told otherwise. The
// daemon uses one with a single thread as its storage thread — commits, cleanup and recovery
// scans run there one at a time, in order, never on the Asio loop and never racing each other —
// and small ones for loads and for building registrations (session.h); the coordinators use
// single-thread ones for commits and admin calls. Post returns false once the pool has stopped: the
// caller decides what the work means then.
#pragma once

#include <string>
#include <utility>

#include "daemon/worker_pool.h"

namespace ckpt {

class TaskPool : public WorkerPool {
 public:
  // `nice`: of the pool's threads (thread_priority.h); 0 leaves them as they are.
  explicit TaskPool(int threads = 1, int nice = 0, std::string name = "tasks")
      : WorkerPool(std::move(name), threads, nice) {}
};

}  // namespace ckpt
