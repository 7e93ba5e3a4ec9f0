// TaskPool: N threads running posted tasks (in order when N = 1). The daemon uses one with a
// single thread as its storage thread — commits, cleanup and recovery scans run there one at a
// time, never on the Asio loop and never racing each other — and a small one for loads.
// Thread safety: Post from any thread.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "daemon/thread_priority.h"

namespace ckpt {

class TaskPool {
 public:
  // `nice`: of the pool's threads (thread_priority.h); 0 leaves them as they are.
  explicit TaskPool(int threads = 1, int nice = 0)
      : size_(threads < 1 ? 1 : threads), nice_(nice) {}
  ~TaskPool() { Stop(); }
  TaskPool(const TaskPool&) = delete;
  TaskPool& operator=(const TaskPool&) = delete;

  void Start() {
    std::lock_guard lock(mu_);
    for (int i = 0; i < size_; ++i) threads_.emplace_back([this] { Run(); });
  }
  // Runs what was posted before (and what those tasks post), then joins. Posts after that are
  // dropped. Safe to call more than once and from several threads: the first call joins.
  void Stop() {
    std::vector<std::thread> threads;
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
      threads.swap(threads_);
      draining_ = !threads.empty();
    }
    cv_.notify_all();
    for (auto& t : threads) t.join();
    std::lock_guard lock(mu_);
    draining_ = false;
  }
  void Post(std::function<void()> task) {
    {
      std::lock_guard lock(mu_);
      if (stopping_ && !draining_) return;
      tasks_.push_back(std::move(task));
    }
    cv_.notify_one();
  }

 private:
  void Run() {
    SetThisThreadNice(nice_);
    while (true) {
      std::function<void()> task;
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] { return stopping_ || !tasks_.empty(); });
        if (tasks_.empty()) return;
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      task();
    }
  }

  const int size_;
  const int nice_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;  // guarded by mu_
  bool stopping_ = false;                    // guarded by mu_
  bool draining_ = false;                    // guarded by mu_: Stop is joining the threads
  std::vector<std::thread> threads_;         // guarded by mu_
};

}  // namespace ckpt
