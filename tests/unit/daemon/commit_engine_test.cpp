// CommitEngine (daemon/coordinator/commit_engine.h) on real step directories: a step becomes
// visible (List, Latest, LATEST) only with its MANIFEST, LATEST only moves forward, incomplete or
// vetoed steps are not committed, RemoveStep never removes a committed step, retention keeps the
// newest N but never a pinned step, RemoveUncommitted cleans leftovers — and storage faults in
// the MANIFEST's fdatasync or rename leave no visible step and the earlier steps loadable.
#include "daemon/coordinator/commit_engine.h"

#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "common/checkpoint_reader.h"
#include "common/fault_file_system.h"
#include "common/manifest_io.h"
#include "common/manifest_merge.h"
#include "common/step_layout.h"
#include "tests/checkpoint_builder.h"
#include "tests/test_util.h"

namespace ckpt {
namespace {

namespace pb = ckptd::v1;
using Catch::Matchers::Contains;
using testing::TempDir;
using testing::TestTensor;

const LayoutOptions kLayout{.checksum_chunk = 4096, .slot_size = 16384};
constexpr uint32_t kWorld = 2;
const std::string kJob = "job";

// One float32 tensor "w" of [kWorld, 512]; rank r holds row r. Its bytes depend on `seed`.
TestTensor Tensor(uint64_t seed) {
  std::mt19937_64 rng(seed);
  TestTensor t;
  t.name = "w";
  t.shape = {kWorld, 512};
  t.data = testing::RandomBytes(rng, kWorld * 512 * 4);
  for (uint32_t r = 0; r < kWorld; ++r) {
    auto g = ShardGeometry::Box(t.shape, {r, 0}, {1, 512});
    REQUIRE_OK(g);
    t.shards.push_back({*g, r});
  }
  return t;
}

std::optional<std::string> ReadText(const std::string& path) {
  if (!std::filesystem::exists(path)) return std::nullopt;
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

struct Fixture {
  TempDir dir;
  std::string root = dir / "root";
  // What a rank's bytes of each step are, to check that a committed step still reads back.
  std::map<uint64_t, TestTensor> written;

  // The step's data files as the flush engine leaves them (no MANIFEST), and the node manifests
  // of two nodes, "a" with rank 0 and "b" with rank 1, as they would report them.
  std::vector<pb::NodeManifest> WriteStep(uint64_t step) {
    testing::NoSyncFileSystem nosync;
    TestTensor t = Tensor(step);
    const std::string step_dir = StepDir(root, kJob, step);
    auto m = testing::WriteTestCheckpoint(&nosync, step_dir, kJob, step, kWorld, {t}, kLayout);
    REQUIRE_OK(m);
    std::filesystem::remove(step_dir + "/" + std::string(kManifestFileName));
    written[step] = t;
    std::vector<pb::NodeManifest> nodes;
    for (uint32_t r = 0; r < kWorld; ++r) {
      pb::NodeManifest& n = nodes.emplace_back();
      n.set_format_version(m->format_version());
      n.set_job(kJob);
      n.set_step(step);
      n.set_world_size(kWorld);
      n.set_node_id(r == 0 ? "a" : "b");
      for (const auto& tensor : m->tensors()) {
        pb::TensorEntry* e = n.add_tensors();
        *e = tensor;
        e->clear_shards();
        for (const auto& s : tensor.shards()) {
          if (s.writer_rank() == r) *e->add_shards() = s;
        }
      }
      *n.add_ranks() = m->ranks(static_cast<int>(r));
    }
    return nodes;
  }

  // Every stored byte verifies and tensor "w" reads back as written.
  void CheckLoadable(uint64_t step) {
    INFO("step " << step);
    auto reader = CheckpointReader::Open(PosixFileSystem(), StepDir(root, kJob, step));
    REQUIRE_OK(reader);
    auto problems = (*reader)->Verify();
    REQUIRE_OK(problems);
    CHECK(problems->empty());
    const TestTensor& t = written.at(step);
    std::vector<std::byte> out(t.data.size());
    auto full = ShardGeometry::Full(t.shape);
    REQUIRE_OK(full);
    CheckpointReader::Request req{"w", *full, "float32", out, {}};
    REQUIRE_OK((*reader)->Read(std::span(&req, 1)));
    CHECK(out == t.data);
  }

  std::string Latest() const { return ReadText(JobDir(root, kJob) + "/LATEST").value_or("none"); }
  bool HasManifest(uint64_t step) const {
    return std::filesystem::exists(StepDir(root, kJob, step) + "/" +
                                   std::string(kManifestFileName));
  }
};

std::vector<uint64_t> Listed(const CommitEngine& engine) {
  auto list = engine.List(kJob);
  REQUIRE_OK(list);
  return *list;
}

std::optional<uint64_t> LatestOf(const CommitEngine& engine) {
  auto latest = engine.Latest(kJob);
  REQUIRE_OK(latest);
  return *latest;
}

TEST_CASE("CommitEngine: a step becomes visible with its MANIFEST, then LATEST names it",
          "[daemon][commit_engine]") {
  Fixture f;
  CommitEngine* engine_ptr = nullptr;
  std::vector<std::string> seen;
  CommitEngine::Config config{f.root, 0, "commit-engine-test", {}};
  config.on_point = [&](std::string_view point) {
    // What a loader or the coordinator sees at each point of the commit.
    seen.push_back(std::string(point) + ": listed " + std::to_string(Listed(*engine_ptr).size()) +
                   ", LATEST " + f.Latest());
  };
  CommitEngine engine(config, PosixFileSystem());
  engine_ptr = &engine;

  auto nodes = f.WriteStep(7);
  CHECK(Listed(engine).empty());
  CHECK_FALSE(LatestOf(engine).has_value());

  REQUIRE_OK(engine.Commit(nodes));
  CHECK(seen == std::vector<std::string>{"before-manifest: listed 0, LATEST none",
                                         "after-manifest: listed 1, LATEST none",
                                         "after-latest: listed 1, LATEST 7\n"});
  CHECK(Listed(engine) == std::vector<uint64_t>{7});
  CHECK(LatestOf(engine) == std::optional<uint64_t>(7));
  CHECK(f.Latest() == "7\n");
  auto on_disk = ReadManifest(PosixFileSystem(), StepDir(f.root, kJob, 7));
  REQUIRE_OK(on_disk);
  CHECK(on_disk->writer() == "commit-engine-test");
  CHECK(on_disk->ranks_size() == 2);
  CHECK(on_disk->created_unix_ms() > 0);
  // The engine merges on a protobuf Arena; the result is the plain merge's, field for field.
  auto merged = MergeNodeManifests(nodes);
  REQUIRE_OK(merged);
  merged->set_created_unix_ms(on_disk->created_unix_ms());
  merged->set_writer(on_disk->writer());
  CHECK(on_disk->SerializeAsString() == merged->SerializeAsString());
  f.CheckLoadable(7);
}

TEST_CASE("CommitEngine: List is ascending and LATEST never moves back to an older step",
          "[daemon][commit_engine]") {
  Fixture f;
  CommitEngine engine({f.root, 0, "test", {}}, PosixFileSystem());
  REQUIRE_OK(engine.Commit(f.WriteStep(1)));
  REQUIRE_OK(engine.Commit(f.WriteStep(3)));
  REQUIRE_OK(engine.Commit(f.WriteStep(2)));  // an older step committed after a newer one
  CHECK(Listed(engine) == std::vector<uint64_t>{1, 2, 3});
  CHECK(f.Latest() == "3\n");
  CHECK(LatestOf(engine) == std::optional<uint64_t>(3));
  CHECK(engine.List("other-job")->empty());
  CHECK_FALSE(engine.Latest("other-job")->has_value());
}

TEST_CASE("CommitEngine: a step missing a rank, or vetoed by the check, is not committed",
          "[daemon][commit_engine]") {
  Fixture f;
  CommitEngine engine({f.root, 0, "test", {}}, PosixFileSystem());
  auto nodes = f.WriteStep(4);

  SECTION("one node of two reported") {
    Status r = engine.Commit(std::span(nodes.data(), 1));
    REQUIRE_FALSE(r.ok());
    CHECK(r.code() == StatusCode::kFailedPrecondition);
    CHECK_THAT(r.message(), Contains("1 of 2 ranks reported"));
  }
  SECTION("the check vetoes the merged manifest") {
    bool asked = false;
    Status r = engine.Commit(nodes, [&](const pb::Manifest& m) {
      asked = true;
      CHECK(m.ranks_size() == 2);
      return FailedPrecondition("no writer for tensor 'x'");
    });
    CHECK(asked);
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.message(), Contains("no writer for tensor 'x'"));
    CHECK_THAT(r.message(), Contains("step 4"));
  }
  CHECK_FALSE(f.HasManifest(4));
  CHECK(Listed(engine).empty());
  CHECK(f.Latest() == "none");
  // The data stay for the caller to remove (RemoveStep), or to commit once complete.
  REQUIRE_OK(engine.Commit(nodes));
  CHECK(Listed(engine) == std::vector<uint64_t>{4});
}

TEST_CASE("CommitEngine: RemoveStep deletes an uncommitted step and refuses a committed one",
          "[daemon][commit_engine]") {
  Fixture f;
  CommitEngine engine({f.root, 0, "test", {}}, PosixFileSystem());
  REQUIRE_OK(engine.Commit(f.WriteStep(1)));
  f.WriteStep(2);  // persisted, never committed (aborted)

  REQUIRE_OK(engine.RemoveStep(kJob, 2));
  CHECK_FALSE(std::filesystem::exists(StepDir(f.root, kJob, 2)));
  REQUIRE_OK(engine.RemoveStep(kJob, 9));  // nothing there: nothing to do

  Status refused = engine.RemoveStep(kJob, 1);
  CHECK(refused.code() == StatusCode::kFailedPrecondition);
  CHECK_THAT(refused.message(), Contains("is committed"));
  CHECK(Listed(engine) == std::vector<uint64_t>{1});
  f.CheckLoadable(1);
}

TEST_CASE("CommitEngine: retention keeps the newest N and skips steps pinned by a load",
          "[daemon][commit_engine]") {
  Fixture f;
  CommitEngine engine({f.root, 2, "test", {}}, PosixFileSystem());
  REQUIRE_OK(engine.Commit(f.WriteStep(1)));
  REQUIRE_OK(engine.Commit(f.WriteStep(2)));
  CHECK(Listed(engine) == std::vector<uint64_t>{1, 2});

  engine.Pin(kJob, 1);
  engine.Pin(kJob, 1);  // two loads of it
  REQUIRE_OK(engine.Commit(f.WriteStep(3)));
  // Step 1 is being read: the next oldest goes instead.
  CHECK(Listed(engine) == std::vector<uint64_t>{1, 3});
  CHECK_FALSE(std::filesystem::exists(StepDir(f.root, kJob, 2)));
  f.CheckLoadable(1);

  engine.Unpin(kJob, 1);  // one load still reads it
  REQUIRE_OK(engine.Commit(f.WriteStep(4)));
  CHECK(Listed(engine) == std::vector<uint64_t>{1, 4});

  engine.Unpin(kJob, 1);
  engine.Unpin(kJob, 1);  // one too many: harmless
  REQUIRE_OK(engine.Commit(f.WriteStep(5)));
  CHECK(Listed(engine) == std::vector<uint64_t>{4, 5});
  CHECK_FALSE(std::filesystem::exists(StepDir(f.root, kJob, 1)));
  CHECK(f.Latest() == "5\n");
  f.CheckLoadable(4);
  f.CheckLoadable(5);
}

// Delegates to the real file system; the first open of a LATEST file after Arm runs `hook`
// first, on the opening thread: the moment between a load resolving the latest step and pinning.
class HookOnLatestFileSystem : public testing::NoSyncFileSystem {
 public:
  void Arm(std::function<void()> hook) { hook_ = std::move(hook); }
  Result<std::unique_ptr<File>> Open(const std::string& path, const OpenOptions& options) override {
    if (hook_ && path.ends_with("/" + std::string(kLatestFileName))) std::exchange(hook_, {})();
    return NoSyncFileSystem::Open(path, options);
  }
  Status SyncDir(const std::string& path) override { return PosixFileSystem()->SyncDir(path); }

