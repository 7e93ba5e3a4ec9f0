// Names on disk and the committed / uncommitted / LATEST logic (common/step_layout.h), on a real
// directory tree.
#include "common/step_layout.h"

#include <limits>
#include <string>
#include <vector>

#include "tests/test_util.h"

namespace ckpt {
namespace {

using ckpt::testing::TempDir;
using Steps = std::vector<uint64_t>;

TEST_CASE("step, data file and node manifest names", "[step_layout]") {
  CHECK(StepDirName(0) == "step-0000000000");
  CHECK(StepDirName(42) == "step-0000000042");
  CHECK(StepDirName(9'999'999'999) == "step-9999999999");
  CHECK(StepDirName(12'345'678'901) == "step-12345678901");
  CHECK(DataFileName(0) == "rank-00000.data");
  CHECK(DataFileName(3) == "rank-00003.data");
  CHECK(DataFileName(123456) == "rank-123456.data");
  CHECK(NodeManifestFileName("gpu-07") == "node-gpu-07.nmf");
  CHECK(JobDir("/pfs/ckpt", "llama") == "/pfs/ckpt/llama");
  CHECK(StepDir("/pfs/ckpt", "llama", 7) == "/pfs/ckpt/llama/step-0000000007");
  CHECK(kManifestFileName == "MANIFEST");
  CHECK(kLatestFileName == "LATEST");
}

TEST_CASE("ParseStepDirName inverts StepDirName", "[step_layout]") {
  for (uint64_t step : {uint64_t{0}, uint64_t{1}, uint64_t{42}, uint64_t{9'999'999'999},
                        uint64_t{10'000'000'000}, std::numeric_limits<uint64_t>::max()}) {
    INFO("step " << step);
    auto parsed = ParseStepDirName(StepDirName(step));
    REQUIRE(parsed.has_value());
    CHECK(*parsed == step);
  }
}

TEST_CASE("ParseStepDirName accepts the canonical spelling only", "[step_layout]") {
  for (std::string_view bad : {"",
                               "step-",
                               "step-42",
                               "step-000000042",
                               "step-00000000042",
                               "step-0000000042.tmp",
                               "step-0000000042 ",
                               " step-0000000042",
                               "Step-0000000042",
                               "step_0000000042",
                               "step-+000000042",
                               "step--000000042",
                               "step-000000004a",
                               "step-0x00000042",
                               "xstep-0000000042",
                               "step-00000000000000000042",
                               "step-18446744073709551616",
                               "MANIFEST",
                               "LATEST",
                               "step-0000000042/"}) {
    INFO("name \"" << bad << "\"");
    CHECK_FALSE(ParseStepDirName(bad).has_value());
  }
}

class JobTree {
 public:
  JobTree() : job_(dir_ / "job") {}
  const std::string& job() const { return job_; }
  void Step(uint64_t step, bool committed) {
    const std::string d = JoinPath(job_, StepDirName(step));
    REQUIRE_OK(PosixFileSystem()->CreateDirs(d));
    if (committed) Write(JoinPath(d, "MANIFEST"), "m");
  }
  void Dir(const std::string& name) {
    REQUIRE_OK(PosixFileSystem()->CreateDirs(JoinPath(job_, name)));
  }
  void Write(const std::string& path, std::string_view data) {
    auto f =
        PosixFileSystem()->Open(path, OpenOptions{.write = true, .create = true, .truncate = true});
    REQUIRE_OK(f);
    REQUIRE_OK((*f)->PWriteAll(data.data(), data.size(), 0));
    REQUIRE_OK((*f)->Close());
  }
  void Latest(std::string_view text) { Write(JoinPath(job_, "LATEST"), text); }

 private:
  TempDir dir_;
  std::string job_;
};

std::optional<uint64_t> Resolve(const std::string& job_dir) {
  auto r = ResolveLatest(PosixFileSystem(), job_dir);
  REQUIRE_OK(r);
  return *r;
}

TEST_CASE("an absent job directory has no steps and no latest", "[step_layout]") {
  TempDir dir;
  auto committed = ListCommittedSteps(PosixFileSystem(), dir / "nope");
  REQUIRE_OK(committed);
  CHECK(committed->empty());
  auto uncommitted = ListUncommittedSteps(PosixFileSystem(), dir / "nope");
  REQUIRE_OK(uncommitted);
  CHECK(uncommitted->empty());
  CHECK_FALSE(Resolve(dir / "nope").has_value());
}

TEST_CASE("ListCommittedSteps / ListUncommittedSteps split on MANIFEST, ascending",
          "[step_layout]") {
  JobTree t;
  t.Step(10, true);
  t.Step(2, false);
  t.Step(1, true);
  t.Step(100, true);
  t.Step(12'345'678'901, true);
  t.Step(7, false);
  // Only a temporary manifest: not committed.
  t.Step(8, false);
  t.Write(JoinPath(JoinPath(t.job(), StepDirName(8)), "MANIFEST.tmp"), "partial");
  // Not step directories, even with a MANIFEST inside.
  t.Dir("step-0000000005.tmp");
  t.Write(JoinPath(JoinPath(t.job(), "step-0000000005.tmp"), "MANIFEST"), "m");
  t.Dir("step-5");
  t.Write(JoinPath(JoinPath(t.job(), "step-5"), "MANIFEST"), "m");
  t.Dir("other");
  t.Latest("10");

  auto committed = ListCommittedSteps(PosixFileSystem(), t.job());
  REQUIRE_OK(committed);
  CHECK(*committed == Steps{1, 10, 100, 12'345'678'901});
  auto uncommitted = ListUncommittedSteps(PosixFileSystem(), t.job());
  REQUIRE_OK(uncommitted);
  CHECK(*uncommitted == Steps{2, 7, 8});
}

TEST_CASE("ResolveLatest follows LATEST when it names a committed step", "[step_layout]") {
  JobTree t;
  t.Step(1, true);
  t.Step(3, true);
  t.Step(5, false);
  t.Latest("3\n");
  CHECK(Resolve(t.job()) == 3u);
  // LATEST may name an older committed step (e.g. after a rollback); it is followed.
  t.Latest("1");
  CHECK(Resolve(t.job()) == 1u);
  t.Latest("1 \n");
  CHECK(Resolve(t.job()) == 1u);
}

TEST_CASE("ResolveLatest falls back to the newest committed step", "[step_layout]") {
  JobTree t;
  t.Step(1, true);
  t.Step(3, true);
  t.Step(5, false);
  SECTION("LATEST missing") { CHECK(Resolve(t.job()) == 3u); }
  SECTION("LATEST empty") {
    t.Latest("");
    CHECK(Resolve(t.job()) == 3u);
  }
  SECTION("LATEST garbage") {
    t.Latest("three");
    CHECK(Resolve(t.job()) == 3u);
  }
  SECTION("LATEST with trailing garbage") {
    t.Latest("1x");
    CHECK(Resolve(t.job()) == 3u);
  }
  SECTION("LATEST negative") {
    t.Latest("-1");
    CHECK(Resolve(t.job()) == 3u);
  }
  SECTION("LATEST overflowing") {
    t.Latest("99999999999999999999999");
    CHECK(Resolve(t.job()) == 3u);
  }
  SECTION("LATEST names an uncommitted step") {
    t.Latest("5");
    CHECK(Resolve(t.job()) == 3u);
  }
  SECTION("LATEST names a step that does not exist") {
    t.Latest("4");
    CHECK(Resolve(t.job()) == 3u);
  }
}

TEST_CASE("ResolveLatest is nullopt with only uncommitted steps, whatever LATEST says",
          "[step_layout]") {
  JobTree t;
  t.Step(5, false);
  t.Latest("5");
  CHECK_FALSE(Resolve(t.job()).has_value());
}

}  // namespace
}  // namespace ckpt
