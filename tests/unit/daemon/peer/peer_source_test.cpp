// DaemonPeerSource (daemon/peer/peer_source.h): the peer store first, then the hot cache window
// by window, then the committed step's data file in storage — and never a step that is not
// committed, nor anything a name could point outside the step directory.
#include "daemon/peer/peer_source.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <fstream>

#include "common/step_layout.h"
#include "daemon/host_pool.h"
#include "daemon/hot_cache.h"
#include "daemon/peer/peer_store.h"
#include "tests/test_util.h"
#include "tests/unit/daemon/peer/peer_test_util.h"

namespace ckpt::peer {
namespace {

constexpr uint64_t kWindow = 4096;
const std::string kFile = "rank-00000.data";

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
}

TEST_CASE("peer source: store, then hot cache per window, then committed storage", "[peer]") {
  ckpt::testing::TempDir dir;
  const std::string root = dir.path();
  const std::string on_disk = testing::Pattern(3 * kWindow, 1);
  REQUIRE_OK(PosixFileSystem()->CreateDirs(StepDir(root, "job", 2)));
  WriteFile(JoinPath(StepDir(root, "job", 2), kFile), on_disk);

  auto pool = HostPool::Create({.size = 4 * kWindow, .slot_size = kWindow, .lock_memory = false});
  REQUIRE_OK(pool);
  HotCache hot(pool->get());
  PeerStore store(1 << 20);
  DaemonPeerSource source(&store, &hot, kWindow, PosixFileSystem(), root);
  std::string out(3 * kWindow, '\0');
  auto* o = reinterpret_cast<std::byte*>(out.data());

  // Not committed yet: storage is not read (the file may hold preallocated zeros).
  Status st = source.Read({"job", 2, kFile, 0, 3 * kWindow}, o);
  CHECK(st.code() == StatusCode::kNotFound);
  CHECK_THAT(st.message(), Catch::Contains("not committed"));

  WriteFile(JoinPath(StepDir(root, "job", 2), std::string(kManifestFileName)), "manifest");
  REQUIRE_OK(source.Read({"job", 2, kFile, 0, 3 * kWindow}, o));
  CHECK(out == on_disk);

  // The middle window resident in the cache (marked bytes, to see where they came from).
  auto slot = (*pool)->Acquire(nullptr);
  REQUIRE(slot.has_value());
  std::memset((*pool)->slot_data(*slot), 0x5a, kWindow);
  hot.Adopt("job", 2, kFile, kWindow, kWindow, *slot);
  REQUIRE_OK(source.Read({"job", 2, kFile, 100, 3 * kWindow - 200}, o));
  CHECK(out.substr(0, kWindow - 100) == on_disk.substr(100, kWindow - 100));
  CHECK(out.substr(kWindow - 100, kWindow) == std::string(kWindow, '\x5a'));
  CHECK(out.substr(2 * kWindow - 100, kWindow - 100) == on_disk.substr(2 * kWindow, kWindow - 100));

  // Past the end of the file.
  st = source.Read({"job", 2, kFile, 3 * kWindow - 10, 20}, o);
  CHECK(st.code() == StatusCode::kOutOfRange);
  CHECK_THAT(st.message(), Catch::Contains("job 'job' step 2"));

  // A region in the store wins over everything else (a memory-only step held for a peer).
  auto res = store.Reserve({"job", 9, kFile, 0, 10});
  REQUIRE_OK(res);
  std::memset((*res)->data(), 0x11, 10);
  store.Commit(**res);
  REQUIRE_OK(source.Read({"job", 9, kFile, 0, 10}, o));
  CHECK(out.substr(0, 10) == std::string(10, '\x11'));
  // Unknown step: not found, naming it.
  st = source.Read({"job", 10, kFile, 0, 10}, o);
  CHECK(st.code() == StatusCode::kNotFound);
  CHECK_THAT(st.message(), Catch::Contains("step 10"));
  // What the source read from storage stays in the hot cache for the next peer asking (a cold
  // load across nodes): windows 0 and 2, and 1 now held by the adopted slot. One slot is left.
  CHECK(hot.resident_bytes() == 3 * kWindow);
  CHECK((*pool)->free_slots() == 1);
}

}  // namespace
}  // namespace ckpt::peer