 private:
  std::function<void()> hook_;
};

TEST_CASE("CommitEngine: retention never removes the step PinLatest is resolving",
          "[daemon][commit_engine]") {
  // keep 1: committing step 2 retires step 1 unless a load pinned it. The commit of step 2 is
  // started while PinLatest is between reading the job's steps and pinning one. With resolve
  // and pin as one step, that commit's retention waits for the pin, so step 1 stays loadable;
  // were they two steps, retention would remove step 1 before the pin (the load would then find
  // no MANIFEST), which the 2-second wait below gives it every chance to do.
  Fixture f;
  HookOnLatestFileSystem fs;
  CommitEngine engine({f.root, 1, "test", {}}, &fs);
  REQUIRE_OK(engine.Commit(f.WriteStep(1)));
  auto step2 = f.WriteStep(2);
  std::future<Status> commit2;
  fs.Arm([&] {
    commit2 = std::async(std::launch::async, [&] { return engine.Commit(step2); });
    commit2.wait_for(std::chrono::seconds(2));
  });
  auto pinned = engine.PinLatest(kJob);
  REQUIRE_OK(pinned);
  REQUIRE(commit2.valid());
  REQUIRE_OK(commit2.get());
  REQUIRE(*pinned);
  f.CheckLoadable(**pinned);
  CHECK(Listed(engine) == std::vector<uint64_t>{1, 2});  // step 1 kept while pinned
  engine.Unpin(kJob, **pinned);
  REQUIRE_OK(engine.Commit(f.WriteStep(3)));
  CHECK(Listed(engine) == std::vector<uint64_t>{3});
}

TEST_CASE("CommitEngine: retention of 1 never removes the newest step, nor one in flight",
          "[daemon][commit_engine]") {
  Fixture f;
  CommitEngine engine({f.root, 1, "test", {}}, PosixFileSystem());
  REQUIRE_OK(engine.Commit(f.WriteStep(1)));
  auto in_flight = f.WriteStep(3);  // persisted, not committed yet
  REQUIRE_OK(engine.Commit(f.WriteStep(2)));
  CHECK(Listed(engine) == std::vector<uint64_t>{2});
  CHECK(std::filesystem::exists(StepDir(f.root, kJob, 3) + "/rank-00000.data"));
  REQUIRE_OK(engine.Commit(in_flight));
  CHECK(Listed(engine) == std::vector<uint64_t>{3});
  f.CheckLoadable(3);
}

TEST_CASE("CommitEngine: RemoveUncommitted removes step directories without MANIFEST and temps",
          "[daemon][commit_engine]") {
  Fixture f;
  CommitEngine engine({f.root, 0, "test", {}}, PosixFileSystem());
  REQUIRE_OK(engine.Commit(f.WriteStep(1)));
  f.WriteStep(2);
  { std::ofstream(JobDir(f.root, kJob) + "/LATEST.tmp") << "2\n"; }
  std::ofstream(f.root + "/stray-file") << "not a job";

  auto removed = engine.RemoveUncommitted();
  REQUIRE_OK(removed);
  CHECK(removed->size() == 2);
  CHECK_FALSE(std::filesystem::exists(StepDir(f.root, kJob, 2)));
  CHECK_FALSE(std::filesystem::exists(JobDir(f.root, kJob) + "/LATEST.tmp"));
  CHECK(std::filesystem::exists(f.root + "/stray-file"));
  CHECK(Listed(engine) == std::vector<uint64_t>{1});
  f.CheckLoadable(1);

  TempDir empty;
  CommitEngine nothing({empty / "absent", 0, "test", {}}, PosixFileSystem());
  auto none = nothing.RemoveUncommitted();
  REQUIRE_OK(none);
  CHECK(none->empty());
}

// The POSIX filesystem whose Rename onto a path ending in `target` fails with EIO once armed.
class FailingRenameFileSystem : public testing::NoSyncFileSystem {
 public:
  explicit FailingRenameFileSystem(std::string target) : target_(std::move(target)) {}
  Status Rename(const std::string& from, const std::string& to) override {
    if (armed && to.ends_with(target_)) return ErrnoStatus(EIO, "rename " + from + " to " + to);
    return NoSyncFileSystem::Rename(from, to);
  }
  bool armed = false;

