// LoopTasks: work that must not run on the node state's Asio loop — storage calls, which block
// for as long as a filesystem hangs, and frees of large structures — posted to a TaskPool, with
// its outcome posted back onto the loop. The outcome is dropped if the owner was destroyed by
// then (the loop may run a little longer than the owner during shutdown).
//
// The owner's state is touched only on the loop: `work` must not read it (pass what it needs by
// value), `then` may. The pool runs tasks in order when it has one thread (the storage thread),
// so outcomes arrive in the order the work was posted.
//
// Once the pool has stopped (the daemon is shutting down) it refuses work. Run then still
// answers on the loop, with the result the caller named for that case (`if_stopped()`, e.g. an
// UNAVAILABLE status "the daemon is stopping"): a waiter is told, never forgotten. Background
// says whether the work was taken.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <functional>
#include <memory>
#include <type_traits>
#include <utility>

#include "daemon/task_pool.h"

namespace ckpt {

class LoopTasks {
 public:
  LoopTasks(boost::asio::io_context& io, TaskPool* pool) : io_(io), pool_(pool) {}
  ~LoopTasks() { *alive_ = false; }
  LoopTasks(const LoopTasks&) = delete;
  LoopTasks& operator=(const LoopTasks&) = delete;

  // `work()` on the pool, then `then(result)` — or `then()` for void work — on the loop. If the
  // pool has stopped, `work` never runs and `then(if_stopped())` (`then()` after
  // `if_stopped()` for void work) runs on the loop instead.
  template <class Work, class Then, class IfStopped>
  void Run(Work work, Then then, IfStopped if_stopped) {
    auto shared_then = std::make_shared<Then>(std::move(then));
    const bool posted = pool_->Post(
        [io = &io_, alive = alive_, work = std::move(work), then = shared_then]() mutable {
          if constexpr (std::is_void_v<std::invoke_result_t<Work&>>) {
            work();
            boost::asio::post(*io, [alive, then = std::move(then)]() mutable {
              if (*alive) (*then)();
            });
          } else {
            auto result = work();
            boost::asio::post(
                *io, [alive, then = std::move(then), result = std::move(result)]() mutable {
                  if (*alive) (*then)(std::move(result));
                });
          }
        });
    if (posted) return;
    Later([then = std::move(shared_then), if_stopped = std::move(if_stopped)]() mutable {
      if constexpr (std::is_void_v<std::invoke_result_t<Work&>>) {
        if_stopped();
        (*then)();
      } else {
        (*then)(if_stopped());
      }
    });
  }

  // `work()` on the pool, nothing back. false: the pool has stopped; `work` was destroyed unrun.
  [[nodiscard]] bool Background(std::function<void()> work) { return pool_->Post(std::move(work)); }

  // Destroys `garbage` on the pool instead of here on the loop: O(tensors) frees (a step's
  // captures, a pruned step's manifest) stay off the path of the trainer's next request. Freed
  // here after all once the pool has stopped.
  template <class T>
  void FreeInBackground(T garbage) {
    auto box = std::make_shared<T>(std::move(garbage));
    static_cast<void>(Background([box = std::move(box)]() mutable { box.reset(); }));
  }

  // `f()` on the loop after the running handler returns, unless the owner is gone by then.
  void Later(std::function<void()> f) {
    boost::asio::post(io_, [alive = alive_, f = std::move(f)] {
      if (*alive) f();
    });
  }

  // Wraps `f` so that calling it from any thread runs it on the loop (Later).
  template <class F>
  auto OnLoop(F f) {
    return [io = &io_, alive = alive_, f = std::move(f)](auto&&... args) {
      boost::asio::post(*io, [alive, f, args...] {
        if (*alive) f(args...);
      });
    };
  }

 private:
  boost::asio::io_context& io_;
  TaskPool* pool_;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace ckpt
