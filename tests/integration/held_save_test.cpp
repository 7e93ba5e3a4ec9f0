// Held saves (local protocol 3: Save.hold, Save.replace_held, ConfirmSave) against a real
// ckptd: the daemon reads none of a held save's memory until it is confirmed, a replacement
// saves what the new registration describes, and a held save that is never confirmed ends like
// any uncaptured one — aborted, its reserved pool slots back.
#include "tests/integration/daemon_harness.h"  // first: it configures Catch

#include <chrono>
#include <string>

namespace {

namespace pb = ::ckptd::v1;
using ckpt::itest::DaemonProcess;
using ckpt::itest::InProcessRank;
using ckpt::itest::RawConnection;
using ckpt::itest::RequireTrainerStep;
using ckpt::testing::TempDir;
using std::chrono::milliseconds;
using std::chrono::seconds;

ckpt::SaveOptions Held(std::string_view extra, bool* held) {
  ckpt::SaveOptions options;
  options.extra = extra;
  options.hold = true;
  options.held = held;
  return options;
}

}  // namespace

TEST_CASE("held save: nothing is read until the confirm, and then the memory as it is",
          "[daemon][held]") {
  TempDir dir;
  DaemonProcess daemon(DaemonProcess::InDir(dir));
  const uint64_t seed = ckpt::testing::TestSeed() + 31;
  InProcessRank rank(4ull << 20, 2, 0, 1, seed);
  auto c = daemon.Connect("held");
  REQUIRE(c->protocol() >= 3);
  REQUIRE_OK(c->Register(rank.Specs()));

  // Step 7's values are not in the memory yet when the save goes out held.
  rank.Fill(6);
  bool held = false;
  const std::string extra = rank.Extra(7);
  REQUIRE_OK(c->Save(7, Held(extra, &held)));
  CHECK(held);
  // Held, it cannot be captured: an unheld 4 MiB capture takes a few milliseconds.
  const ckpt::Status waited = c->Wait(7, ckpt::WaitState::kCaptured, milliseconds(300));
  CHECK(waited.code() == ckpt::StatusCode::kDeadlineExceeded);
  // One held save at a time: another step is refused until this one is confirmed.
  CHECK(c->Save(8, rank.Extra(8)).code() == ckpt::StatusCode::kFailedPrecondition);

  rank.Fill(7);
  REQUIRE_OK(c->ConfirmSave(7));
  REQUIRE_OK(c->WaitSnapshot(seconds(60)));
  REQUIRE_OK(c->Wait(7, ckpt::WaitState::kCommitted, seconds(60)));
  RequireTrainerStep(daemon.root(), "held", 7, 4ull << 20, 2, 1, seed);
  // Nothing is held any more.
  CHECK(c->ConfirmSave(7).code() == ckpt::StatusCode::kFailedPrecondition);
}

TEST_CASE("held save: a replacement saves what the new registration describes", "[daemon][held]") {
  TempDir dir;
  DaemonProcess daemon(DaemonProcess::InDir(dir));
  const uint64_t seed = ckpt::testing::TestSeed() + 32;
  InProcessRank before(2ull << 20, 2, 0, 1, seed);
  InProcessRank after(1ull << 20, 3, 0, 1, seed);  // other memory, other tensors
  auto c = daemon.Connect("held-replace");
  REQUIRE_OK(c->Register(before.Specs()));
  before.Fill(1);
  REQUIRE_OK(c->Save(1, before.Extra(1)));
  REQUIRE_OK(c->Wait(1, ckpt::WaitState::kCommitted, seconds(60)));

  // Step 2 goes out held over the old registration; the check finds the tensors moved.
  bool held = false;
  const std::string stale_extra = before.Extra(99);
  REQUIRE_OK(c->Save(2, Held(stale_extra, &held)));
  REQUIRE(held);
  REQUIRE_OK(c->Register(after.Specs()));
  after.Fill(2);
  ckpt::SaveOptions replace;
  const std::string extra = after.Extra(2);
  replace.extra = extra;
  replace.replace_held = true;
  replace.held = &held;
  REQUIRE_OK(c->Save(2, replace));
  CHECK_FALSE(held);
  REQUIRE_OK(c->Wait(2, ckpt::WaitState::kCommitted, seconds(60)));
  // The new registration's tensors and the replacement's extra, nothing of the held save.
  RequireTrainerStep(daemon.root(), "held-replace", 2, 1ull << 20, 3, 1, seed);
  RequireTrainerStep(daemon.root(), "held-replace", 1, 2ull << 20, 2, 1, seed);
}

