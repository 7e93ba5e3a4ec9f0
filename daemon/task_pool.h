// SerialExecutor: one thread that runs posted tasks in order. The daemon's storage thread:
// commits, aborts' cleanup and recovery scans run here, one at a time, so they never block
// the Asio loop and never race each other. Thread safety: Post from any thread.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace ckpt {

class SerialExecutor {
 public:
  SerialExecutor() = default;
  ~SerialExecutor() { Stop(); }
  SerialExecutor(const SerialExecutor&) = delete;
  SerialExecutor& operator=(const SerialExecutor&) = delete;

  void Start() {
    thread_ = std::thread([this] { Run(); });
  }
  // Runs what was posted before, then joins. Posts after Stop are dropped.
  void Stop() {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  void Post(std::function<void()> task) {
    {
      std::lock_guard lock(mu_);
      if (stopping_ && !thread_.joinable()) return;
      tasks_.push_back(std::move(task));
    }
    cv_.notify_one();
  }

 private:
  void Run() {
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

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;  // guarded by mu_
  bool stopping_ = false;                    // guarded by mu_
  std::thread thread_;
};

}  // namespace ckpt
