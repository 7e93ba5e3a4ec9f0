#include "daemon/config_table.h"

#include <yaml-cpp/yaml.h>

#include <CLI/CLI.hpp>
#include <cctype>
#include <charconv>
#include <cstdlib>
#include <iostream>

namespace ckpt {

std::string EnvName(const std::string& prefix, const std::string& key) {
  std::string out = prefix;
  for (char c : key) out += c == '-' ? '_' : static_cast<char>(std::toupper(c));
  return out;
}

std::string ExactSize(uint64_t bytes) {
  static constexpr std::pair<uint64_t, const char*> kUnits[] = {
      {1ull << 40, "TiB"}, {1ull << 30, "GiB"}, {1ull << 20, "MiB"}, {1ull << 10, "KiB"}};
  if (bytes == 0) return "0";
  for (const auto& [unit, name] : kUnits) {
    if (bytes % unit == 0) return std::to_string(bytes / unit) + name;
  }
  return std::to_string(bytes);
}

Result<uint64_t> ParseUint(const std::string& v) {
  uint64_t out = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  if (ec != std::errc() || p != v.data() + v.size()) {
    return InvalidArgument("'" + v + "' is not a non-negative integer");
  }
  return out;
}

Result<uint64_t> ParseSmallCount(const std::string& v) {
  ASSIGN_OR_RETURN(uint64_t n, ParseUint(v));
  if (n > 1'000'000) return InvalidArgument(v + " is too large");
  return n;
}

std::string YamlMapping(const std::vector<std::pair<std::string, std::string>>& pairs) {
  YAML::Emitter out;
  out << YAML::BeginMap;
  for (const auto& [key, value] : pairs) out << YAML::Key << key << YAML::Value << value;
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

namespace {

// "<help> [default: 1GiB] [env CKPTD_HOST_POOL]": the one line --help shows for a key.
std::string HelpLine(const CommandLine& cli, const KeyDoc& doc) {
  std::string line = doc.help;
  // Every default is shown, an empty one as "" (for most keys it means off or absent; a help
  // line that says what an empty value means, like node-id's hostname, says so itself).
  line +=
      " [default: " + (doc.default_value.empty() ? std::string("\"\"") : doc.default_value) + "]";
  if (!cli.env_prefix.empty()) line += " [env " + EnvName(cli.env_prefix, doc.key) + "]";
  return line;
}

Status ReadFile(const std::string& path, const std::vector<KeyDoc>& keys,
                std::map<std::string, std::string>& values) {
  try {
    YAML::Node root = YAML::LoadFile(path);
    if (!root.IsMap() && !root.IsNull()) {
      return InvalidArgument("config file '" + path + "' is not a YAML mapping");
    }
    for (const auto& kv : root) {
      const std::string key = kv.first.as<std::string>();
      bool known = false;
      for (const KeyDoc& k : keys) known |= k.key == key;
      if (!known) return InvalidArgument("config file '" + path + "': unknown key '" + key + "'");
      values[key] = kv.second.IsNull() ? "" : kv.second.as<std::string>();
    }
  } catch (const YAML::Exception& e) {
    return InvalidArgument("config file '" + path + "': " + e.what());
  }
  return Status::Ok();
}

}  // namespace

Result<std::optional<KeyValues>> ReadKeyValues(const CommandLine& cli,
                                               const std::vector<KeyDoc>& keys, int argc,
                                               char** argv) {
  CLI::App app{cli.program + ": " + cli.about, cli.program};
  std::map<std::string, std::string> from_flags;
  for (const KeyDoc& k : keys) {
    CLI::Option* flag = app.add_option_function<std::string>(
        "--" + k.key,
        [&from_flags, key = k.key, is_switch = k.is_switch](const std::string& v) {
          from_flags[key] = is_switch && v.empty() ? "true" : v;
        },
        HelpLine(cli, k));
    flag->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // a repeated flag: last wins
    if (k.is_switch) flag->expected(0, 1)->type_name("[true|false]");
  }
  std::string config_file;
  KeyValues out;
  app.add_option("--config", config_file, "YAML file with any of the keys above");
  app.add_flag("--print-config", out.print_config, "print the effective configuration and exit");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return std::optional<KeyValues>();
  } catch (const CLI::ParseError& e) {
    return InvalidArgument(e.what());
  }

  if (!config_file.empty()) RETURN_IF_ERROR(ReadFile(config_file, keys, out.values));
  if (!cli.env_prefix.empty()) {
    for (const KeyDoc& k : keys) {
      if (const char* env = std::getenv(EnvName(cli.env_prefix, k.key).c_str())) {
        out.values[k.key] = env;
      }
    }
  }
  for (auto& [k, v] : from_flags) out.values[k] = v;
  return std::optional<KeyValues>(std::move(out));
}

}  // namespace ckpt
