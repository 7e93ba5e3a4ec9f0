// Who this trainer process is, as its launcher told it: torchrun, Slurm or Open MPI each export
// the rank, the world size and the rank on the node, under names of their own. A trainer started
// by any of them connects with `ClientOptionsFromEnvironment()` instead of passing them by hand.
//
//   launcher   rank              world size          local rank                   job
//   torchrun   RANK              WORLD_SIZE          LOCAL_RANK TORCHELASTIC_RUN_ID Slurm
//   SLURM_PROCID      SLURM_NTASKS        SLURM_LOCALID                SLURM_JOB_ID Open MPI
//   OMPI_COMM_WORLD_RANK  OMPI_COMM_WORLD_SIZE  OMPI_COMM_WORLD_LOCAL_RANK  -
//
// The first launcher in this order whose rank and world size are both set is used (torchrun
// inside an srun allocation sets its own RANK: it wins). CKPTD_JOB, when set, names the job
// whatever the launcher: the job name is the checkpoint's directory, so a job that must resume
// across allocations (a new SLURM_JOB_ID each sbatch) or torchrun runs (TORCHELASTIC_RUN_ID is
// "none" unless --rdzv-id is given, and "none" is never taken as a job name) sets it.
//
// ClientOptionsFromEnvironment (client.h) builds a client's options from this.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "ckpt/status.h"

namespace ckpt {

struct LaunchEnvironment {
  std::string launcher;  // "torchrun", "Slurm", "Open MPI"; empty when none was found
  std::optional<uint32_t> rank;
  std::optional<uint32_t> world_size;
  std::optional<uint32_t> local_rank;
  std::optional<std::string> job;  // CKPTD_JOB, else the launcher's job id
};

// Reads the variables above through `getenv` (the process environment by default). A variable
// that is set but is not a decimal number below 2^32 is kInvalidArgument naming it; a rank not
// below the world size too. Finding no launcher is not an error here (see the fields).
Result<LaunchEnvironment> ReadLaunchEnvironment(
    const std::function<const char*(const char*)>& getenv = nullptr);

// The names this reader looks for, for error messages: "RANK/WORLD_SIZE (torchrun), ...".
std::string LaunchVariablesLookedFor();

}  // namespace ckpt
