// LoadDaemonConfig and DaemonConfig::ToYaml (daemon/daemon_config.h): defaults, precedence
// (flags > env > YAML file > defaults), validation naming the key, and --print-config output
// that reads back as the same configuration.
#include "daemon/daemon_config.h"

#include <yaml-cpp/yaml.h>

#include <cctype>
#include <cstdlib>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "common/names.h"
#include "common/units.h"
#include "tests/test_util.h"
#include "tests/unit/daemon/config_test_util.h"

namespace ckpt {
namespace {

using Catch::Matchers::Contains;
using ckpt::testing::TempDir;
using ckpt::testing::WriteFile;
using std::chrono::milliseconds;

constexpr uint64_t kMiB = 1ull << 20, kGiB = 1ull << 30;

const char* const kKeys[] = {
    "socket",          "socket-mode",   "admin",        "storage-root",     "host-pool",
    "node-id",         "coordinator",   "keep",         "slot-size",        "checksum-chunk",
    "capture-threads", "flush-threads", "step-timeout", "shutdown-timeout", "capture-throttle",
    "allowed-uids",    "log-level"};

std::string EnvName(std::string key) {
  std::string out = "CKPTD_";
  for (char c : key) out += c == '-' ? '_' : static_cast<char>(std::toupper(c));
  return out;
}

// Clears every CKPTD_* variable the loader reads for the test's duration and restores the
// caller's environment afterwards; Set() adds variables for one test.
class ScopedEnv {
 public:
  ScopedEnv() {
    for (const char* key : kKeys) {
      const std::string name = EnvName(key);
      if (const char* v = std::getenv(name.c_str())) saved_[name] = v;
      ::unsetenv(name.c_str());
    }
  }
  ~ScopedEnv() {
    for (const char* key : kKeys) ::unsetenv(EnvName(key).c_str());
    for (const auto& [name, value] : saved_) ::setenv(name.c_str(), value.c_str(), 1);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
  void Set(const std::string& name, const std::string& value) {
    ::setenv(name.c_str(), value.c_str(), 1);
  }

 private:
  std::map<std::string, std::string> saved_;
};

constexpr auto Load = testing::LoadConfig<DaemonConfig, LoadDaemonConfig>;
constexpr auto LoadOk = testing::LoadConfigOk<DaemonConfig, LoadDaemonConfig>;
constexpr auto LoadError = testing::LoadConfigError<DaemonConfig, LoadDaemonConfig>;

void CheckSame(const DaemonConfig& a, const DaemonConfig& b) {
  CHECK(a.socket == b.socket);
  CHECK(a.socket_mode == b.socket_mode);
  CHECK(a.admin == b.admin);
  CHECK(a.storage_root == b.storage_root);
  CHECK(a.host_pool == b.host_pool);
  CHECK(a.node_id == b.node_id);
  CHECK(a.coordinator == b.coordinator);
  CHECK(a.keep == b.keep);
  CHECK(a.slot_size == b.slot_size);
  CHECK(a.checksum_chunk == b.checksum_chunk);
  CHECK(a.capture_threads == b.capture_threads);
  CHECK(a.flush_threads == b.flush_threads);
  CHECK(a.step_timeout == b.step_timeout);
  CHECK(a.shutdown_timeout == b.shutdown_timeout);
  CHECK(a.capture_throttle == b.capture_throttle);
  CHECK(a.allowed_uids == b.allowed_uids);
  CHECK(a.log_level == b.log_level);
}

TEST_CASE("with no flags, env or file the defaults apply", "[daemon_config]") {
  ScopedEnv env;
  const DaemonConfig c = LoadOk({});
  DaemonConfig defaults;
  defaults.node_id = c.node_id;  // from the hostname
  CheckSame(c, defaults);
  CHECK(c.host_pool == 1 * kGiB);
  CHECK(c.slot_size == 16 * kMiB);
  CHECK(c.checksum_chunk == 1 * kMiB);
  CHECK(c.step_timeout == milliseconds(10 * 60 * 1000));
  CHECK(c.socket == "/run/ckptd/ckptd.sock");
  CHECK_FALSE(c.print_config);
  // The node id defaults to a valid id derived from the hostname.
  CHECK_FALSE(c.node_id.empty());
  CHECK_OK(ValidateNodeId(c.node_id));
}

TEST_CASE("flags override env, env overrides the YAML file, the file overrides defaults",
          "[daemon_config]") {
  ScopedEnv env;
  TempDir dir;
  const std::string file = WriteFile(dir, "ckptd.yaml",
                                     "host-pool: 4GiB\n"
                                     "keep: 3\n"
                                     "log-level: debug\n"
                                     "step-timeout: 90s\n");
  env.Set("CKPTD_HOST_POOL", "8GiB");
  env.Set("CKPTD_KEEP", "5");

  const DaemonConfig all = LoadOk({"--config", file, "--host-pool", "16GiB"});
  CHECK(all.host_pool == 16 * kGiB);                     // flag
  CHECK(all.keep == 5);                                  // env
  CHECK(all.log_level == "debug");                       // file
  CHECK(all.step_timeout == milliseconds(90'000));       // file
  CHECK(all.shutdown_timeout == milliseconds(300'000));  // default

  const DaemonConfig no_flag = LoadOk({"--config", file});
  CHECK(no_flag.host_pool == 8 * kGiB);

  ::unsetenv("CKPTD_HOST_POOL");
  const DaemonConfig file_only = LoadOk({"--config", file});
  CHECK(file_only.host_pool == 4 * kGiB);
  CHECK(file_only.keep == 5);

  const DaemonConfig flag_eq = LoadOk({"--host-pool=2GiB", "--keep=9"});
  CHECK(flag_eq.host_pool == 2 * kGiB);
  CHECK(flag_eq.keep == 9);
}

TEST_CASE("every key can be set from a YAML file", "[daemon_config]") {
  ScopedEnv env;
  TempDir dir;
  const std::string file = WriteFile(dir, "all.yaml",
                                     "socket: /tmp/ckptd-test.sock\n"
                                     "socket-mode: \"0600\"\n"
                                     "admin: unix:/tmp/admin.sock\n"
                                     "storage-root: /pfs/ckpt\n"
                                     "host-pool: 3GiB\n"
                                     "node-id: node-7\n"
                                     "coordinator: coord:7461\n"
                                     "keep: 4\n"
                                     "slot-size: 8MiB\n"
                                     "checksum-chunk: 512KiB\n"
                                     "capture-threads: 3\n"
                                     "flush-threads: 6\n"
                                     "step-timeout: 2m\n"
                                     "shutdown-timeout: 45s\n"
                                     "capture-throttle: 2GiB\n"
                                     "allowed-uids: 1000,1001\n"
                                     "log-level: warn\n");
  const DaemonConfig c = LoadOk({"--config", file});
  CHECK(c.socket == "/tmp/ckptd-test.sock");
  CHECK(c.socket_mode == "0600");
  CHECK(c.admin == "unix:/tmp/admin.sock");
  CHECK(c.storage_root == "/pfs/ckpt");
  CHECK(c.host_pool == 3 * kGiB);
  CHECK(c.node_id == "node-7");
  CHECK(c.coordinator == "coord:7461");
  CHECK(c.keep == 4);
  CHECK(c.slot_size == 8 * kMiB);
  CHECK(c.checksum_chunk == 512 * 1024);
  CHECK(c.capture_threads == 3);
  CHECK(c.flush_threads == 6);
  CHECK(c.step_timeout == milliseconds(120'000));
  CHECK(c.shutdown_timeout == milliseconds(45'000));
  CHECK(c.capture_throttle == 2 * kGiB);
  CHECK(c.allowed_uids == std::vector<uint32_t>{1000, 1001});
  CHECK(c.log_level == "warn");
}

TEST_CASE("an empty YAML file is fine", "[daemon_config]") {
  ScopedEnv env;
  TempDir dir;
  const DaemonConfig c = LoadOk({"--config", WriteFile(dir, "empty.yaml", "")});
  CHECK(c.host_pool == 1 * kGiB);
}

TEST_CASE("an unknown YAML key is rejected, naming key and file", "[daemon_config]") {
  ScopedEnv env;
  TempDir dir;
  const std::string file = WriteFile(dir, "typo.yaml", "host-pool: 2GiB\nhost_pool: 4GiB\n");
  const Status s = LoadError({"--config", file});
  REQUIRE_FALSE(s.ok());
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(s.message(), Contains("'host_pool'"));
  CHECK_THAT(s.message(), Contains(file));
}

TEST_CASE("a config file that is missing, not a mapping or not YAML is rejected",
          "[daemon_config]") {
  ScopedEnv env;
  TempDir dir;
  const Status missing = LoadError({"--config", dir / "nope.yaml"});
  REQUIRE_FALSE(missing.ok());
  CHECK_THAT(missing.message(), Contains(dir / "nope.yaml"));
  const Status list = LoadError({"--config", WriteFile(dir, "list.yaml", "- a\n- b\n")});
  REQUIRE_FALSE(list.ok());
  CHECK_THAT(list.message(), Contains("mapping"));
  const Status broken = LoadError({"--config", WriteFile(dir, "broken.yaml", "a: [1, 2\n")});
  REQUIRE_FALSE(broken.ok());
  CHECK(broken.code() == StatusCode::kInvalidArgument);
}

TEST_CASE("bad values are rejected naming the key and the value", "[daemon_config]") {
  ScopedEnv env;
  TempDir dir;
  struct Case {
    std::vector<std::string> args;
    std::vector<std::string> mentions;
  };
  const std::vector<Case> cases = {
      {{"--host-pool", "lots"}, {"host-pool", "'lots'"}},
      {{"--slot-size", "16XB"}, {"slot-size", "XB"}},
      {{"--checksum-chunk=-1MiB"}, {"checksum-chunk", "-1MiB"}},
      {{"--capture-throttle", "fast"}, {"capture-throttle", "'fast'"}},
      {{"--step-timeout", "10 parsecs"}, {"step-timeout", "parsecs"}},
      {{"--shutdown-timeout", "soon"}, {"shutdown-timeout", "'soon'"}},
      {{"--keep=-1"}, {"keep", "'-1'"}},
      {{"--keep", "2000000"}, {"keep", "2000000"}},
      {{"--flush-threads", "four"}, {"flush-threads", "'four'"}},
      {{"--allowed-uids", "1000,bob"}, {"allowed-uids", "'bob'"}},
      {{"--config", WriteFile(dir, "bad.yaml", "slot-size: huge\n")}, {"slot-size", "'huge'"}},
  };
  for (const Case& c : cases) {
    const Status s = LoadError(c.args);
    std::string line;
    for (const auto& a : c.args) line += a + " ";
    INFO(line << "-> " << s.ToString());
    REQUIRE_FALSE(s.ok());
    CHECK(s.code() == StatusCode::kInvalidArgument);
    for (const auto& m : c.mentions) CHECK_THAT(s.message(), Contains(m));
  }
  env.Set("CKPTD_HOST_POOL", "many");
  const Status from_env = LoadError({});
  REQUIRE_FALSE(from_env.ok());
  CHECK_THAT(from_env.message(), Contains("host-pool"));
  CHECK_THAT(from_env.message(), Contains("'many'"));
}

TEST_CASE("inconsistent settings are rejected before anything starts", "[daemon_config]") {
  ScopedEnv env;
  struct Case {
    std::vector<std::string> args;
    std::string mentions;
  };
  const std::vector<Case> cases = {
      {{"--host-pool", "16MiB"}, "host-pool"},  // one slot of the default 16 MiB
      {{"--host-pool", "31MiB"}, "two slots"},
      {{"--host-pool", "1GiB", "--slot-size", "768MiB"}, "two slots"},
      {{"--checksum-chunk", "1000"}, "checksum-chunk"},
      {{"--checksum-chunk", "0"}, "checksum-chunk"},
      {{"--slot-size", "1536KiB"}, "slot-size"},  // not a multiple of the 1 MiB chunk
      {{"--slot-size", "0"}, "slot-size"},
      {{"--capture-threads", "0"}, "capture-threads"},
      {{"--flush-threads", "0"}, "flush-threads"},
      {{"--socket-mode", "0999"}, "socket-mode"},
      {{"--socket-mode", "rw-rw----"}, "socket-mode"},
      {{"--socket-mode", "01777"}, "socket-mode"},
      {{"--node-id", "../evil"}, "node-id"},
      {{"--storage-root", ""}, "storage-root"},
  };
  for (const Case& c : cases) {
    std::string line;
    for (const auto& a : c.args) line += a + " ";
    const Status s = LoadError(c.args);
    INFO(line << "-> " << s.ToString());
    REQUIRE_FALSE(s.ok());
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK_THAT(s.message(), Contains(c.mentions));
  }
  // Exactly two slots is enough.
  const DaemonConfig two = LoadOk({"--host-pool", "32MiB"});
  CHECK(two.host_pool == 32 * kMiB);
}

TEST_CASE("unknown flags are rejected, --help prints usage and returns nullopt",
          "[daemon_config]") {
  ScopedEnv env;
  const Status unknown = LoadError({"--hostpool", "1GiB"});
  REQUIRE_FALSE(unknown.ok());
  CHECK(unknown.code() == StatusCode::kInvalidArgument);

  std::ostringstream captured;
  auto* old = std::cout.rdbuf(captured.rdbuf());
  auto help = Load({"--help"});
  std::cout.rdbuf(old);
  REQUIRE_OK(help);
  CHECK_FALSE(help->has_value());
  CHECK_THAT(captured.str(), Contains("--host-pool"));
  CHECK_THAT(captured.str(), Contains("CKPTD_HOST_POOL"));
}

TEST_CASE("daemon config: --print-config is recorded", "[daemon_config]") {
  ScopedEnv env;
  CHECK(LoadOk({"--print-config"}).print_config);
}

// Regression (security): allowed-uids parses each uid as a u64 and truncates it to
// u32, so "4294967296" silently becomes uid 0 (root) instead of being rejected.
TEST_CASE("a uid past 2^32 is rejected, not truncated to root", "[daemon_config]") {
  ScopedEnv env;
  auto r = Load({"--allowed-uids", "4294967296"});
  if (r.ok() && r->has_value()) {
    INFO("allowed_uids[0] = " << ((*r)->allowed_uids.empty() ? int64_t{-1}
                                                             : int64_t{(*r)->allowed_uids[0]}));
    CHECK(((*r)->allowed_uids.empty() || (*r)->allowed_uids[0] != 0));
  }
  CHECK_FALSE(r.ok());
}

DaemonConfig NonDefaultConfig() {
  ScopedEnv env;
  return LoadOk({"--socket",
                 "/tmp/ckptd-test.sock",
                 "--socket-mode",
                 "0600",
                 "--admin",
                 "unix:/tmp/admin.sock",
                 "--storage-root",
                 "/pfs/ckpt root",
                 "--host-pool",
                 "3GiB",
                 "--node-id",
                 "node-7",
                 "--coordinator",
                 "coord:7461",
                 "--keep",
                 "4",
                 "--slot-size",
                 "8MiB",
                 "--checksum-chunk",
                 "512KiB",
                 "--capture-threads",
                 "3",
                 "--flush-threads",
                 "6",
                 "--step-timeout",
                 "1500ms",
                 "--shutdown-timeout",
                 "2m",
                 "--capture-throttle",
                 "2GiB",
                 "--allowed-uids",
                 "0,1000,65534",
                 "--log-level",
                 "warn"});
}

TEST_CASE("daemon config: --print-config output is YAML with the same values", "[daemon_config]") {
  const DaemonConfig c = NonDefaultConfig();
  const std::string yaml = c.ToYaml();
  INFO(yaml);
  YAML::Node root = YAML::Load(yaml);
  REQUIRE(root.IsMap());
  for (const char* key : kKeys) {
    INFO("key " << key);
    CHECK(root[key].IsDefined());
  }
  auto str = [&](const char* key) { return root[key].as<std::string>(); };
  auto bytes = [&](const char* key) {
    auto r = ParseByteSize(str(key));
    REQUIRE_OK(r);
    return *r;
  };
  auto duration = [&](const char* key) {
    auto r = ParseDuration(str(key));
    REQUIRE_OK(r);
    return *r;
  };
  CHECK(str("socket") == c.socket);
  CHECK(str("socket-mode") == c.socket_mode);
  CHECK(str("admin") == c.admin);
  CHECK(str("storage-root") == c.storage_root);
  CHECK(bytes("host-pool") == c.host_pool);
  CHECK(str("node-id") == c.node_id);
  CHECK(str("coordinator") == c.coordinator);
  CHECK(root["keep"].as<uint32_t>() == c.keep);
  CHECK(bytes("slot-size") == c.slot_size);
  CHECK(bytes("checksum-chunk") == c.checksum_chunk);
  CHECK(root["capture-threads"].as<int>() == c.capture_threads);
  CHECK(root["flush-threads"].as<int>() == c.flush_threads);
  CHECK(duration("step-timeout") == c.step_timeout);
  CHECK(duration("shutdown-timeout") == c.shutdown_timeout);
  CHECK(bytes("capture-throttle") == c.capture_throttle);
  CHECK(str("allowed-uids") == "0,1000,65534");
  CHECK(str("log-level") == c.log_level);
}

TEST_CASE("daemon config: --print-config output fed back as --config gives the same configuration",
          "[daemon_config]") {
  const DaemonConfig c = NonDefaultConfig();
  ScopedEnv env;
  TempDir dir;
  const DaemonConfig back = LoadOk({"--config", WriteFile(dir, "printed.yaml", c.ToYaml())});
  CheckSame(back, c);

  // And the defaults, whose coordinator and allowed-uids are empty.
  const DaemonConfig d = LoadOk({});
  const DaemonConfig d_back = LoadOk({"--config", WriteFile(dir, "defaults.yaml", d.ToYaml())});
  CheckSame(d_back, d);
}

// Regression: ToYaml prints sizes through FormatBytes, which keeps one decimal, so any size
// that is not a multiple of 0.1 of a binary unit does not survive --print-config: host-pool
// "10GB" (10,000,000,000 bytes) prints as "9.3 GiB" and reads back as 9,985,798,963 bytes.
TEST_CASE("daemon config: --print-config keeps sizes that are not round binary units exact",
          "[daemon_config]") {
  ScopedEnv env;
  const DaemonConfig c = LoadOk({"--host-pool", "10GB", "--capture-throttle", "1500000000"});
  const std::string yaml = c.ToYaml();
  INFO(yaml);
  YAML::Node root = YAML::Load(yaml);
  auto host_pool = ParseByteSize(root["host-pool"].as<std::string>());
  REQUIRE_OK(host_pool);
  CHECK(*host_pool == 10'000'000'000ull);
  auto throttle = ParseByteSize(root["capture-throttle"].as<std::string>());
  REQUIRE_OK(throttle);
  CHECK(*throttle == 1'500'000'000ull);
}

}  // namespace
}  // namespace ckpt
