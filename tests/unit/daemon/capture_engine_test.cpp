// CaptureEngine and FlushEngine around Stop (daemon/capture_engine.h, flush_engine.h): a job
// submitted before Stop is captured and persisted (Stop lets it finish), and a job handed to a
// stopped engine fails at once — it reports captured and persisted with UNAVAILABLE "the daemon
// is stopping", its pool slots go back, and no file is made — instead of waiting forever for a
// thread that is gone. Host memory in memfds (test_registrations.h), a real directory; the
// futures' deadline only turns a hang into a failure.
#include "daemon/capture_engine.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <future>
#include <memory>
#include <string>

#include "common/file_system.h"
#include "daemon/flush_engine.h"
#include "daemon/host_pool.h"
#include "tests/test_util.h"
#include "tests/unit/daemon/test_registrations.h"

namespace ckpt {
namespace {

using Catch::Matchers::Contains;

constexpr auto kHang = std::chrono::seconds(30);
constexpr uint32_t kSlots = 8;

// A host pool of kSlots 4 KiB slots, with started flush (2 writers) and capture (1 copier) engines.
struct Engines {
  testing::TempDir dir;
  TestRegistrations registrations;
  std::unique_ptr<HostPool> pool;
  std::unique_ptr<FlushEngine> flush;
  std::unique_ptr<CaptureEngine> capture;

  Engines() {
    auto p = HostPool::Create(
        HostPool::Config{.size = kSlots * 4096, .slot_size = 4096, .lock_memory = false});
    REQUIRE(p.ok());
    pool = std::move(p).value();
    pool->SetReclaimer([] { return false; });  // no hot cache
    flush = std::make_unique<FlushEngine>(FlushEngine::Config{2}, pool.get(), nullptr);
    capture = std::make_unique<CaptureEngine>(CaptureEngine::Config{1}, pool.get(), flush.get());
    flush->Start();
    capture->Start();
  }
  ~Engines() {
    capture->Stop();
    flush->Stop();
  }

  struct Submitted {
    std::shared_ptr<CaptureJob> job;
    std::future<Status> captured;
    std::future<Status> persisted;
  };
  // Step 1 of two 4 KiB tensors (two slots), into <dir>/step/rank-0.data; `reserve`: its slots
  // taken up front, as the skip policy does.
  Submitted Submit(bool reserve) {
    auto job = std::make_shared<CaptureJob>();
    job->job = "job";
    job->step = 1;
    job->plan = registrations.Plan({"a", "b"});
    job->fs = PosixFileSystem();
    job->step_dir = dir / "step";
    job->data_file = "rank-0.data";
    job->data_path = job->step_dir + "/" + job->data_file;
    if (reserve) {
      auto slots = pool->TryAcquireMany(2, /*reclaim=*/false);
      REQUIRE(slots);
      job->reserved_slots = std::move(*slots);
    }
    auto captured = std::make_shared<std::promise<Status>>();
    auto persisted = std::make_shared<std::promise<Status>>();
    job->on_captured = [captured](Status s) { captured->set_value(std::move(s)); };
    job->on_persisted = [persisted](Status s) { persisted->set_value(std::move(s)); };
    Submitted out{job, captured->get_future(), persisted->get_future()};
    capture->Submit(job);
    return out;
  }
};

Status Outcome(std::future<Status>& f) {
  REQUIRE(f.wait_for(kHang) == std::future_status::ready);
  return f.get();
}

TEST_CASE("CaptureEngine: a job submitted before Stop is captured and persisted",
          "[capture_engine]") {
  Engines e;
  auto s = e.Submit(/*reserve=*/false);
  e.capture->Stop();  // lets the queued job run
  CHECK(Outcome(s.captured).ok());
  CHECK(Outcome(s.persisted).ok());
  CHECK(std::filesystem::file_size(s.job->data_path) == s.job->plan->layout.file_size);
  e.flush->Stop();
  CHECK(e.pool->free_slots() == kSlots);
}

TEST_CASE("CaptureEngine: a capture submitted after Stop fails its job instead of hanging",
          "[capture_engine]") {
  Engines e;
  e.capture->Stop();
  const bool reserve = GENERATE(false, true);
  INFO("slots reserved up front: " << reserve);
  auto s = e.Submit(reserve);
  const Status captured = Outcome(s.captured);
  CHECK(captured.code() == StatusCode::kUnavailable);
  CHECK_THAT(captured.message(), Contains("the daemon is stopping"));
  const Status persisted = Outcome(s.persisted);
  CHECK(persisted.code() == StatusCode::kUnavailable);
  CHECK(s.job->cancelled.load());
  CHECK(e.pool->free_slots() == kSlots);  // reserved slots went back
  CHECK_FALSE(std::filesystem::exists(s.job->step_dir));
}

TEST_CASE("FlushEngine: a capture whose writers have stopped fails its job instead of hanging",
          "[capture_engine]") {
  Engines e;
  e.flush->Stop();  // the copy threads still run; nothing they hand on can be written
  const bool reserve = GENERATE(false, true);
  INFO("slots reserved up front: " << reserve);
  auto s = e.Submit(reserve);
  const Status captured = Outcome(s.captured);
  CHECK(captured.code() == StatusCode::kUnavailable);
  CHECK_THAT(captured.message(), Contains("the daemon is stopping"));
  CHECK(Outcome(s.persisted).code() == StatusCode::kUnavailable);
  e.capture->Stop();
  CHECK(e.pool->free_slots() == kSlots);  // no slot left with a writer that is gone
  CHECK_FALSE(std::filesystem::exists(s.job->step_dir));
}

}  // namespace
}  // namespace ckpt
