// What `meshtrain launch` makes of a config and a rank count: the check that the config's mesh fits the
// ranks, the launcher command lines (srun inside an allocation, mpirun over a hostfile) and the sbatch script
// that runs `meshtrain train` under SLURM and requeues the job when train exits with kRequeueExitStatus.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "meshtrain/config/config.h"

namespace meshtrain {

// meshtrain train's exit status after a stop request (SIGUSR1, SIGTERM, exit_duration_in_mins) that every
// rank answered by committing a checkpoint: "requeue me" (sysexits.h's EX_TEMPFAIL).
inline constexpr int kRequeueExitStatus = 75;

enum class Launcher { mpirun, srun };

struct LaunchRequest {
  std::string config;                       // a preset name or a YAML path, as train takes it
  std::vector<std::string> overrides;       // key=value, as train takes them
  int64_t nodes = 1;                        // hosts (SLURM nodes, or the hostfile's first hosts)
  int64_t tasks_per_node = 1;               // ranks on each
  int64_t cpus_per_task = 0;                // cores per rank; 0: SLURM's default (the flag is left out)
  std::vector<std::string> launcher_extra;  // words added to the launcher's options (--launcher-args)
  std::string binary;                       // the meshtrain every rank runs (an absolute path)

  int64_t ranks() const { return nodes * tasks_per_node; }
};

// The config resolved as train resolves it, with its mesh resolved for request.ranks() ranks: a mesh whose
// product differs is a MeshError naming the mesh, the ranks and both fixes.
Config check_launch_config(const LaunchRequest& request);

// `BINARY train CONFIG KEY=VALUE...`: what every rank runs.
std::vector<std::string> train_command(const LaunchRequest& request);
// `srun --mpi=pmix -N N --ntasks-per-node T [--cpus-per-task C] EXTRA... train command`.
std::vector<std::string> srun_command(const LaunchRequest& request);
// `mpirun --hostfile FILE -np N*T --map-by ppr:T:node[:PE=C] --bind-to none|core [-x VAR]... EXTRA... train
// command`; -x passes on the MESHTRAIN_* and OMP_* variables set here (ranks started over ssh do not inherit
// this environment).
std::vector<std::string> mpirun_hostfile_command(const LaunchRequest& request, const std::string& hostfile);

// One word as bash reads it back unchanged (single quotes where it holds anything but [A-Za-z0-9_./=:,+@%-]).
std::string shell_quoted(const std::string& word);
// The words quoted and joined by spaces: a line a user can paste.
std::string shell_line(const std::vector<std::string>& words);

// A SLURM time limit (--time): minutes, minutes:seconds, hours:minutes:seconds, days-hours,
// days-hours:minutes or days-hours:minutes:seconds, in seconds; anything else is a MeshError naming `where`.
int64_t slurm_time_seconds(const std::string& where, const std::string& text);

struct BatchScript {
  Launcher launcher = Launcher::mpirun;
  std::string job_name;
  std::string time_limit;         // SLURM's format; empty: the partition's default
  int64_t signal_seconds = 120;   // SIGUSR1 to the batch shell this long before the time limit
  std::string output_directory;   // the run_dir, absolute: slurm-%j.out goes there
  std::string working_directory;  // where relative paths of the command resolve (absolute)
};
// The script's text: the #SBATCH directives, the launcher in the background with the train command, the
// trap forwarding SIGUSR1 / SIGTERM to it as SIGUSR1, the wait for it, and the requeue on status 75.
std::string sbatch_script(const LaunchRequest& request, const BatchScript& script);

// Replaces this process with `command` (PATH searched); a launcher that cannot be started is a MeshError
// naming `where` and the program.
[[noreturn]] void run_in_place(const std::vector<std::string>& command, const std::string& where);

}  // namespace meshtrain
