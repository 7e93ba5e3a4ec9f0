// The operations keys of the daemon config: loopback defaults, validation that names the key,
// and --print-config round trips.
#include <yaml-cpp/yaml.h>
#include <catch2/catch.hpp>

#include <cstdlib>

#include "daemon/daemon_config.h"
#include "tests/test_util.h"
#include "tests/unit/daemon/config_test_util.h"

namespace ckpt {
namespace {

const char* const kOpsEnv[] = {
    "CKPTD_METRICS",       "CKPTD_SOCKET_GROUP",        "CKPTD_ADMIN_TLS_CERT",
    "CKPTD_ADMIN_TLS_KEY", "CKPTD_ADMIN_TLS_CLIENT_CA", "CKPTD_SHARED_JOBS",
    "CKPTD_ADMIN"};

// With none of the operations variables set, so the flags alone decide.
Result<std::optional<DaemonConfig>> Load(std::vector<std::string> args) {
  for (const char* name : kOpsEnv) ::unsetenv(name);
  return testing::LoadConfig<DaemonConfig, LoadDaemonConfig>(std::move(args));
}

TEST_CASE("ops config: admin and metrics default to loopback", "[admin][daemon_config]") {
  auto c = Load({});
  REQUIRE_OK(c);
  CHECK((*c)->admin == "127.0.0.1:7460");
  CHECK((*c)->metrics == "127.0.0.1:7461");
  CHECK((*c)->shared_jobs.empty());
  CHECK((*c)->socket_group.empty());
}

TEST_CASE("ops config: TLS files must come together, errors name the keys",
          "[admin][daemon_config]") {
  auto only_cert = Load({"--admin-tls-cert", "/etc/c.pem"});
  REQUIRE_FALSE(only_cert.ok());
  CHECK_THAT(only_cert.status().message(), Catch::Contains("admin-tls-key"));
  auto only_ca = Load({"--admin-tls-client-ca", "/etc/ca.pem"});
  REQUIRE_FALSE(only_ca.ok());
  CHECK_THAT(only_ca.status().message(), Catch::Contains("admin-tls-client-ca"));
  REQUIRE_OK(
      Load({"--admin-tls-cert", "/c", "--admin-tls-key", "/k", "--admin-tls-client-ca", "/a"}));
}

TEST_CASE("ops config: shared-jobs are validated job names and print back",
          "[admin][daemon_config]") {
  auto bad = Load({"--shared-jobs", "base,../etc"});
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(bad.status().message(), Catch::Contains("shared-jobs"));
  auto c = Load({"--shared-jobs", "base,,other", "--metrics", "", "--socket-group", "2000"});
  REQUIRE_OK(c);
  CHECK((*c)->shared_jobs == std::vector<std::string>{"base", "other"});
  CHECK((*c)->metrics.empty());
  YAML::Node printed = YAML::Load((*c)->ToYaml());
  CHECK(printed["shared-jobs"].as<std::string>() == "base,other");
  CHECK(printed["socket-group"].as<std::string>() == "2000");
  CHECK(printed["metrics"].as<std::string>() == "");
}

}  // namespace
}  // namespace ckpt
