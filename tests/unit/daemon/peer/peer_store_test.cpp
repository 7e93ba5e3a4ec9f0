// PeerStore (daemon/peer/peer_store.h): regions held for other nodes within a hard budget —
// a full store refuses and evicts nothing, space returns only on DROP, reads may span adjacent
// regions, an abandoned PUT gives its bytes back.
#include "daemon/peer/peer_store.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <vector>

#include "tests/test_util.h"

namespace ckpt::peer {
namespace {

const std::string kFile = "rank-00000.data";

// Reserves, fills with `fill`, commits.
Status PutRegion(PeerStore& store, const Region& r, uint8_t fill) {
  auto res = store.Reserve(r);
  if (!res.ok()) return res.status();
  std::memset((*res)->data(), fill, r.length);
  store.Commit(**res);
  return Status::Ok();
}

TEST_CASE("peer store: committed regions read back, across adjacent regions too", "[peer]") {
  PeerStore store(1 << 20);
  REQUIRE_OK(PutRegion(store, {"job", 3, kFile, 0, 100}, 0xaa));
  REQUIRE_OK(PutRegion(store, {"job", 3, kFile, 100, 50}, 0xbb));
  CHECK(store.held_bytes() == 150);
  CHECK(store.region_count() == 2);
  std::vector<std::byte> out(60);
  REQUIRE(store.Read({"job", 3, kFile, 80, 60}, out.data()));
  for (int i = 0; i < 60; ++i) {
    CHECK(out[i] == std::byte{static_cast<uint8_t>(i < 20 ? 0xaa : 0xbb)});
  }
  // Past the end, another file, another step: not held.
  CHECK_FALSE(store.Holds({"job", 3, kFile, 140, 20}));
  CHECK_FALSE(store.Holds({"job", 3, "rank-00001.data", 0, 1}));
  CHECK_FALSE(store.Holds({"job", 4, kFile, 0, 1}));
}

TEST_CASE("peer store: a full store refuses clearly and evicts nothing", "[peer]") {
  PeerStore store(1000);
  REQUIRE_OK(PutRegion(store, {"job", 1, kFile, 0, 600}, 1));
  REQUIRE_OK(PutRegion(store, {"job", 2, kFile, 0, 300}, 2));
  const Status full = PutRegion(store, {"job", 3, kFile, 0, 200}, 3);
  REQUIRE(full.code() == StatusCode::kResourceExhausted);
  CHECK_THAT(full.message(), Catch::Contains("peer pool full"));
  CHECK_THAT(full.message(), Catch::Contains("job 'job' step 3"));
  CHECK_THAT(full.message(), Catch::Contains("nothing was evicted"));
  // Both older steps are intact.
  CHECK(store.Holds({"job", 1, kFile, 0, 600}));
  CHECK(store.Holds({"job", 2, kFile, 0, 300}));
  CHECK(store.used() == 900);
  // A DROP makes room.
  CHECK(store.DropStep("job", 1) == 600);
  CHECK_FALSE(store.Holds({"job", 1, kFile, 0, 1}));
  REQUIRE_OK(PutRegion(store, {"job", 3, kFile, 0, 200}, 3));
  CHECK(store.used() == 500);
}

TEST_CASE("peer store: dropping one file of a step keeps the other nodes' files", "[peer]") {
  PeerStore store(10000);
  const std::string other = "rank-00007.data";
  REQUIRE_OK(PutRegion(store, {"job", 1, kFile, 0, 600}, 1));
  REQUIRE_OK(PutRegion(store, {"job", 1, kFile, 600, 400}, 2));
  REQUIRE_OK(PutRegion(store, {"job", 1, other, 0, 300}, 3));
  CHECK(store.DropFile("job", 1, kFile) == 1000);
  CHECK(store.DropFile("job", 1, kFile) == 0);
  CHECK(store.DropFile("job", 2, other) == 0);
  CHECK_FALSE(store.Holds({"job", 1, kFile, 0, 1}));
  CHECK(store.Holds({"job", 1, other, 0, 300}));
  CHECK(store.used() == 300);
  CHECK(store.region_count() == 1);
  CHECK(store.DropFile("job", 1, other) == 300);
  CHECK(store.used() == 0);
}

TEST_CASE("peer store: a released job's steps go up to the step named, other jobs stay", "[peer]") {
  PeerStore store(1 << 20);
  const std::string other = "rank-00001.data";
  REQUIRE_OK(PutRegion(store, {"job", 1, kFile, 0, 100}, 1));
  REQUIRE_OK(PutRegion(store, {"job", 2, other, 0, 200}, 2));
  REQUIRE_OK(PutRegion(store, {"job", 3, kFile, 0, 400}, 3));
  REQUIRE_OK(PutRegion(store, {"job-b", 1, kFile, 0, 800}, 4));
  REQUIRE_OK(PutRegion(store, {"jo", 9, kFile, 0, 1600}, 5));
  using Jobs = std::vector<std::pair<std::string, uint64_t>>;
  CHECK(store.Jobs() == Jobs{{"jo", 9}, {"job", 3}, {"job-b", 1}});
  CHECK(store.DropJob("job", 2) == 300);
  CHECK(store.held_bytes() == 2800);
  CHECK(store.region_count() == 3);
  CHECK_FALSE(store.Holds({"job", 2, other, 0, 1}));
  CHECK(store.Holds({"job", 3, kFile, 0, 400}));  // saved after the release: stays
  CHECK(store.DropJob("job", 10) == 400);
  CHECK(store.DropJob("job", 10) == 0);
  CHECK(store.Jobs() == Jobs{{"jo", 9}, {"job-b", 1}});
  CHECK(store.held_bytes() == 2400);
}

TEST_CASE("peer store: a file's oldest step goes when a newer one arrives past the limit",
          "[peer]") {
  PeerStore store(100000, 3);
  const std::string other = "rank-00007.data";
  for (uint64_t step = 1; step <= 3; ++step) {
    REQUIRE_OK(PutRegion(store, {"job", step, kFile, 0, 100}, 1));
  }
  REQUIRE_OK(PutRegion(store, {"job", 1, other, 0, 50}, 2));
  REQUIRE_OK(PutRegion(store, {"other-job", 1, kFile, 0, 10}, 3));
  CHECK(store.used() == 360);
  // A fourth step of kFile: step 1 of kFile goes; step 1 of the other file and job stay.
  REQUIRE_OK(PutRegion(store, {"job", 4, kFile, 0, 100}, 4));
  CHECK_FALSE(store.Holds({"job", 1, kFile, 0, 1}));
  CHECK(store.Holds({"job", 2, kFile, 0, 100}));
  CHECK(store.Holds({"job", 4, kFile, 0, 100}));
  CHECK(store.Holds({"job", 1, other, 0, 50}));
  CHECK(store.Holds({"other-job", 1, kFile, 0, 10}));
  CHECK(store.used() == 360);
  // A rollback to a lower step keeps the copy arriving now.
  REQUIRE_OK(PutRegion(store, {"job", 1, kFile, 0, 100}, 5));
  CHECK(store.Holds({"job", 1, kFile, 0, 100}));
  // No limit: everything stays.
  PeerStore unlimited(100000, 0);
  for (uint64_t step = 1; step <= 5; ++step) {
    REQUIRE_OK(PutRegion(unlimited, {"job", step, kFile, 0, 10}, 1));
  }
  CHECK(unlimited.used() == 50);
}

TEST_CASE("peer store: a budget of 0 holds nothing", "[peer]") {
  PeerStore store(0);
  CHECK(PutRegion(store, {"job", 1, kFile, 0, 1}, 1).code() == StatusCode::kResourceExhausted);
}

TEST_CASE("peer store: a reservation counts until committed, an abandoned one gives it back",
          "[peer]") {
  PeerStore store(1000);
  {
    auto res = store.Reserve({"job", 1, kFile, 0, 800});
    REQUIRE_OK(res);
    CHECK(store.used() == 800);
    CHECK(store.held_bytes() == 0);
    CHECK_FALSE(store.Holds({"job", 1, kFile, 0, 1}));  // not visible before Commit
    CHECK(store.Reserve({"job", 2, kFile, 0, 300}).status().code() ==
          StatusCode::kResourceExhausted);
  }  // dropped without Commit: a PUT whose checksum failed
  CHECK(store.used() == 0);
}

TEST_CASE("peer store: a retried PUT of the same region replaces it", "[peer]") {
  PeerStore store(1000);
  REQUIRE_OK(PutRegion(store, {"job", 1, kFile, 0, 400}, 1));
  REQUIRE_OK(PutRegion(store, {"job", 1, kFile, 0, 400}, 2));
  CHECK(store.held_bytes() == 400);
  CHECK(store.region_count() == 1);
  std::byte b{};
  REQUIRE(store.Read({"job", 1, kFile, 399, 1}, &b));
  CHECK(b == std::byte{2});
}

}  // namespace
}  // namespace ckpt::peer
