// LoadCoordinatorConfig (daemon/coordinator/coordinator_config.h): ckpt-coordinator's flags keep
// their names and defaults, a --config YAML file sets the same keys (flags win), --help lists
// every key, and an unknown key or a bad value is an error that names it.
#include "daemon/coordinator/coordinator_config.h"

#include <yaml-cpp/yaml.h>

#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "tests/test_util.h"
#include "tests/unit/daemon/config_test_util.h"

namespace ckpt {
namespace {

using Catch::Matchers::Contains;
using ckpt::testing::TempDir;
using ckpt::testing::WriteFile;
using std::chrono::milliseconds;

// Every key ckpt-coordinator has ever accepted (deploy/ and the integration tests use them).
const char* const kKeys[] = {"listen",
                             "storage-root",
                             "keep",
                             "keep-every",
                             "step-timeout",
                             "lease",
                             "holder-replan-delay",
                             "peer-job-ttl",
                             "metrics",
                             "tls-cert",
                             "tls-key",
                             "tls-client-ca",
                             "allow-plaintext",
                             "admin-read-only",
                             "log-level"};

constexpr auto Load = testing::LoadConfig<CoordinatorConfig, LoadCoordinatorConfig>;
constexpr auto LoadOk = testing::LoadConfigOk<CoordinatorConfig, LoadCoordinatorConfig>;
constexpr auto LoadError = testing::LoadConfigError<CoordinatorConfig, LoadCoordinatorConfig>;

TEST_CASE("coordinator config: flags and their defaults", "[coordinator_config]") {
  const CoordinatorConfig d = LoadOk({"--storage-root", "/pfs/ckpt"});
  CHECK(d.storage_root == "/pfs/ckpt");
  CHECK(d.listen == "127.0.0.1:7470");
  CHECK(d.keep == 0);
  CHECK(d.step_timeout == milliseconds(10 * 60 * 1000));
  CHECK(d.lease == milliseconds(10 * 1000));
  CHECK(d.holder_replan_delay == milliseconds(100));
  CHECK(d.tls_cert.empty());
  CHECK(d.tls_key.empty());
  CHECK(d.tls_client_ca.empty());
  CHECK_FALSE(d.allow_plaintext);
  CHECK(d.log_level == "info");
  CHECK_FALSE(d.print_config);

  // The command line of deploy/systemd/ckpt-coordinator.service and the tests.
  const CoordinatorConfig c =
      LoadOk({"--listen", "0.0.0.0:7470", "--storage-root", "/var/lib/ckptd", "--keep", "3",
              "--step-timeout", "90s", "--lease=500ms", "--tls-cert", "/etc/c/tls.crt", "--tls-key",
              "/etc/c/tls.key", "--tls-client-ca", "/etc/c/ca.crt", "--log-level", "debug"});
  CHECK(c.listen == "0.0.0.0:7470");
  CHECK(c.storage_root == "/var/lib/ckptd");
  CHECK(c.keep == 3);
  CHECK(c.step_timeout == milliseconds(90 * 1000));
  CHECK(c.lease == milliseconds(500));
  CHECK(c.tls_cert == "/etc/c/tls.crt");
  CHECK(c.tls_key == "/etc/c/tls.key");
  CHECK(c.tls_client_ca == "/etc/c/ca.crt");
  CHECK(c.log_level == "debug");

  // --allow-plaintext is a switch: alone it means true, and it may also be given a value.
  CHECK(LoadOk({"--storage-root", "r", "--allow-plaintext"}).allow_plaintext);
  CHECK(LoadOk({"--allow-plaintext", "--storage-root", "r"}).allow_plaintext);
  CHECK(LoadOk({"--storage-root", "r", "--holder-replan-delay", "2s"}).holder_replan_delay ==
        milliseconds(2000));
  CHECK(LoadOk({"--storage-root", "r", "--holder-replan-delay", "0s"}).holder_replan_delay ==
        milliseconds(0));
  CHECK(LoadOk({"--storage-root", "r"}).peer_job_ttl == std::chrono::minutes(30));
  CHECK(LoadOk({"--storage-root", "r", "--peer-job-ttl", "0s"}).peer_job_ttl == milliseconds(0));
  CHECK_THAT(LoadError({"--storage-root", "r", "--peer-job-ttl", "-1s"}).message(),
             Contains("peer-job-ttl"));
  CHECK_FALSE(LoadOk({"--storage-root", "r", "--allow-plaintext=false"}).allow_plaintext);
  // A repeated flag: the last wins.
  CHECK(LoadOk({"--storage-root", "a", "--storage-root", "b"}).storage_root == "b");
}

TEST_CASE("coordinator config: a --config file sets the same keys, flags override it",
          "[coordinator_config]") {
  TempDir dir;
  const std::string file = WriteFile(dir, "coordinator.yaml",
                                     "listen: 10.0.0.5:7470\n"
                                     "storage-root: /pfs/ckpt\n"
                                     "keep: 3\n"
                                     "step-timeout: 2m\n"
                                     "lease: 30s\n"
                                     "tls-cert: /etc/c/tls.crt\n"
                                     "tls-key: /etc/c/tls.key\n"
                                     "allow-plaintext: true\n"
                                     "log-level: warn\n");
  const CoordinatorConfig c = LoadOk({"--config", file, "--keep", "5"});
  CHECK(c.listen == "10.0.0.5:7470");
  CHECK(c.storage_root == "/pfs/ckpt");
  CHECK(c.keep == 5);  // the flag
  CHECK(c.step_timeout == milliseconds(2 * 60 * 1000));
  CHECK(c.lease == milliseconds(30 * 1000));
  CHECK(c.tls_cert == "/etc/c/tls.crt");
  CHECK(c.tls_key == "/etc/c/tls.key");
  CHECK(c.allow_plaintext);
  CHECK(c.log_level == "warn");

  // --print-config prints YAML that, as a --config file, gives the same configuration.
  const std::string printed = WriteFile(dir, "printed.yaml", c.ToYaml());
  const CoordinatorConfig again = LoadOk({"--config", printed});
  CHECK(again.ToYaml() == c.ToYaml());
  CHECK(again.keep == 5);
  CHECK(again.lease == c.lease);
  // The admin status page shows every key, as printed.
  const auto summary = c.Summary();
  REQUIRE(summary.size() == std::size(kKeys));
  for (size_t i = 0; i < summary.size(); ++i) CHECK(summary[i].first == kKeys[i]);
  CHECK(summary[2].second == "5");
}

TEST_CASE("coordinator config: --help lists every key with its default", "[coordinator_config]") {
  std::ostringstream captured;
  auto* old = std::cout.rdbuf(captured.rdbuf());
  auto help = Load({"--help"});
  std::cout.rdbuf(old);
  REQUIRE_OK(help);
  CHECK_FALSE(help->has_value());
  const std::string text = captured.str();
  for (const char* key : kKeys) CHECK_THAT(text, Contains(std::string("--") + key));
  CHECK_THAT(text, Contains("--config"));
  CHECK_THAT(text, Contains("[default: 127.0.0.1:7470]"));
  CHECK_THAT(text, Contains("[default: 10000ms]"));  // lease
  // Every default is shown, zeros and empty ones too.
  CHECK_THAT(text, Contains("(0 = all) [default: 0]"));            // keep
  CHECK_THAT(text, Contains("(0 = no milestones) [default: 0]"));  // keep-every
  CHECK_THAT(text, Contains("Prometheus endpoint host:port (empty = off) [default: \"\"]"));
  // No environment variables: the coordinator never read any.
  CHECK_THAT(text, !Contains("[env "));
}

TEST_CASE("coordinator config: unknown keys, bad values and a missing root are errors",
          "[coordinator_config]") {
  TempDir dir;
  struct Case {
    std::vector<std::string> args;
    std::vector<std::string> mentions;
  };
  const std::vector<Case> cases = {
      {{"--storage-root", "r", "--leese", "10s"}, {"--leese"}},
      {{"--config", WriteFile(dir, "typo.yaml", "storage-root: r\nstorage_root: r\n")},
       {"typo.yaml", "unknown key 'storage_root'"}},
      {{"--config", WriteFile(dir, "list.yaml", "- listen\n")},
       {"list.yaml", "not a YAML mapping"}},
      {{"--config", dir / "missing.yaml"}, {"missing.yaml"}},
      {{"--storage-root", "r", "--keep", "three"}, {"keep", "'three'"}},
      {{"--storage-root", "r", "--lease", "soon"}, {"lease", "'soon'"}},
      {{"--storage-root", "r", "--lease", "0s"}, {"lease", "positive"}},
      {{"--storage-root", "r", "--step-timeout", "0"}, {"step-timeout", "positive"}},
      {{"--storage-root", "r", "--allow-plaintext", "yes"}, {"allow-plaintext", "'yes'"}},
      {{}, {"storage-root", "required"}},
      {{"--config", WriteFile(dir, "no-root.yaml", "keep: 1\n")}, {"storage-root", "required"}},
  };
  for (const Case& c : cases) {
    std::string line;
    for (const auto& a : c.args) line += a + " ";
    const Status s = LoadError(c.args);
    INFO(line << "-> " << s.ToString());
    REQUIRE_FALSE(s.ok());
    CHECK(s.code() == StatusCode::kInvalidArgument);
    for (const auto& m : c.mentions) CHECK_THAT(s.message(), Contains(m));
  }
}

}  // namespace
}  // namespace ckpt
