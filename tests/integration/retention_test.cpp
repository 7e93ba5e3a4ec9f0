// Retention and the operator's checkpoint operations on real processes: a daemon with the
// embedded coordinator keeps milestones (--keep-every) whatever --keep says; `ckptctl pin` keeps
// a step from retention across a daemon restart and `unpin` hands it back to the next commit;
// `ckptctl delete` refuses the newest committed step and removes an older one so that `list`
// and `verify` no longer see it; pin of a missing step and hostile job names are clear errors;
// admin-read-only refuses all three, and release-job too. Under a global coordinator the daemon
// refuses them naming the coordinator, which serves them itself.
#include "tests/integration/coordinator_harness.h"  // first: it configures Catch

#include <sys/mman.h>

#include <filesystem>
#include <optional>

#include "common/step_layout.h"

namespace {

using ckpt::UniqueFd;
using ckpt::itest::CoordinatorProcess;
using ckpt::itest::DaemonProcess;
using ckpt::itest::ExitedWith;
using ckpt::itest::RunCkptctl;
using ckpt::testing::TempDir;

constexpr uint64_t kFloats = 1024;
constexpr uint64_t kBytes = kFloats * 4;

// One rank of a job with one tensor "w" of kFloats floats in a memfd.
class Trainer {
 public:
  Trainer(const DaemonProcess& daemon, const std::string& job)
      : fd_(::memfd_create("retention_itest", MFD_CLOEXEC)) {
    REQUIRE(fd_);
    REQUIRE(::ftruncate(fd_.get(), kBytes) == 0);
    void* p = ::mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_.get(), 0);
    REQUIRE(p != MAP_FAILED);
    data_ = static_cast<float*>(p);
    client_ = daemon.Connect(job);
    ckpt::HostTensor t;
    t.name = "w";
    t.dtype = "float32";
    t.global_shape = {kFloats};
    t.fd = fd_.get();
    t.nbytes = kBytes;
    REQUIRE_OK(client_->Register({&t, 1}));
  }
  ~Trainer() { ::munmap(data_, kBytes); }

  // Saves `step` and returns once it is committed (retention after it has run by then: the
  // commit event follows the commit engine's retention).
  void Commit(uint64_t step) {
    INFO("step " << step);
    for (uint64_t i = 0; i < kFloats; ++i) data_[i] = static_cast<float>(step * 1000 + i);
    REQUIRE_OK(client_->Save(step));
    REQUIRE_OK(client_->Wait(step, ckpt::WaitState::kCommitted));
  }

 private:
  UniqueFd fd_;
  float* data_ = nullptr;
  std::unique_ptr<ckpt::Client> client_;
};

// The committed steps as the daemon's admin API lists them (ckptctl list --json would quote
// 64-bit integers; the text form is simpler to read back): "  3  (latest)  (pinned)" lines.
std::string List(const TempDir& dir, const std::string& admin, const std::string& job) {
  auto [rc, out] = RunCkptctl(dir, {"--admin", admin, "list", job});
  INFO(out);
  REQUIRE(rc == 0);
  return out;
}

std::vector<uint64_t> Committed(const std::string& root, const std::string& job) {
  auto steps = ckpt::ListCommittedSteps(ckpt::PosixFileSystem(), ckpt::JobDir(root, job));
  REQUIRE(steps.ok());
  return *steps;
}

}  // namespace

TEST_CASE("retention: milestones survive --keep, a pin survives retention and restarts",
          "[daemon][ops][retention]") {
  TempDir dir;
  auto options = DaemonProcess::InDir(dir);
  options.flags = {"--keep", "1", "--keep-every", "4"};
  std::optional<DaemonProcess> daemon;
  daemon.emplace(options);
  const std::string admin = "unix:" + daemon->admin_socket();
  const std::string root = daemon->root();
  {
    Trainer trainer(*daemon, "ret");
    trainer.Commit(1);
    trainer.Commit(2);
    auto [rc, out] = RunCkptctl(dir, {"--admin", admin, "pin", "ret", "2"});
    INFO(out);
    REQUIRE(rc == 0);
    CHECK_THAT(out, Catch::Contains("pinned"));
    trainer.Commit(3);  // window 1, 3: step 1 goes; pinned 2 stays outside the window
    CHECK(Committed(root, "ret") == std::vector<uint64_t>{2, 3});
    trainer.Commit(4);  // a milestone
    trainer.Commit(5);  // window 3, 5: step 3 goes
    CHECK(Committed(root, "ret") == std::vector<uint64_t>{2, 4, 5});
    const std::string listed = List(dir, admin, "ret");
    CHECK_THAT(listed, Catch::Contains("  2  (pinned)"));
    CHECK_THAT(listed, Catch::Contains("  5  (latest)"));
  }

  // The pin is a file in the step directory: a restarted daemon still honours it.
  REQUIRE(ExitedWith(daemon->Terminate(), 0));
  daemon.reset();
  daemon.emplace(options);
  {
    CHECK_THAT(List(dir, admin, "ret"), Catch::Contains("  2  (pinned)"));
    Trainer trainer(*daemon, "ret");
    trainer.Commit(6);  // window 5, 6: step 5 goes
    CHECK(Committed(root, "ret") == std::vector<uint64_t>{2, 4, 6});

    auto [rc, out] = RunCkptctl(dir, {"--admin", admin, "unpin", "ret", "2"});
    INFO(out);
    REQUIRE(rc == 0);
    CHECK(Committed(root, "ret") == std::vector<uint64_t>{2, 4, 6});  // nothing removed yet
    trainer.Commit(7);  // window 2, 6, 7: steps 2 and 6 go; milestone 4 stays
    CHECK(Committed(root, "ret") == std::vector<uint64_t>{4, 7});
    CHECK_FALSE(std::filesystem::exists(ckpt::StepDir(root, "ret", 2)));
  }
  REQUIRE(ExitedWith(daemon->Terminate(), 0));
}

