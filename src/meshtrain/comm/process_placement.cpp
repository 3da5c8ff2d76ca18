// Rank discovery: MPI's answer, checked against the launcher's environment, and the threads per rank.
#include "meshtrain/comm/process_placement.h"

#include <algorithm>
#include <cstdlib>

#include "meshtrain/core/error.h"

namespace meshtrain {
namespace {

// A variable that must hold a whole number when set.
std::optional<int64_t> integer_variable(const EnvironmentLookup& environment, const std::string& name) {
  const std::optional<std::string> text = environment(name);
  if (!text) return std::nullopt;
  char* end = nullptr;
  const long long value = std::strtoll(text->c_str(), &end, 10);
  if (text->empty() || *end != '\0') {
    fail("environment variable " + name, "a whole number", "'" + *text + "'",
         "unset it, or start the job with its launcher (srun or mpirun) which sets it");
  }
  return value;
}

void require_equal(const EnvironmentLookup& environment, const std::string& name, int64_t from_mpi,
                   const std::string& what, const std::string& launcher) {
  const std::optional<int64_t> stated = integer_variable(environment, name);
  if (!stated || *stated == from_mpi) return;
  fail("environment variable " + name, what + " " + std::to_string(from_mpi) + " (as MPI reports it)",
       std::to_string(*stated),
       "the process was started by " + launcher +
           " with another job's environment: start it with one launcher (srun --mpi=pmix, or mpirun), not a "
           "launcher inside another's tasks, and do not export these variables from a parent job");
}

}  // namespace

EnvironmentLookup process_environment() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    return value ? std::optional<std::string>(value) : std::nullopt;
  };
}

ProcessPlacement check_process_placement(int rank, int world, Communicator::HostRanks host,
                                         const EnvironmentLookup& environment, int64_t cores) {
  ProcessPlacement placement;
  placement.local_rank = host.rank;
  placement.local_ranks = host.size;
  const std::optional<std::string> job = environment("SLURM_JOB_ID");
  const std::string in_job = job ? " in SLURM job " + *job : "";
  if (environment("OMPI_COMM_WORLD_SIZE")) {
    placement.launcher = "mpirun" + in_job;
    require_equal(environment, "OMPI_COMM_WORLD_RANK", rank, "the rank", placement.launcher);
    require_equal(environment, "OMPI_COMM_WORLD_SIZE", world, "the world size", placement.launcher);
    require_equal(environment, "OMPI_COMM_WORLD_LOCAL_RANK", host.rank, "the rank on this host",
                  placement.launcher);
    require_equal(environment, "OMPI_COMM_WORLD_LOCAL_SIZE", host.size, "the ranks on this host",
                  placement.launcher);
  } else if (environment("SLURM_STEP_ID") && environment("SLURM_PROCID")) {
    placement.launcher = "srun" + (job ? " (SLURM job " + *job + ")" : std::string());
    require_equal(environment, "SLURM_PROCID", rank, "the rank", placement.launcher);
    require_equal(environment, "SLURM_STEP_NUM_TASKS", world, "the world size", placement.launcher);
    require_equal(environment, "SLURM_LOCALID", host.rank, "the rank on this host", placement.launcher);
  } else {
    placement.launcher = world > 1 ? "an MPI launcher" + in_job : "one process" + in_job;
  }
  // The job's cores for this task where SLURM says (never more than this process may run on), else this
  // host's cores shared by its ranks.
  const int64_t usable = std::max<int64_t>(1, cores);
  if (const std::optional<int64_t> per_task = integer_variable(environment, "SLURM_CPUS_PER_TASK");
      per_task && job) {
    if (*per_task < 1) {
      fail("environment variable SLURM_CPUS_PER_TASK", "a positive number of cores",
           std::to_string(*per_task), "submit with --cpus-per-task N (N >= 1)");
    }
    placement.threads = std::min(*per_task, usable);
    placement.threads_source =
        "SLURM_CPUS_PER_TASK=" + std::to_string(*per_task) +
        (*per_task > usable ? ", capped at the " + std::to_string(usable) + " cores this process may run on"
                            : "");
  } else {
    placement.threads = std::max<int64_t>(1, usable / std::max(1, host.size));
    placement.threads_source =
        std::to_string(usable) + " core(s) / " + std::to_string(host.size) + " rank(s) on this host";
  }
  return placement;
}

ProcessPlacement discover_process_placement(Communicator& world, int64_t cores) {
  return check_process_placement(world.rank(), world.size(), world.host_ranks(), process_environment(),
                                 cores);
}

}  // namespace meshtrain
