// OptionTable: a binary's configuration as data. One table lists every user-facing key once —
// its name, its help line, how its value is read from text and printed back — and everything
// else is generated from it: the command-line flags (--key), the environment variables
// (<PREFIX><KEY>), the keys of the YAML file (--config), --help (each line with its default)
// and --print-config / the admin config summary. A key added to the table is therefore parsed,
// documented and printed at once, and a key cannot be parsed under one spelling and printed
// under another.
//
// Precedence, for every binary: flags > environment > --config file > the defaults of the
// config struct (a default-constructed Config is the defaults; --help prints them from it).
// A repeated flag: the last wins. A key the file does not know is an error naming the file and
// the key, so a typo never silently falls back to a default.
//
// ckptd (daemon/daemon_config.cc) and ckpt-coordinator (daemon/coordinator/coordinator_config.cc)
// are the two tables; the keys they share are declared once in daemon/config_keys.h.
//
// The template half (Field, Option, OptionTable) binds keys to members of a Config struct; the
// text half (ReadKeyValues, in config_table.cc) knows only key names and strings, so CLI11 and
// yaml-cpp stay out of this header.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "common/units.h"

namespace ckpt {

// ---- the text half: key names and strings only (config_table.cc) ----

struct KeyDoc {
  std::string key;
  std::string help;
  std::string default_value;  // as printed; empty: no default shown
  bool is_switch = false;     // a boolean: `--key` alone means true
};

struct CommandLine {
  std::string program;     // "ckptd": the start of --help
  std::string about;       // one line under it
  std::string env_prefix;  // "CKPTD_": each key is also read from CKPTD_<KEY>; empty: no env
};

struct KeyValues {
  std::map<std::string, std::string> values;  // every key given, after precedence
  bool print_config = false;                  // --print-config
};

// "CKPTD_HOST_POOL" for ("CKPTD_", "host-pool").
std::string EnvName(const std::string& prefix, const std::string& key);

// Reads flags, environment and --config file. nullopt when --help was asked for (printed to
// stdout). Errors: an unknown flag or file key, an unreadable or malformed file.
Result<std::optional<KeyValues>> ReadKeyValues(const CommandLine& cli,
                                               const std::vector<KeyDoc>& keys, int argc,
                                               char** argv);

// A flat YAML mapping of `pairs`, in order (what --print-config prints).
std::string YamlMapping(const std::vector<std::pair<std::string, std::string>>& pairs);

// "8GiB" when `bytes` is a whole number of a binary unit, else the number of bytes: a size that
// reads back exactly.
std::string ExactSize(uint64_t bytes);

// ---- the template half: keys bound to members of a Config ----

// How one key's value is read from text (flag, environment, YAML) into a Config and printed
// back so that it reads back the same. Errors need not name the key: the table prefixes it.
template <class Config>
struct Field {
  std::function<Status(Config&, const std::string&)> apply;
  std::function<std::string(const Config&)> print;
  bool is_switch = false;
};

template <class Config>
struct Option {
  std::string key;
  std::string help;
  Field<Config> field;
};

template <class Config>
Field<Config> Str(std::string Config::*member) {
  return {[member](Config& c, const std::string& v) {
            c.*member = v;
            return Status::Ok();
          },
          [member](const Config& c) { return c.*member; }};
}

template <class Config>
Field<Config> Bytes(uint64_t Config::*member) {
  return {[member](Config& c, const std::string& v) -> Status {
            ASSIGN_OR_RETURN(c.*member, ParseByteSize(v));
            return Status::Ok();
          },
          [member](const Config& c) { return ExactSize(c.*member); }};
}

template <class Config>
Field<Config> Duration(std::chrono::milliseconds Config::*member) {
  return {[member](Config& c, const std::string& v) -> Status {
            ASSIGN_OR_RETURN(c.*member, ParseDuration(v));
            return Status::Ok();
          },
          [member](const Config& c) { return std::to_string((c.*member).count()) + "ms"; }};
}

// A non-negative integer of at most 1,000,000 (thread counts, nice values, retention).
Result<uint64_t> ParseSmallCount(const std::string& v);
// A non-negative integer.
Result<uint64_t> ParseUint(const std::string& v);

template <class Config, class T>
Field<Config> Integer(T Config::*member) {
  return {[member](Config& c, const std::string& v) -> Status {
            ASSIGN_OR_RETURN(uint64_t n, ParseSmallCount(v));
            c.*member = static_cast<T>(n);
            return Status::Ok();
          },
          [member](const Config& c) { return std::to_string(c.*member); }};
}

// "true" or "false"; on the command line `--key` alone is "true".
template <class Config>
Field<Config> Boolean(bool Config::*member) {
  return {[member](Config& c, const std::string& v) -> Status {
            if (v != "true" && v != "false") {
              return InvalidArgument("'" + v + "' is not true or false");
            }
            c.*member = v == "true";
            return Status::Ok();
          },
          [member](const Config& c) { return std::string(c.*member ? "true" : "false"); },
          /*is_switch=*/true};
}

// A comma-separated list; `item` checks and converts one element.
template <class Config, class T>
Field<Config> List(std::vector<T> Config::*member,
                   std::function<Result<T>(const std::string&)> item) {
  return {[member, item](Config& c, const std::string& v) -> Status {
            (c.*member).clear();
            std::stringstream ss(v);
            std::string part;
            while (std::getline(ss, part, ',')) {
              if (part.empty()) continue;
              ASSIGN_OR_RETURN(T value, item(part));
              (c.*member).push_back(std::move(value));
            }
            return Status::Ok();
          },
          [member](const Config& c) {
            std::string out;
            for (const auto& value : c.*member) {
              std::ostringstream one;
              one << value;
              out += (out.empty() ? "" : ",") + one.str();
            }
            return out;
          }};
}

// Config is a default-constructible struct with a `bool print_config` member: Load sets it from
// --print-config, and the binary's main prints the configuration and exits.
template <class Config>
class OptionTable {
 public:
  OptionTable(CommandLine cli, std::vector<Option<Config>> options)
      : cli_(std::move(cli)), options_(std::move(options)) {}

