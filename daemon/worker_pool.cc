#include "daemon/worker_pool.h"

#include <pthread.h>

#include <utility>

#include "daemon/thread_priority.h"

namespace ckpt {

WorkerPool::WorkerPool(std::string name, int threads, int nice)
    : name_(std::move(name)), size_(threads < 1 ? 1 : static_cast<size_t>(threads)), nice_(nice) {}

WorkerPool::~WorkerPool() { Stop(); }

void WorkerPool::Start() {
  MutexLock lock(mu_);
  if (stopping_) return;
  StartLocked();
}

void WorkerPool::StartLocked() {
  if (started_) return;
  started_ = true;
  threads_.reserve(size_);
  for (size_t i = 0; i < size_; ++i) threads_.emplace_back([this, i] { Run(i); });
}

void WorkerPool::Stop() {
  MutexLock lock(mu_);
  if (joined_) return;
  stopping_ = true;
  if (!started_) {
    if (tasks_.empty()) {  // nothing to run: no threads needed to close
      closed_ = true;
      joined_ = true;
      return;
    }
    StartLocked();  // what was posted before Start still runs
  }
  work_cv_.NotifyAll();
  if (joining_) {  // another Stop joins; return once it has
    stopped_cv_.Wait(mu_, [&]() REQUIRES(mu_) { return joined_; });
    return;
  }
  joining_ = true;
  std::vector<std::thread> threads = std::move(threads_);
  lock.Unlock();
  for (auto& t : threads) t.join();
  lock.Lock();
  joined_ = true;
  stopped_cv_.NotifyAll();
}

bool WorkerPool::Post(std::function<void()> task) {
  return Post(IndexedTask([task = std::move(task)](size_t) { task(); }));
}

bool WorkerPool::Post(IndexedTask task) {
  {
    MutexLock lock(mu_);
    if (closed_) return false;  // `task` is destroyed on return, outside the lock
    tasks_.push_back(std::move(task));
  }
  work_cv_.NotifyOne();
  return true;
}

void WorkerPool::Run(size_t worker) {
  const std::string thread_name = (name_ + "-" + std::to_string(worker)).substr(0, 15);
  ::pthread_setname_np(::pthread_self(), thread_name.c_str());
  SetThisThreadNice(nice_);
  MutexLock lock(mu_);
  while (true) {
    work_cv_.Wait(mu_, [&]() REQUIRES(mu_) {
      return !tasks_.empty() || closed_ || (stopping_ && running_ == 0);
    });
    if (!tasks_.empty()) {
      IndexedTask task = std::move(tasks_.front());
      tasks_.pop_front();
      ++running_;
      lock.Unlock();
      task(worker);
      task = nullptr;  // what it holds is released outside the lock too
      lock.Lock();
      --running_;
      continue;
    }
    // Stopping, nothing queued, and no task running that could still post: the pool is done.
    // Wake the idle workers (they exit too) and refuse posts from now on.
    closed_ = true;
    work_cv_.NotifyAll();
    return;
  }
}

}  // namespace ckpt