 private:
  std::string target_;
};

TEST_CASE(
    "CommitEngine: a failed MANIFEST fdatasync or rename leaves no visible step and the "
    "earlier steps loadable",
    "[daemon][commit_engine][storage]") {
  Fixture f;
  FaultInjectingFileSystem faults(PosixFileSystem());
  FailingRenameFileSystem failing_rename("/" + std::string(kManifestFileName));
  const bool fail_rename = GENERATE(false, true);
  INFO((fail_rename ? "rename fails" : "fdatasync fails"));
  FileSystem* fs = fail_rename ? static_cast<FileSystem*>(&failing_rename) : &faults;
  CommitEngine engine({f.root, 0, "test", {}}, fs);
  REQUIRE_OK(engine.Commit(f.WriteStep(1)));

  auto nodes = f.WriteStep(2);
  faults.LimitFaultsTo(std::string(kManifestFileName));
  faults.FailDataSync(true);
  failing_rename.armed = true;
  auto r = engine.Commit(nodes);
  REQUIRE_FALSE(r.ok());
  CHECK(r.sys_errno() == EIO);
  CHECK_THAT(r.message(), Contains("step 2"));

  CHECK_FALSE(f.HasManifest(2));
  CHECK_FALSE(std::filesystem::exists(StepDir(f.root, kJob, 2) + "/MANIFEST.tmp"));
  CHECK(Listed(engine) == std::vector<uint64_t>{1});
  CHECK(LatestOf(engine) == std::optional<uint64_t>(1));
  CHECK(f.Latest() == "1\n");
  f.CheckLoadable(1);

  // The failed step is an uncommitted leftover: removable, and the next step commits.
  REQUIRE_OK(engine.RemoveStep(kJob, 2));
  faults.ClearFaults();
  CommitEngine healthy({f.root, 0, "test", {}}, PosixFileSystem());
  REQUIRE_OK(healthy.Commit(f.WriteStep(3)));
  CHECK(Listed(healthy) == std::vector<uint64_t>{1, 3});
  CHECK(f.Latest() == "3\n");
}

TEST_CASE("CommitEngine: a failed LATEST write after the MANIFEST leaves the step committed",
          "[daemon][commit_engine][storage]") {
  Fixture f;
  FaultInjectingFileSystem faults(PosixFileSystem());
  CommitEngine engine({f.root, 0, "test", {}}, &faults);
  REQUIRE_OK(engine.Commit(f.WriteStep(1)));

  faults.LimitFaultsTo(std::string(kLatestFileName));
  faults.FailDataSync(true);
  auto r = engine.Commit(f.WriteStep(2));
  REQUIRE_FALSE(r.ok());
  CHECK(r.sys_errno() == EIO);
  // The MANIFEST rename was the commit: the step is there and loads; LATEST lags behind.
  CHECK(f.HasManifest(2));
  CHECK(Listed(engine) == std::vector<uint64_t>{1, 2});
  CHECK(f.Latest() == "1\n");
  f.CheckLoadable(2);

  faults.ClearFaults();
  REQUIRE_OK(engine.Commit(f.WriteStep(3)));
  CHECK(f.Latest() == "3\n");
  CHECK(LatestOf(engine) == std::optional<uint64_t>(3));
}

}  // namespace
}  // namespace ckpt
