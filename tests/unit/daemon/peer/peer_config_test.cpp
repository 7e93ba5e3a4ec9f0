// The data plane's keys of ckptd's configuration (daemon/daemon_config.h): off by default, sizes
// in units, an address that is not host:port refused before anything starts.
#include <catch2/catch.hpp>

#include "daemon/daemon_config.h"
#include "tests/unit/daemon/config_test_util.h"

namespace ckpt {
namespace {

constexpr auto LoadOk = testing::LoadConfigOk<DaemonConfig, LoadDaemonConfig>;
constexpr auto LoadError = testing::LoadConfigError<DaemonConfig, LoadDaemonConfig>;

TEST_CASE("peer config: off by default, holds nothing, no cap", "[peer][config]") {
  const DaemonConfig c = LoadOk({"--node-id", "n"});
  CHECK(c.peer_listen.empty());
  CHECK(c.peer_pool == 0);
  CHECK(c.peer_bandwidth == 0);
}

TEST_CASE("peer config: flags parse with units", "[peer][config]") {
  const DaemonConfig c = LoadOk({"--node-id", "n", "--peer-listen", "127.0.0.1:0", "--peer-pool",
                                 "8GiB", "--peer-bandwidth", "1GiB"});
  CHECK(c.peer_listen == "127.0.0.1:0");
  CHECK(c.peer_pool == 8ull << 30);
  CHECK(c.peer_bandwidth == 1ull << 30);
  CHECK_THAT(c.ToYaml(), Catch::Contains("peer-listen"));
}

TEST_CASE("peer config: a listen address without a port is refused", "[peer][config]") {
  const Status s = LoadError({"--node-id", "n", "--peer-listen", "10.0.0.1"});
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Contains("peer-listen"));
}

}  // namespace
}  // namespace ckpt