TEST_CASE("held save: a held save never confirmed aborts and gives its pool slots back",
          "[daemon][held]") {
  TempDir dir;
  auto options = DaemonProcess::InDir(dir);
  options.host_pool = "16MiB";
  options.slot_size = "4MiB";
  DaemonProcess daemon(options);
  const uint64_t seed = ckpt::testing::TestSeed() + 33;
  InProcessRank rank(16ull << 20, 2, 0, 1, seed);  // every slot of the pool

  {
    // on_full=skip takes its slots at the save: all four, held and never confirmed.
    auto c = daemon.Connect("held-lost");
    REQUIRE_OK(c->Register(rank.Specs()));
    bool held = false;
    ckpt::SaveOptions save = Held("", &held);
    save.on_full = ckpt::OnFull::kSkip;
    REQUIRE_OK(c->Save(1, save));
    REQUIRE(held);
    c->Close();  // the trainer dies before its check confirmed the save
  }
  auto c = daemon.Connect("held-lost");
  const ckpt::Status lost = c->Wait(1, ckpt::WaitState::kCommitted, seconds(60));
  CHECK(lost.code() == ckpt::StatusCode::kAborted);
  CHECK_THAT(lost.message(), Catch::Contains("disconnected before its snapshot"));

  // The four slots are free again: a save that needs them all is not skipped.
  REQUIRE_OK(c->Register(rank.Specs()));
  rank.Fill(2);
  REQUIRE_OK(c->Save(2, rank.Extra(2), ckpt::OnFull::kSkip));
  REQUIRE_OK(c->Wait(2, ckpt::WaitState::kCommitted, seconds(60)));
  RequireTrainerStep(daemon.root(), "held-lost", 2, 16ull << 20, 2, 1, seed);

  // An abandoned held save ends at once; a confirm that comes after it is ignored.
  bool held = false;
  REQUIRE_OK(c->Save(3, Held("", &held)));
  REQUIRE(held);
  REQUIRE_OK(c->Abandon(3, "its check failed"));
  const ckpt::Status abandoned = c->Wait(3, ckpt::WaitState::kCommitted, seconds(60));
  CHECK(abandoned.code() == ckpt::StatusCode::kAborted);
  CHECK_THAT(abandoned.message(), Catch::Contains("abandoned step 3"));
  rank.Fill(4);
  REQUIRE_OK(c->Save(4, rank.Extra(4)));
  REQUIRE_OK(c->Wait(4, ckpt::WaitState::kCommitted, seconds(60)));
}

TEST_CASE("held save: the daemon refuses a replacement with nothing held, ignores a stray confirm",
          "[daemon][held]") {
  TempDir dir;
  DaemonProcess daemon(DaemonProcess::InDir(dir));
  ckpt::UniqueFd memfd(::memfd_create("held-raw", MFD_CLOEXEC));
  REQUIRE(memfd);
  REQUIRE(::ftruncate(memfd.get(), 1 << 20) == 0);
  const int fds[] = {memfd.get()};

  RawConnection conn(daemon.socket());
  pb::ClientMessage hello;
  hello.mutable_hello()->set_protocol_version(3);
  hello.mutable_hello()->set_job("held-raw");
  hello.mutable_hello()->set_world_size(1);
  const pb::DaemonMessage hi = conn.Call(hello);
  REQUIRE(hi.hello().protocol_version() == 3);
  pb::ClientMessage reg;
  *reg.mutable_register_()->add_tensors() =
      ckpt::itest::HostSpec("w", "int32", {256, 1024}, 0, 1 << 20);
  REQUIRE(conn.Call(reg, fds).has_register_());

  // A confirm of a step nobody holds: no answer, no harm.
  pb::ClientMessage stray;
  stray.mutable_confirm_save()->set_step(5);
  conn.Send(stray);
  // A replacement with nothing held is refused.
  pb::ClientMessage replace;
  replace.mutable_save()->set_step(1);
  replace.mutable_save()->set_replace_held(true);
  const pb::DaemonMessage refused = conn.Call(replace);
  INFO(refused.ShortDebugString());
  REQUIRE(refused.has_error());
  CHECK_THAT(refused.error().message(), Catch::Contains("holds no save of the step"));
  // A held save, then a second plain save of the same step: refused, the held one stays.
  pb::ClientMessage hold;
  hold.mutable_save()->set_step(1);
  hold.mutable_save()->set_hold(true);
  const pb::DaemonMessage accepted = conn.Call(hold);
  INFO(accepted.ShortDebugString());
  REQUIRE(accepted.has_save());
  CHECK(accepted.save().held());
  pb::ClientMessage again;
  again.mutable_save()->set_step(1);
  const pb::DaemonMessage twice = conn.Call(again);
  REQUIRE(twice.has_error());
  CHECK_THAT(twice.error().message(), Catch::Contains("already saved"));
  pb::ClientMessage confirm;
  confirm.mutable_confirm_save()->set_step(1);
  conn.Send(confirm);
  pb::ClientMessage wait;
  wait.mutable_wait()->set_step(1);
  wait.mutable_wait()->set_state(pb::STEP_STATE_COMMITTED);
  const pb::DaemonMessage committed = conn.Call(wait);
  INFO(committed.ShortDebugString() << "\ndaemon log:\n" << daemon.LogTail());
  CHECK(committed.has_wait());
}
