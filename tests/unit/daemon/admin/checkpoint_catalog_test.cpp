// The committed checkpoints as the Admin API lists and describes them, from a real root.
#include <catch2/catch.hpp>

#include "daemon/admin/checkpoint_catalog.h"
#include "tests/checkpoint_builder.h"
#include "tests/test_util.h"

namespace ckpt {
namespace {

using ckpt::testing::TempDir;

TEST_CASE("checkpoint catalog: lists committed steps and describes one", "[admin]") {
  TempDir dir;
  FileSystem* fs = PosixFileSystem();
  const std::string root = dir / "root";
  testing::TestTensor t;
  t.name = "w";
  t.shape = {4, 4};
  t.data.resize(64);
  t.shards.push_back({*ShardGeometry::Full({4, 4}), 0});
  LayoutOptions layout;
  layout.checksum_chunk = 4096;
  layout.slot_size = 16384;
  for (uint64_t step : {5, 1}) {
    REQUIRE_OK(
        testing::WriteTestCheckpoint(fs, StepDir(root, "job", step), "job", step, 1, {t}, layout));
  }
  REQUIRE_OK(fs->CreateDirs(StepDir(root, "job", 9)));  // uncommitted: no MANIFEST

  auto list = ListCommittedCheckpoints(fs, root, "job");
  REQUIRE_OK(list);
  REQUIRE(list->steps_size() == 2);
  CHECK(list->steps(0) == 1);
  CHECK(list->steps(1) == 5);

  auto described = DescribeCommittedCheckpoint(fs, root, "job", 5);
  REQUIRE_OK(described);
  CHECK(described->manifest().step() == 5);
  CHECK(described->manifest().tensors(0).name() == "w");
  CHECK(described->path() == StepDir(root, "job", 5));

  auto uncommitted = DescribeCommittedCheckpoint(fs, root, "job", 9);
  CHECK(uncommitted.status().code() == StatusCode::kNotFound);
  CHECK_THAT(uncommitted.status().message(), Catch::Contains("step 9"));

  auto never = ListCommittedCheckpoints(fs, root, "never");
  REQUIRE_OK(never);
  CHECK(never->steps_size() == 0);
  CHECK_FALSE(never->has_latest());

  for (const char* bad : {"../job", "a/b", ""}) {
    INFO(bad);
    CHECK(ListCommittedCheckpoints(fs, root, bad).status().code() == StatusCode::kInvalidArgument);
    CHECK(DescribeCommittedCheckpoint(fs, root, bad, 1).status().code() ==
          StatusCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace ckpt
