#include "daemon/task_pool.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <thread>

namespace ckpt {
namespace {

// TaskPool is a WorkerPool (worker_pool_test.cpp tests the pool itself); these check the
// storage thread's defaults: one thread, in order, and nothing posted after Stop runs.
TEST_CASE("TaskPool runs in order, and Stop runs what was posted, follow-ups included",
          "[task_pool]") {
  TaskPool pool(1);
  pool.Start();
  std::vector<int> ran;  // one thread: no lock needed
  for (int i = 0; i < 100; ++i) {
    REQUIRE(pool.Post([&, i] {
      ran.push_back(i);
      if (i == 99 && !pool.Post([&] { ran.push_back(100); })) ran.push_back(-1);  // while stopping
    }));
  }
  pool.Stop();
  REQUIRE(ran.size() == 101);
  for (int i = 0; i <= 100; ++i) CHECK(ran[i] == i);
  bool late = false;
  CHECK_FALSE(pool.Post([&] { late = true; }));  // after Stop: refused
  pool.Stop();
  CHECK_FALSE(late);
}

TEST_CASE("TaskPool::Stop from several threads at once joins once", "[task_pool]") {
  for (int round = 0; round < 50; ++round) {
    TaskPool pool(2);
    pool.Start();
    std::atomic<int> ran{0};
    for (int i = 0; i < 20; ++i) REQUIRE(pool.Post([&] { ran.fetch_add(1); }));
    std::thread a([&] { pool.Stop(); });
    std::thread b([&] { pool.Stop(); });
    pool.Stop();
    a.join();
    b.join();
    CHECK(ran.load() == 20);
  }
}

}  // namespace
}  // namespace ckpt
