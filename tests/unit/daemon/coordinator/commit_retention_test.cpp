// CommitEngine's retention rule and operator operations (daemon/coordinator/commit_engine.h):
// milestones (keep-every) and operator-pinned steps sit outside the rolling window that `keep`
// counts, the newest committed step is never removed, a step a load holds is skipped; Pin writes
// a durable marker a second engine on the same root honours; Delete refuses the newest committed
// step, uncommitted and pinned steps, and bad job names.
#include <filesystem>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "common/file_system.h"
#include "common/step_layout.h"
#include "daemon/coordinator/commit_engine.h"
#include "tests/checkpoint_builder.h"
#include "tests/test_util.h"

namespace ckpt {
namespace {

namespace pb = ckptd::v1;
using testing::TempDir;

const LayoutOptions kLayout{.checksum_chunk = 4096, .slot_size = 16384};
const std::string kJob = "job";

std::vector<uint64_t> Victims(std::vector<uint64_t> committed, std::set<uint64_t> pinned,
                              std::set<uint64_t> held, uint32_t keep, uint32_t keep_every) {
  return CommitEngine::RetentionVictims(committed, pinned, held, keep, keep_every);
}

std::vector<uint64_t> Range(uint64_t first, uint64_t last) {
  std::vector<uint64_t> out;
  for (uint64_t s = first; s <= last; ++s) out.push_back(s);
  return out;
}

// A one-rank step directory as the flush engine leaves it, and its node manifest.
struct Fixture {
  TempDir dir;
  std::string root = dir / "root";

  std::vector<pb::NodeManifest> WriteStep(uint64_t step) {
    testing::NoSyncFileSystem nosync;
    std::mt19937_64 rng(step);
    testing::TestTensor t;
    t.name = "w";
    t.shape = {256};
    t.data = testing::RandomBytes(rng, 256 * 4);
    auto g = ShardGeometry::Box(t.shape, {0}, {256});
    REQUIRE_OK(g);
    t.shards.push_back({*g, 0});
    const std::string step_dir = StepDir(root, kJob, step);
    auto m = testing::WriteTestCheckpoint(&nosync, step_dir, kJob, step, 1, {t}, kLayout);
    REQUIRE_OK(m);
    std::filesystem::remove(step_dir + "/" + std::string(kManifestFileName));
    pb::NodeManifest n;
    n.set_format_version(m->format_version());
    n.set_job(kJob);
    n.set_step(step);
    n.set_world_size(1);
    n.set_node_id("a");
    for (const auto& tensor : m->tensors()) *n.add_tensors() = tensor;
    *n.add_ranks() = m->ranks(0);
    return {n};
  }

