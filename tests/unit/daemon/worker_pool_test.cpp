// WorkerPool (daemon/worker_pool.h): FIFO with one thread, at most `threads` tasks at once and
// each on its own worker index, everything posted runs before Stop returns (follow-ups posted by
// tasks while stopping included, and what was posted before a Start that never came), a Post
// after Stop returns false and releases its task unrun, and Stop from several threads at once
// returns in each only after the work is done. No sleeps: tasks that must overlap meet at a
// latch, which only they can open.
#include "daemon/worker_pool.h"

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <latch>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

namespace ckpt {
namespace {

TEST_CASE("WorkerPool with one thread runs tasks in the order they were posted", "[worker_pool]") {
  WorkerPool pool("order", 1);
  pool.Start();
  std::vector<int> ran;  // one thread: no lock needed
  for (int i = 0; i < 1000; ++i) REQUIRE(pool.Post([&ran, i] { ran.push_back(i); }));
  pool.Stop();
  REQUIRE(ran.size() == 1000);
  CHECK(std::is_sorted(ran.begin(), ran.end()));
}

TEST_CASE("WorkerPool::Stop runs every queued task, and what those tasks post, before returning",
          "[worker_pool]") {
  WorkerPool pool("chain", 2);
  pool.Start();
  constexpr int kLength = 1000;
  std::atomic<int> ran{0};
  std::atomic<int> refused{0};
  // Each link posts the next, so links go on being posted after Stop was called.
  std::function<void(int)> link = [&](int i) {
    ran.fetch_add(1);
    if (i + 1 < kLength && !pool.Post([&link, i] { link(i + 1); })) refused.fetch_add(1);
  };
  std::latch stop_called(1);
  REQUIRE(pool.Post([&] {
    stop_called.wait();
    link(0);
  }));
  std::thread stopper([&] { pool.Stop(); });
  stop_called.count_down();
  stopper.join();
  CHECK(ran.load() == kLength);
  CHECK(refused.load() == 0);
}

TEST_CASE("WorkerPool::Post after Stop returns false and releases the task without running it",
          "[worker_pool]") {
  WorkerPool pool("late", 2);
  pool.Start();
  pool.Stop();
  auto captured = std::make_shared<int>(0);
  bool ran = false;
  CHECK_FALSE(pool.Post([&ran, captured] { ran = true; }));
  CHECK_FALSE(pool.Post([&ran, captured](size_t) { ran = true; }));
  CHECK_FALSE(ran);
  CHECK(captured.use_count() == 1);  // the refused tasks were destroyed, not kept
  pool.Stop();                       // again: nothing to do
  CHECK_FALSE(ran);
}

TEST_CASE("WorkerPool stopped before it was started runs what was posted", "[worker_pool]") {
  std::atomic<int> ran{0};
  {
    WorkerPool pool("unstarted", 2);
    for (int i = 0; i < 10; ++i) REQUIRE(pool.Post([&] { ran.fetch_add(1); }));
    pool.Stop();
    CHECK(ran.load() == 10);
    pool.Start();  // after Stop: no effect
    CHECK_FALSE(pool.Post([&] { ran.fetch_add(1); }));
  }
  CHECK(ran.load() == 10);
}

TEST_CASE("WorkerPool::Stop from several threads at once returns in each once the work is done",
          "[worker_pool]") {
  for (int round = 0; round < 50; ++round) {
    WorkerPool pool("stoppers", 2);
    pool.Start();
    std::atomic<int> ran{0};
    for (int i = 0; i < 20; ++i) REQUIRE(pool.Post([&] { ran.fetch_add(1); }));
    std::atomic<int> seen_short{0};  // a Stop that returned before all 20 had run
    auto stop = [&] {
      pool.Stop();
      if (ran.load() != 20) seen_short.fetch_add(1);
    };
    std::thread a(stop);
    std::thread b(stop);
    stop();
    a.join();
    b.join();
    CHECK(ran.load() == 20);
    CHECK(seen_short.load() == 0);
  }
}

TEST_CASE("WorkerPool runs at most its thread count at once, each on its own worker index",
          "[worker_pool]") {
  constexpr int kThreads = 4;
  WorkerPool pool("index", kThreads);
  REQUIRE(pool.size() == kThreads);
  pool.Start();
  // kThreads tasks that can only finish together: they run at once, on distinct workers.
  std::latch together(kThreads);
  std::mutex mu;
  std::set<size_t> met;  // guarded by mu
  for (int i = 0; i < kThreads; ++i) {
    REQUIRE(pool.Post([&](size_t worker) {
      {
        std::lock_guard lock(mu);
        met.insert(worker);
      }
      together.arrive_and_wait();
    }));
  }
  // Then many, from several posting threads: never more than kThreads at once, indices in range.
  std::atomic<int> running{0};
  std::atomic<int> most{0};
  std::atomic<int> out_of_range{0};
  std::atomic<int> ran{0};
  std::atomic<int> refused{0};
  std::vector<std::thread> posters;  // (Catch asserts on the main thread only)
  for (int p = 0; p < 3; ++p) {
    posters.emplace_back([&] {
      for (int i = 0; i < 300; ++i) {
        const bool posted = pool.Post([&](size_t worker) {
          const int now = running.fetch_add(1) + 1;
          int seen = most.load();
          while (now > seen && !most.compare_exchange_weak(seen, now)) {
          }
          if (worker >= pool.size()) out_of_range.fetch_add(1);
          ran.fetch_add(1);
          running.fetch_sub(1);
        });
        if (!posted) refused.fetch_add(1);
      }
    });
  }
  for (auto& t : posters) t.join();
  pool.Stop();
  CHECK(met == std::set<size_t>{0, 1, 2, 3});
  CHECK(refused.load() == 0);
  CHECK(ran.load() == 900);
  CHECK(most.load() <= kThreads);
  CHECK(out_of_range.load() == 0);
}

}  // namespace
}  // namespace ckpt