  // Flags, environment and file applied over a default Config, then `validate`: the checks
  // between keys that no single key can make, which may also fill in derived defaults. nullopt
  // on --help. Errors from a key name the key and value; validate's speak for themselves. Only
  // a validated Config leaves, so no binary can start on one that skipped its checks.
  Result<std::optional<Config>> Load(int argc, char** argv,
                                     const std::function<Status(Config&)>& validate) const {
    ASSIGN_OR_RETURN(std::optional<KeyValues> read, ReadKeyValues(cli_, Docs(), argc, argv));
    if (!read) return std::optional<Config>();
    Config config;
    for (const Option<Config>& o : options_) {
      auto it = read->values.find(o.key);
      if (it != read->values.end()) RETURN_IF_ERROR(o.field.apply(config, it->second), o.key);
    }
    config.print_config = read->print_config;
    RETURN_IF_ERROR(validate(config));
    return std::optional<Config>(std::move(config));
  }

  // Every key and its value as it would read back, in table order.
  std::vector<std::pair<std::string, std::string>> Print(const Config& config) const {
    std::vector<std::pair<std::string, std::string>> out;
    for (const Option<Config>& o : options_) out.emplace_back(o.key, o.field.print(config));
    return out;
  }

  std::string ToYaml(const Config& config) const { return YamlMapping(Print(config)); }

  std::vector<KeyDoc> Docs() const {
    const Config defaults{};
    std::vector<KeyDoc> docs;
    for (const Option<Config>& o : options_) {
      docs.push_back({o.key, o.help, o.field.print(defaults), o.field.is_switch});
    }
    return docs;
  }

 private:
  CommandLine cli_;
  std::vector<Option<Config>> options_;
};

// Concatenates groups of options (a table is built from single keys and shared groups).
template <class Config>
std::vector<Option<Config>> Concat(std::vector<std::vector<Option<Config>>> groups) {
  std::vector<Option<Config>> out;
  for (auto& g : groups) {
    for (auto& o : g) out.push_back(std::move(o));
  }
  return out;
}

}  // namespace ckpt
