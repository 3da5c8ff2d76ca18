// `meshtrain launch <config> [key=value ...] --nodes N [--tasks-per-node T] (--sbatch FILE | --srun |
// --mpirun --hostfile FILE)`: train on a SLURM cluster or over a hostfile (the pieces: launch/launch.h).
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace meshtrain {

int run_launch(const std::vector<std::string>& arguments, std::ostream& out);

}  // namespace meshtrain
