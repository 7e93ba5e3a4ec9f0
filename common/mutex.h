// ckpt::Mutex, ckpt::MutexLock and ckpt::CondVar: std::mutex and std::condition_variable with
// clang's thread-safety annotations (common/thread_annotations.h), so that a field declared
//
//   mutable Mutex mu_;
//   std::deque<Item> queue_ GUARDED_BY(mu_);
//
// is checked at compile time: with clang, -Wthread-safety (cmake/Warnings.cmake) reports every
// read or write of queue_ without mu_ held, every call of a REQUIRES(mu_) helper without it and
// every lock that is not released on some path. CI builds the tsan stage with clang and -Werror
// (scripts/test.sh), so the same locks are checked statically there and dynamically by
// ThreadSanitizer in the same stage; under gcc the annotations are empty and these are plain
// std::mutex and std::condition_variable.
//
//   void Queue::Push(Item item) {
//     MutexLock lock(mu_);                       // held to the end of the scope
//     queue_.push_back(std::move(item));
//     cv_.NotifyOne();
//   }
//   Item Queue::Pop() {
//     MutexLock lock(mu_);
//     cv_.Wait(mu_, [&]() REQUIRES(mu_) { return !queue_.empty(); });
//     ...
//   }
//
// A predicate lambda is analysed as a function of its own, which does not know that Wait calls
// it with the mutex held: say so with REQUIRES(mu_) after its parameter list, as above (the
// analysis then checks that too). MutexLock::Unlock and Lock drop and retake the mutex in the
// middle of a scope (e.g. around a call that must not run under it); the analysis follows them.
// std::shared_mutex is not used in ckptd; add a SharedMutex here if it ever is.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "common/thread_annotations.h"

namespace ckpt {

class CondVar;

// A std::mutex the analysis knows as a capability. Not recursive.
class CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ACQUIRE() { mu_.lock(); }
  void Unlock() RELEASE() { mu_.unlock(); }
  bool TryLock() TRY_ACQUIRE(true) { return mu_.try_lock(); }
  // Tells the analysis that the caller holds the mutex, where it cannot see it (a callback run
  // under a lock taken elsewhere). Not checked at run time: std::mutex cannot say who holds it.
  void AssertHeld() const ASSERT_CAPABILITY(this) {}

 private:
  friend class CondVar;
  std::mutex mu_;
};

// Holds a Mutex from construction to the end of the scope. Unlock() and Lock() release and
// retake it inside the scope; the destructor releases it only if it is held.
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) ACQUIRE(mu) : mu_(mu) { mu_.Lock(); }
  ~MutexLock() RELEASE() {
    if (locked_) mu_.Unlock();
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void Unlock() RELEASE() {
    mu_.Unlock();
    locked_ = false;
  }
  void Lock() ACQUIRE() {
    mu_.Lock();
    locked_ = true;
  }

 private:
  Mutex& mu_;
  bool locked_ = true;
};

// A condition variable over ckpt::Mutex. Every wait is called with the mutex held (checked),
// releases it while blocked and holds it again when it returns; waits without a predicate may
// wake spuriously.
class CondVar {
 public:
  CondVar() = default;
  CondVar(const CondVar&) = delete;
  CondVar& operator=(const CondVar&) = delete;

  void NotifyOne() { cv_.notify_one(); }
  void NotifyAll() { cv_.notify_all(); }

  void Wait(Mutex& mu) REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu.mu_, std::adopt_lock);
    cv_.wait(lock);
    lock.release();  // still held: the caller's MutexLock releases it
  }
  // Returns false when the deadline passed (the mutex is held again either way).
  template <class Clock, class Duration>
  bool WaitUntil(Mutex& mu, const std::chrono::time_point<Clock, Duration>& deadline) REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu.mu_, std::adopt_lock);
    const bool woken = cv_.wait_until(lock, deadline) == std::cv_status::no_timeout;
    lock.release();
    return woken;
  }
  template <class Rep, class Period>
  bool WaitFor(Mutex& mu, const std::chrono::duration<Rep, Period>& timeout) REQUIRES(mu) {
    return WaitUntil(mu, std::chrono::steady_clock::now() + timeout);
  }

  // Waits until pred() holds; pred runs with the mutex held.
  //
  // The three predicate forms are not analysed (NO_THREAD_SAFETY_ANALYSIS): the predicate's
  // REQUIRES names the caller's mutex member, which the analysis cannot match to the parameter
  // mu here. The caller is still checked: REQUIRES(mu) at the call, REQUIRES in the lambda.
  template <class Pred>
  void Wait(Mutex& mu, Pred pred) REQUIRES(mu) NO_THREAD_SAFETY_ANALYSIS {
    while (!pred()) Wait(mu);
  }
  // Returns pred() (false: the deadline passed first).
  template <class Clock, class Duration, class Pred>
  bool WaitUntil(Mutex& mu, const std::chrono::time_point<Clock, Duration>& deadline, Pred pred)
      REQUIRES(mu) NO_THREAD_SAFETY_ANALYSIS {
    while (!pred()) {
      if (!WaitUntil(mu, deadline)) return pred();
    }
    return true;
  }
  template <class Rep, class Period, class Pred>
  bool WaitFor(Mutex& mu, const std::chrono::duration<Rep, Period>& timeout, Pred pred)
      REQUIRES(mu) NO_THREAD_SAFETY_ANALYSIS {
    return WaitUntil(mu, std::chrono::steady_clock::now() + timeout, std::move(pred));
  }

 private:
  std::condition_variable cv_;
};

}  // namespace ckpt