  void Commit(CommitEngine& engine, uint64_t step) { REQUIRE_OK(engine.Commit(WriteStep(step))); }
};

std::vector<uint64_t> Listed(const CommitEngine& engine) {
  auto steps = engine.List(kJob);
  REQUIRE_OK(steps);
  return *steps;
}

CommitEngine::Config EngineConfig(const std::string& root, uint32_t keep, uint32_t keep_every) {
  CommitEngine::Config c;
  c.storage_root = root;
  c.keep = keep;
  c.keep_every = keep_every;
  c.writer = "test";
  return c;
}

}  // namespace

TEST_CASE("RetentionVictims: keep counts only the rolling steps, milestones stay",
          "[daemon][commit_engine][retention]") {
  // keep 0: everything stays, milestones or not.
  CHECK(Victims(Range(1, 10), {}, {}, 0, 5).empty());
  // No milestones: the oldest go.
  CHECK(Victims(Range(1, 5), {}, {}, 2, 0) == std::vector<uint64_t>{1, 2, 3});
  // keep-every 4: 4 and 8 are kept for good and do not count towards keep.
  CHECK(Victims(Range(1, 10), {}, {}, 2, 4) == std::vector<uint64_t>{1, 2, 3, 5, 6, 7});
  // A newest step that is a milestone is still the newest: kept, and the window keeps 2 more.
  CHECK(Victims(Range(1, 8), {}, {}, 2, 4) == std::vector<uint64_t>{1, 2, 3, 5});
  // Step 0 is a multiple of everything: a milestone.
  CHECK(Victims({0, 1, 2, 3}, {}, {}, 1, 10) == std::vector<uint64_t>{1, 2});
}

TEST_CASE("RetentionVictims: pinned steps are outside the window, held ones are skipped",
          "[daemon][commit_engine][retention]") {
  // Pinned 2: kept, and the window (1, 3, 4, 5) still keeps its newest 2.
  CHECK(Victims(Range(1, 5), {2}, {}, 2, 0) == std::vector<uint64_t>{1, 3});
  // Held 1 (a load reads it): skipped, the next oldest go in its place; it counts among the 2.
  CHECK(Victims(Range(1, 4), {}, {1}, 2, 0) == std::vector<uint64_t>{2, 3});
  // Never the newest committed step, even when everything older is held.
  CHECK(Victims(Range(1, 3), {}, {1, 2}, 1, 0).empty());
  // Pinned, milestone and held at once.
  CHECK(Victims(Range(1, 9), {5}, {1}, 1, 3) == std::vector<uint64_t>{2, 4, 7, 8});
}

TEST_CASE("CommitEngine: milestones survive keep across commits",
          "[daemon][commit_engine][retention]") {
  Fixture f;
  CommitEngine engine(EngineConfig(f.root, 1, 3), PosixFileSystem());
  for (uint64_t s = 1; s <= 7; ++s) f.Commit(engine, s);
  CHECK(Listed(engine) == std::vector<uint64_t>{3, 6, 7});
  CHECK_FALSE(std::filesystem::exists(StepDir(f.root, kJob, 5)));
}

TEST_CASE("CommitEngine: an operator pin is durable and keeps a step until unpinned",
          "[daemon][commit_engine][retention]") {
  Fixture f;
  {
    CommitEngine engine(EngineConfig(f.root, 1, 0), PosixFileSystem());
    f.Commit(engine, 1);
    REQUIRE_OK(engine.PinForOperator(kJob, 1));
    REQUIRE_OK(engine.PinForOperator(kJob, 1));  // again: not an error
    CHECK(std::filesystem::exists(StepDir(f.root, kJob, 1) + "/" + std::string(kPinnedFileName)));
    f.Commit(engine, 2);
    f.Commit(engine, 3);
    CHECK(Listed(engine) == std::vector<uint64_t>{1, 3});
  }
  // A new engine on the same root (a restarted daemon or coordinator) honours the marker.
  CommitEngine engine(EngineConfig(f.root, 1, 0), PosixFileSystem());
  auto pinned = engine.ListPinned(kJob);
  REQUIRE_OK(pinned);
  CHECK(*pinned == std::vector<uint64_t>{1});
  f.Commit(engine, 4);
  CHECK(Listed(engine) == std::vector<uint64_t>{1, 4});

  REQUIRE_OK(engine.UnpinForOperator(kJob, 1));
  auto again = engine.UnpinForOperator(kJob, 1);
  CHECK(again.code() == StatusCode::kFailedPrecondition);
  CHECK(Listed(engine) == std::vector<uint64_t>{1, 4});  // unpinning removes nothing by itself
  f.Commit(engine, 5);
  CHECK(Listed(engine) == std::vector<uint64_t>{5});
}

TEST_CASE("CommitEngine: pin of a step that is not committed is NOT_FOUND naming it",
          "[daemon][commit_engine][retention]") {
  Fixture f;
  CommitEngine engine(EngineConfig(f.root, 0, 0), PosixFileSystem());
  f.Commit(engine, 1);
  Status missing = engine.PinForOperator(kJob, 7);
  CHECK(missing.code() == StatusCode::kNotFound);
  CHECK_THAT(missing.message(), Catch::Matchers::Contains("step 7"));
  CHECK_THAT(missing.message(), Catch::Matchers::Contains("'job'"));
  f.WriteStep(2);  // in flight: data and node manifest, no MANIFEST
  CHECK(engine.PinForOperator(kJob, 2).code() == StatusCode::kNotFound);
  CHECK_FALSE(
      std::filesystem::exists(StepDir(f.root, kJob, 2) + "/" + std::string(kPinnedFileName)));
}

TEST_CASE("CommitEngine: delete refuses the newest, uncommitted and pinned steps",
          "[daemon][commit_engine][retention]") {
  Fixture f;
  CommitEngine engine(EngineConfig(f.root, 0, 0), PosixFileSystem());
  for (uint64_t s = 1; s <= 3; ++s) f.Commit(engine, s);
  f.WriteStep(4);  // in flight

  Status newest = engine.DeleteCommitted(kJob, 3);
  CHECK(newest.code() == StatusCode::kFailedPrecondition);
  CHECK_THAT(newest.message(), Catch::Matchers::Contains("newest"));
  Status in_flight = engine.DeleteCommitted(kJob, 4);
  CHECK(in_flight.code() == StatusCode::kFailedPrecondition);
  CHECK_THAT(in_flight.message(), Catch::Matchers::Contains("not committed"));
  CHECK(std::filesystem::exists(StepDir(f.root, kJob, 4)));
  CHECK(engine.DeleteCommitted(kJob, 9).code() == StatusCode::kNotFound);

  REQUIRE_OK(engine.PinForOperator(kJob, 1));
  CHECK(engine.DeleteCommitted(kJob, 1).code() == StatusCode::kFailedPrecondition);
  engine.Pin(kJob, 2);  // a load reads step 2
  CHECK(engine.DeleteCommitted(kJob, 2).code() == StatusCode::kFailedPrecondition);
  engine.Unpin(kJob, 2);

  REQUIRE_OK(engine.DeleteCommitted(kJob, 2));
  CHECK_FALSE(std::filesystem::exists(StepDir(f.root, kJob, 2)));
  CHECK(Listed(engine) == std::vector<uint64_t>{1, 3});
  CHECK(engine.DeleteCommitted(kJob, 2).code() == StatusCode::kNotFound);
}

TEST_CASE("CommitEngine: operator operations refuse hostile job names",
          "[daemon][commit_engine][retention]") {
  Fixture f;
  CommitEngine engine(EngineConfig(f.root, 0, 0), PosixFileSystem());
  for (const std::string job : {"../job", "", "a/b", ".."}) {
    INFO("job '" << job << "'");
    CHECK(engine.PinForOperator(job, 1).code() == StatusCode::kInvalidArgument);
    CHECK(engine.UnpinForOperator(job, 1).code() == StatusCode::kInvalidArgument);
    CHECK(engine.DeleteCommitted(job, 1).code() == StatusCode::kInvalidArgument);
  }
}

}  // namespace ckpt
