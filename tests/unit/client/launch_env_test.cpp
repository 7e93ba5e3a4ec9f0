// ReadLaunchEnvironment (client/include/ckpt/launch_env.h) on made-up environments: each
// launcher's variables, the order between launchers, CKPTD_JOB, and malformed values.
#include "ckpt/launch_env.h"

#include <catch2/catch.hpp>
#include <map>
#include <string>

namespace ckpt {
namespace {

using Catch::Matchers::Contains;
using Env = std::map<std::string, std::string>;

Result<LaunchEnvironment> Read(const Env& env) {
  return ReadLaunchEnvironment([&env](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

TEST_CASE("launch environment: torchrun, Slurm and Open MPI each name the rank", "[launch_env]") {
  auto torchrun = Read({{"RANK", "5"},
                        {"WORLD_SIZE", "16"},
                        {"LOCAL_RANK", "1"},
                        {"TORCHELASTIC_RUN_ID", "llm-7b"}});
  REQUIRE(torchrun.ok());
  CHECK(torchrun->launcher == "torchrun");
  CHECK(torchrun->rank == 5u);
  CHECK(torchrun->world_size == 16u);
  CHECK(torchrun->local_rank == 1u);
  CHECK(torchrun->job == "llm-7b");

  auto slurm = Read({{"SLURM_PROCID", "3"},
                     {"SLURM_NTASKS", "8"},
                     {"SLURM_LOCALID", "3"},
                     {"SLURM_JOB_ID", "123456"}});
  REQUIRE(slurm.ok());
  CHECK(slurm->launcher == "Slurm");
  CHECK(slurm->rank == 3u);
  CHECK(slurm->world_size == 8u);
  CHECK(slurm->job == "123456");

  auto mpi = Read({{"OMPI_COMM_WORLD_RANK", "2"},
                   {"OMPI_COMM_WORLD_SIZE", "4"},
                   {"OMPI_COMM_WORLD_LOCAL_RANK", "0"}});
  REQUIRE(mpi.ok());
  CHECK(mpi->launcher == "Open MPI");
  CHECK(mpi->rank == 2u);
  CHECK(mpi->local_rank == 0u);
  CHECK_FALSE(mpi->job.has_value());
}

TEST_CASE("launch environment: torchrun inside Slurm wins, and CKPTD_JOB names the job",
          "[launch_env]") {
  Env env{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_JOB_ID", "99"},
          {"RANK", "7"},         {"WORLD_SIZE", "16"},  {"TORCHELASTIC_RUN_ID", "none"}};
  auto both = Read(env);
  REQUIRE(both.ok());
  CHECK(both->launcher == "torchrun");
  CHECK(both->rank == 7u);
  CHECK_FALSE(both->local_rank.has_value());
  CHECK_FALSE(both->job.has_value());  // "none" is torchrun's run id without --rdzv-id
  env["CKPTD_JOB"] = "pretrain";
  CHECK(Read(env)->job == "pretrain");
}

TEST_CASE("launch environment: nothing set, half set, or malformed", "[launch_env]") {
  auto none = Read({});
  REQUIRE(none.ok());
  CHECK(none->launcher.empty());
  CHECK_FALSE(none->rank.has_value());
  auto half = Read({{"RANK", "1"}});  // a RANK alone is not torchrun
  REQUIRE(half.ok());
  CHECK(half->launcher.empty());

  auto bad = Read({{"RANK", "1x"}, {"WORLD_SIZE", "4"}});
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(bad.status().message(), Contains("RANK='1x'"));
  auto negative = Read({{"SLURM_PROCID", "-1"}, {"SLURM_NTASKS", "4"}});
  REQUIRE_FALSE(negative.ok());
  CHECK_THAT(negative.status().message(), Contains("SLURM_PROCID"));
  auto outside = Read({{"RANK", "4"}, {"WORLD_SIZE", "4"}});
  REQUIRE_FALSE(outside.ok());
  CHECK_THAT(outside.status().message(), Contains("below the world size"));
  CHECK_THAT(LaunchVariablesLookedFor(), Contains("SLURM_PROCID/SLURM_NTASKS (Slurm)"));
}

}  // namespace
}  // namespace ckpt
