#include "daemon/coordinator/restore_points.h"

#include <catch2/catch.hpp>

namespace ckpt {
namespace {

using Answer = std::optional<uint64_t>;

TEST_CASE("RestorePoints: every rank of a restart gets the first answer, as often as it asks",
          "[restore_point]") {
  RestorePoints points;
  REQUIRE_FALSE(points.Find("job", 0, 3, "n0/1").has_value());
  CHECK(points.Pin("job", 0, 3, "n0/1", 4, {5}) == Answer(4));  // step 5 is in flight
  // Rank 0 loads what it was told (a second question from the same session).
  CHECK(points.Find("job", 0, 3, "n0/1") == std::optional<Answer>(4));
  // Step 5 of the previous trainers commits meanwhile: rank 1 still gets 4, its load too.
  CHECK(points.Find("job", 1, 3, "n1/7") == std::optional<Answer>(4));
  CHECK(points.Find("job", 1, 3, "n1/7") == std::optional<Answer>(4));
  // A rank that resolved concurrently adopts the pinned answer instead of its own.
  CHECK(points.Pin("job", 2, 3, "n1/8", 5, {}) == Answer(4));
  // Reports of the step that was in flight at the pin do not end it; a new step does.
  points.OnStepStarted("job", 5);
  CHECK(points.size() == 1);
  points.OnStepStarted("job", 6);
  CHECK(points.size() == 0);
}

TEST_CASE("RestorePoints: a pin ends with a later restart or a restart that died",
          "[restore_point]") {
  RestorePoints points;
  SECTION("a rank asks from a new session: a later restart") {
    points.Pin("job", 0, 2, "n0/1", 7, {});
    CHECK_FALSE(points.Find("job", 0, 2, "n0/2").has_value());
    CHECK(points.Pin("job", 0, 2, "n0/2", 9, {}) == Answer(9));
    CHECK(points.Find("job", 1, 2, "n0/3") == std::optional<Answer>(9));
  }
  SECTION("another world size") {
    points.Pin("job", 0, 2, "n0/1", 7, {});
    CHECK_FALSE(points.Find("job", 1, 4, "n0/2").has_value());
  }
  SECTION("a session that took the answer ended before training resumed") {
    points.Pin("job", 0, 2, "n0/1", 7, {});
    points.OnSessionEnded("job", 1, "n0/9");  // not one that asked: nothing
    CHECK(points.size() == 1);
    points.OnSessionEnded("job", 0, "n0/1");
    CHECK(points.size() == 0);
  }
  SECTION("nothing committed is an answer too") {
    CHECK(points.Pin("job", 0, 2, "n0/1", std::nullopt, {}) == std::nullopt);
    auto r1 = points.Find("job", 1, 2, "n0/2");
    REQUIRE(r1.has_value());
    CHECK_FALSE(r1->has_value());
  }
  SECTION("jobs are independent") {
    points.Pin("a", 0, 2, "n0/1", 1, {});
    CHECK_FALSE(points.Find("b", 0, 2, "n0/1").has_value());
    points.OnStepStarted("b", 3);
    CHECK(points.size() == 1);
  }
}

}  // namespace
}  // namespace ckpt