TEST_CASE("retention: ckptctl delete refuses the newest step and removes an older one",
          "[daemon][ops][retention]") {
  TempDir dir;
  DaemonProcess daemon(DaemonProcess::InDir(dir));
  const std::string admin = "unix:" + daemon.admin_socket();
  const std::string root = daemon.root();
  Trainer trainer(daemon, "del");
  for (uint64_t s = 1; s <= 3; ++s) trainer.Commit(s);

  SECTION("the newest committed step is refused, and stays") {
    auto [rc, out] = RunCkptctl(dir, {"--admin", admin, "delete", "del", "3"});
    INFO(out);
    CHECK(rc == 1);
    CHECK_THAT(out, Catch::Contains("FAILED_PRECONDITION"));
    CHECK_THAT(out, Catch::Contains("newest"));
    CHECK_THAT(out, Catch::Contains("'del' step 3"));
    CHECK(Committed(root, "del") == std::vector<uint64_t>{1, 2, 3});
  }
  SECTION("an older step is deleted; list and verify no longer see it") {
    const std::string step1 = ckpt::StepDir(root, "del", 1);
    auto [vrc, vout] = RunCkptctl(dir, {"verify", step1});
    INFO(vout);
    REQUIRE(vrc == 0);
    auto [rc, out] = RunCkptctl(dir, {"--admin", admin, "delete", "del", "1"});
    INFO(out);
    REQUIRE(rc == 0);
    CHECK_THAT(out, Catch::Contains("deleted"));
    CHECK_FALSE(std::filesystem::exists(step1));
    const std::string listed = List(dir, admin, "del");
    CHECK_THAT(listed, Catch::Contains("2 committed checkpoints"));
    CHECK_THAT(listed, !Catch::Contains("  1\n"));
    auto [vrc2, vout2] = RunCkptctl(dir, {"verify", step1});
    INFO(vout2);
    CHECK(vrc2 != 0);
    // Again: it is gone.
    auto [rc2, out2] = RunCkptctl(dir, {"--admin", admin, "delete", "del", "1"});
    INFO(out2);
    CHECK(rc2 == 1);
    CHECK_THAT(out2, Catch::Contains("NOT_FOUND"));
    // The job goes on: the next save commits.
    trainer.Commit(4);
    CHECK(Committed(root, "del") == std::vector<uint64_t>{2, 3, 4});
  }
  SECTION("a pinned step is refused until unpinned") {
    REQUIRE(RunCkptctl(dir, {"--admin", admin, "pin", "del", "2"}).first == 0);
    auto [rc, out] = RunCkptctl(dir, {"--admin", admin, "delete", "del", "2"});
    INFO(out);
    CHECK(rc == 1);
    CHECK_THAT(out, Catch::Contains("pinned"));
    REQUIRE(RunCkptctl(dir, {"--admin", admin, "unpin", "del", "2"}).first == 0);
    CHECK(RunCkptctl(dir, {"--admin", admin, "delete", "del", "2"}).first == 0);
    CHECK(Committed(root, "del") == std::vector<uint64_t>{1, 3});
  }
  SECTION("a step in flight (no MANIFEST yet) is refused and left alone") {
    const std::string in_flight = ckpt::StepDir(root, "del", 9);
    std::filesystem::create_directories(in_flight);
    auto [rc, out] = RunCkptctl(dir, {"--admin", admin, "delete", "del", "9"});
    INFO(out);
    CHECK(rc == 1);
    CHECK_THAT(out, Catch::Contains("not committed"));
    CHECK(std::filesystem::exists(in_flight));
  }
  SECTION("pin of a step that does not exist is NOT_FOUND naming it") {
    auto [rc, out] = RunCkptctl(dir, {"--admin", admin, "pin", "del", "77"});
    INFO(out);
    CHECK(rc == 1);
    CHECK_THAT(out, Catch::Contains("NOT_FOUND"));
    CHECK_THAT(out, Catch::Contains("step 77"));
    auto [rc2, out2] = RunCkptctl(dir, {"--admin", admin, "unpin", "del", "1"});
    INFO(out2);
    CHECK(rc2 == 1);
    CHECK_THAT(out2, Catch::Contains("not pinned"));
  }
  SECTION("hostile job names are refused as such") {
    for (const std::string job : {"../del", "del/../../x", ".."}) {
      for (const std::string verb : {"pin", "unpin", "delete"}) {
        auto [rc, out] = RunCkptctl(dir, {"--admin", admin, verb, job, "1"});
        INFO(verb << " " << job << ": " << out);
        CHECK(rc == 1);
        CHECK_THAT(out, Catch::Contains("INVALID_ARGUMENT"));
      }
    }
    CHECK(Committed(root, "del") == std::vector<uint64_t>{1, 2, 3});
  }
  CHECK(daemon.Alive());
}

