#include "daemon/coordinator/restore_points.h"

#include <catch2/catch.hpp>

namespace ckpt {
namespace {

using Clock = RestorePoints::Clock;
using std::chrono::minutes;

TEST_CASE("RestorePoints: every rank of a restart gets the first answer, once", "[restore_point]") {
  RestorePoints points(minutes(10));
  const auto now = Clock::now();
  REQUIRE_FALSE(points.Find("job", 0, 3, now).has_value());
  CHECK(points.Pin("job", 0, 3, 4, now) == std::optional<uint64_t>(4));
  // Step 5 of the previous trainers commits meanwhile: rank 1 still gets 4.
  auto r1 = points.Find("job", 1, 3, now);
  REQUIRE(r1.has_value());
  CHECK(*r1 == std::optional<uint64_t>(4));
  // A rank that resolved concurrently adopts the pinned answer instead of its own.
  CHECK(points.Pin("job", 2, 3, 5, now) == std::optional<uint64_t>(4));
  // Every rank asked: the next restart resolves anew.
  CHECK(points.size() == 0);
  CHECK_FALSE(points.Find("job", 0, 3, now).has_value());
}

TEST_CASE("RestorePoints: a pin ends with a new step, a repeated rank, another world, or its ttl",
          "[restore_point]") {
  RestorePoints points(minutes(10));
  const auto now = Clock::now();
  SECTION("training resumed") {
    points.Pin("job", 0, 2, 7, now);
    points.OnNewStep("job");
    CHECK_FALSE(points.Find("job", 1, 2, now).has_value());
  }
  SECTION("a rank asks again: a later restart") {
    points.Pin("job", 0, 2, 7, now);
    CHECK_FALSE(points.Find("job", 0, 2, now).has_value());
    CHECK(points.Pin("job", 0, 2, 9, now) == std::optional<uint64_t>(9));
  }
  SECTION("another world size") {
    points.Pin("job", 0, 2, 7, now);
    CHECK_FALSE(points.Find("job", 1, 4, now).has_value());
  }
  SECTION("ttl") {
    points.Pin("job", 0, 2, 7, now);
    CHECK_FALSE(points.Find("job", 1, 2, now + minutes(11)).has_value());
  }
  SECTION("nothing committed is an answer too") {
    CHECK(points.Pin("job", 0, 2, std::nullopt, now) == std::nullopt);
    auto r1 = points.Find("job", 1, 2, now);
    REQUIRE(r1.has_value());
    CHECK_FALSE(r1->has_value());
  }
  SECTION("jobs are independent; a world of one pins nothing") {
    points.Pin("a", 0, 2, 1, now);
    CHECK_FALSE(points.Find("b", 0, 2, now).has_value());
    CHECK(points.Pin("solo", 0, 1, 3, now) == std::optional<uint64_t>(3));
    CHECK(points.size() == 1);
  }
}

}  // namespace
}  // namespace ckpt
