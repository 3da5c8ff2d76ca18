// Where this process sits in the job: its rank, the world and the ranks on its host, found from MPI itself
// and checked against what the launcher told the process (SLURM_*, OMPI_*); who started it and how many
// threads it may run.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "meshtrain/comm/communicator.h"

namespace meshtrain {

struct ProcessPlacement {
  int local_rank = 0, local_ranks = 1;  // among the ranks on this host (MPI's shared-memory split)
  std::string launcher;                 // "one process", "mpirun", "mpirun in SLURM job 12", "srun (job 12)"
  int64_t threads = 1;                  // the cores this rank may use
  std::string threads_source;           // "SLURM_CPUS_PER_TASK=4", "2 cores / 2 ranks on this host"
};

// Reads one environment variable (std::getenv in a run; a table in tests).
using EnvironmentLookup = std::function<std::optional<std::string>(const std::string& name)>;
EnvironmentLookup process_environment();

// Checks MPI's rank, world and host ranks against the launcher's variables and derives the threads from
// `cores` (this process's affinity) and the job's SLURM_CPUS_PER_TASK. Under srun, SLURM_PROCID,
// SLURM_STEP_NUM_TASKS and SLURM_LOCALID must agree with MPI; under mpirun, OMPI_COMM_WORLD_RANK / SIZE /
// LOCAL_RANK / LOCAL_SIZE must (SLURM_PROCID is then the index of mpirun's daemon, not the rank: never
// read). A disagreement is a MeshError naming the variable, both values and the fix.
ProcessPlacement check_process_placement(int rank, int world, Communicator::HostRanks host,
                                         const EnvironmentLookup& environment, int64_t cores);

// The placement of this process in `world` (every rank of it calls this: MPI splits the world by host).
ProcessPlacement discover_process_placement(Communicator& world, int64_t cores);

}  // namespace meshtrain