TEST_CASE("retention: admin-read-only refuses pin, unpin, delete and release-job but still lists",
          "[daemon][ops][retention][access]") {
  TempDir dir;
  auto options = DaemonProcess::InDir(dir);
  options.flags = {"--admin-read-only"};
  DaemonProcess daemon(options);
  const std::string admin = "unix:" + daemon.admin_socket();
  Trainer trainer(daemon, "ro");
  trainer.Commit(1);
  trainer.Commit(2);
  for (const std::string verb : {"pin", "unpin", "delete"}) {
    auto [rc, out] = RunCkptctl(dir, {"--admin", admin, verb, "ro", "1"});
    INFO(verb << ": " << out);
    CHECK(rc == 1);
    CHECK_THAT(out, Catch::Contains("PERMISSION_DENIED"));
    CHECK_THAT(out, Catch::Contains("read-only"));
  }
  {
    auto [rc, out] = RunCkptctl(dir, {"--admin", admin, "release-job", "ro"});
    INFO(out);
    CHECK(rc == 1);
    CHECK_THAT(out, Catch::Contains("PERMISSION_DENIED"));
  }
  CHECK(Committed(daemon.root(), "ro") == std::vector<uint64_t>{1, 2});
  CHECK_THAT(List(dir, admin, "ro"), Catch::Contains("2 committed checkpoints"));
}

TEST_CASE("retention: under a global coordinator the coordinator pins and deletes",
          "[coordinator][ops][retention]") {
  TempDir dir;
  CoordinatorProcess::Options c;
  c.socket = dir / "coord.sock";
  c.storage_root = dir / "root";
  c.log_path = dir / "coordinator.log";
  c.flags = {"--keep", "1"};
  CoordinatorProcess coordinator(c);
  auto options = DaemonProcess::InDir(dir);
  options.flags = {"--node-id", "n0", "--coordinator", coordinator.address()};
  DaemonProcess daemon(options);
  Trainer trainer(daemon, "multi");
  trainer.Commit(1);

  // The daemon does not own the job's commits: it says who does.
  auto [rc, out] =
      RunCkptctl(dir, {"--admin", "unix:" + daemon.admin_socket(), "pin", "multi", "1"});
  INFO(out);
  CHECK(rc == 1);
  CHECK_THAT(out, Catch::Contains("FAILED_PRECONDITION"));
  CHECK_THAT(out, Catch::Contains(coordinator.address()));

  auto [rc2, out2] = RunCkptctl(dir, {"--admin", coordinator.address(), "pin", "multi", "1"});
  INFO(out2);
  REQUIRE(rc2 == 0);
  trainer.Commit(2);
  trainer.Commit(3);  // keep 1: step 2 goes, pinned step 1 stays
  CHECK(Committed(c.storage_root, "multi") == std::vector<uint64_t>{1, 3});
  auto [rc3, out3] = RunCkptctl(dir, {"--admin", coordinator.address(), "delete", "multi", "3"});
  INFO(out3);
  CHECK(rc3 == 1);
  CHECK_THAT(out3, Catch::Contains("newest"));
  REQUIRE(RunCkptctl(dir, {"--admin", coordinator.address(), "unpin", "multi", "1"}).first == 0);
  REQUIRE(RunCkptctl(dir, {"--admin", coordinator.address(), "delete", "multi", "1"}).first == 0);
  CHECK(Committed(c.storage_root, "multi") == std::vector<uint64_t>{3});
}
