// Helpers shared by the config tests of ckptd (daemon_config_test.cpp, admin/ops_config_test.cpp)
// and ckpt-coordinator (coordinator/coordinator_config_test.cpp): run a binary's config loader on
// a command line given as strings, and write a --config file. Each test binds them to its loader
// once, under the short names its cases use:
//
//   constexpr auto Load = testing::LoadConfig<DaemonConfig, LoadDaemonConfig>;
//   constexpr auto LoadOk = testing::LoadConfigOk<DaemonConfig, LoadDaemonConfig>;
//   constexpr auto LoadError = testing::LoadConfigError<DaemonConfig, LoadDaemonConfig>;
#pragma once

#include <fstream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "tests/test_util.h"

namespace ckpt::testing {

// LoadDaemonConfig, LoadCoordinatorConfig: argv in, the validated config out (nullopt on --help).
template <class Config>
using ConfigLoadFn = Result<std::optional<Config>> (*)(int argc, char** argv);

// `args` as the command line, after a program name. The name is a placeholder: every option
// table names its own program, and the command-line parser does not read argv[0] when it has
// one.
template <class Config, ConfigLoadFn<Config> kLoad>
Result<std::optional<Config>> LoadConfig(std::vector<std::string> args) {
  args.insert(args.begin(), "config-test");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  return kLoad(static_cast<int>(args.size()), argv.data());
}

// The config `args` give; fails the test when they are rejected or ask for --help.
template <class Config, ConfigLoadFn<Config> kLoad>
Config LoadConfigOk(std::vector<std::string> args) {
  auto r = LoadConfig<Config, kLoad>(std::move(args));
  REQUIRE_OK(r);
  REQUIRE(r->has_value());
  return **r;
}

// Why `args` are rejected; OK when they are not.
template <class Config, ConfigLoadFn<Config> kLoad>
Status LoadConfigError(std::vector<std::string> args) {
  auto r = LoadConfig<Config, kLoad>(std::move(args));
  return r.ok() ? Status::Ok() : r.status();
}

// Writes `text` to `name` in `dir`; returns its path (for --config).
inline std::string WriteFile(const TempDir& dir, const std::string& name, const std::string& text) {
  const std::string path = dir / name;
  std::ofstream(path) << text;
  return path;
}

}  // namespace ckpt::testing
