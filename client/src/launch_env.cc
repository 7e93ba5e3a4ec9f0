#include "ckpt/launch_env.h"

#include "ckpt/client.h"

#include <charconv>
#include <cstdlib>
#include <string_view>

namespace ckpt {
namespace {

struct Launcher {
  const char* name;
  const char* rank;
  const char* world_size;
  const char* local_rank;
  const char* job;  // nullptr: the launcher exports none
};

constexpr Launcher kLaunchers[] = {
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC_RUN_ID"},
    {"Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_JOB_ID"},
    {"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     nullptr},
};

Result<std::optional<uint32_t>> Number(const std::function<const char*(const char*)>& getenv,
                                       const char* name) {
  const char* value = getenv(name);
  if (value == nullptr) return std::optional<uint32_t>();
  std::string_view text(value);
  uint32_t out = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) {
    return Status(StatusCode::kInvalidArgument,
                  std::string("the environment variable ") + name + "='" + std::string(text) +
                      "' is not a rank number (a decimal below 2^32)");
  }
  return std::optional<uint32_t>(out);
}

}  // namespace

Result<LaunchEnvironment> ReadLaunchEnvironment(
    const std::function<const char*(const char*)>& getenv_in) {
  const std::function<const char*(const char*)> getenv =
      getenv_in ? getenv_in : [](const char* name) -> const char* { return std::getenv(name); };
  LaunchEnvironment env;
  for (const Launcher& l : kLaunchers) {
    auto rank = Number(getenv, l.rank);
    if (!rank.ok()) return rank.status();
    auto world = Number(getenv, l.world_size);
    if (!world.ok()) return world.status();
    if (!*rank || !*world) continue;
    auto local = Number(getenv, l.local_rank);
    if (!local.ok()) return local.status();
    if (**rank >= **world) {
      return Status(StatusCode::kInvalidArgument,
                    std::string(l.name) + " says rank " + std::to_string(**rank) + " (" + l.rank +
                        ") of world size " + std::to_string(**world) + " (" + l.world_size +
                        "): the rank must be below the world size");
    }
    env.launcher = l.name;
    env.rank = *rank;
    env.world_size = *world;
    env.local_rank = *local;
    if (l.job != nullptr) {
      const char* job = getenv(l.job);
      if (job != nullptr && *job != '\0' && std::string_view(job) != "none") env.job = job;
    }
    break;
  }
  if (const char* job = getenv("CKPTD_JOB"); job != nullptr && *job != '\0') env.job = job;
  return env;
}

std::string LaunchVariablesLookedFor() {
  std::string out;
  for (const Launcher& l : kLaunchers) {
    if (!out.empty()) out += ", ";
    out += std::string(l.rank) + "/" + l.world_size + " (" + l.name + ")";
  }
  return out;
}

Result<ClientOptions> ClientOptionsFromEnvironment(std::string socket) {
  auto env = ReadLaunchEnvironment();
  if (!env.ok()) return env.status();
  if (env->launcher.empty()) {
    return Status(StatusCode::kInvalidArgument,
                  "no launcher told this process its rank: looked for " +
                      LaunchVariablesLookedFor() + "; pass the rank and world size instead");
  }
  if (!env->job) {
    return Status(StatusCode::kInvalidArgument,
                  "no job name: set CKPTD_JOB (" + env->launcher +
                      " gave none; torchrun's TORCHELASTIC_RUN_ID is 'none' without --rdzv-id)");
  }
  ClientOptions options;
  options.socket = std::move(socket);
  options.job = *env->job;
  options.rank = *env->rank;
  options.world_size = *env->world_size;
  options.local_rank = env->local_rank.value_or(*env->rank);
  return options;
}

}  // namespace ckpt
