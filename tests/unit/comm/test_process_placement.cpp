// Rank discovery: MPI's rank, world and host ranks against the launcher's variables (a table stands in for
// the environment), and the threads each rank may run.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "error_text.h"
#include "meshtrain/comm/process_placement.h"

namespace meshtrain {
namespace {

using testing::error_of;

EnvironmentLookup environment_of(std::map<std::string, std::string> variables) {
  return [variables](const std::string& name) -> std::optional<std::string> {
    const auto found = variables.find(name);
    return found == variables.end() ? std::nullopt : std::optional<std::string>(found->second);
  };
}

TEST(ProcessPlacement, OneProcessSharesNothing) {
  const ProcessPlacement placement = check_process_placement(0, 1, {0, 1}, environment_of({}), 8);
  EXPECT_EQ(placement.launcher, "one process");
  EXPECT_EQ(placement.threads, 8);
  EXPECT_EQ(placement.threads_source, "8 core(s) / 1 rank(s) on this host");
}

TEST(ProcessPlacement, MpirunVariablesMustAgreeWithMpi) {
  const auto mpirun = environment_of({{"OMPI_COMM_WORLD_RANK", "3"},
                                      {"OMPI_COMM_WORLD_SIZE", "4"},
                                      {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                      {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
  const ProcessPlacement placement = check_process_placement(3, 4, {1, 2}, mpirun, 8);
  EXPECT_EQ(placement.launcher, "mpirun");
  EXPECT_EQ(placement.threads, 4) << "8 cores over the 2 ranks on this host";
  EXPECT_EQ(placement.local_ranks, 2);
  const std::string error = error_of([&] { check_process_placement(2, 4, {1, 2}, mpirun, 8); });
  EXPECT_NE(
      error.find(
          "environment variable OMPI_COMM_WORLD_RANK: expected the rank 2 (as MPI reports it), found 3"),
      std::string::npos)
      << error;
  const std::string host = error_of([&] { check_process_placement(3, 4, {0, 1}, mpirun, 8); });
  EXPECT_NE(host.find("OMPI_COMM_WORLD_LOCAL_RANK: expected the rank on this host 0"), std::string::npos)
      << host;
}

// mpirun inside sbatch: the ranks inherit SLURM_PROCID from mpirun's daemon (0 for every rank of the first
// node): it is not the rank and must not be read; SLURM_CPUS_PER_TASK sets the threads.
TEST(ProcessPlacement, MpirunInsideSbatchIgnoresSlurmProcid) {
  const auto job = environment_of({{"OMPI_COMM_WORLD_RANK", "1"},
                                   {"OMPI_COMM_WORLD_SIZE", "4"},
                                   {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                   {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                                   {"SLURM_JOB_ID", "12"},
                                   {"SLURM_STEP_ID", "0"},
                                   {"SLURM_PROCID", "0"},
                                   {"SLURM_CPUS_PER_TASK", "3"}});
  const ProcessPlacement placement = check_process_placement(1, 4, {1, 2}, job, 16);
  EXPECT_EQ(placement.launcher, "mpirun in SLURM job 12");
  EXPECT_EQ(placement.threads, 3);
  EXPECT_EQ(placement.threads_source, "SLURM_CPUS_PER_TASK=3");
  // Never more than the cores this process may run on.
  const ProcessPlacement capped = check_process_placement(1, 4, {1, 2}, job, 2);
  EXPECT_EQ(capped.threads, 2);
  EXPECT_NE(capped.threads_source.find("capped at the 2 cores"), std::string::npos) << capped.threads_source;
}

TEST(ProcessPlacement, SrunVariablesMustAgreeWithMpi) {
  const auto srun = environment_of({{"SLURM_JOB_ID", "7"},
                                    {"SLURM_STEP_ID", "1"},
                                    {"SLURM_PROCID", "2"},
                                    {"SLURM_STEP_NUM_TASKS", "4"},
                                    {"SLURM_LOCALID", "0"},
                                    {"PMIX_RANK", "2"}});
  const ProcessPlacement placement = check_process_placement(2, 4, {0, 2}, srun, 4);
  EXPECT_EQ(placement.launcher, "srun (SLURM job 7)");
  EXPECT_EQ(placement.threads, 2) << "no --cpus-per-task: the host's 4 cores over its 2 ranks";
  const std::string world = error_of([&] { check_process_placement(2, 3, {0, 2}, srun, 4); });
  EXPECT_NE(world.find("SLURM_STEP_NUM_TASKS: expected the world size 3 (as MPI reports it), found 4"),
            std::string::npos)
      << world;
  EXPECT_NE(world.find("started by srun (SLURM job 7)"), std::string::npos) << world;
}

TEST(ProcessPlacement, BadVariablesAreNamed) {
  const std::string text = error_of([] {
    check_process_placement(0, 1, {0, 1},
                            environment_of({{"SLURM_JOB_ID", "7"}, {"SLURM_CPUS_PER_TASK", "two"}}), 4);
  });
  EXPECT_NE(text.find("environment variable SLURM_CPUS_PER_TASK: expected a whole number, found 'two'"),
            std::string::npos)
      << text;
  const std::string zero = error_of([] {
    check_process_placement(0, 1, {0, 1},
                            environment_of({{"SLURM_JOB_ID", "7"}, {"SLURM_CPUS_PER_TASK", "0"}}), 4);
  });
  EXPECT_NE(zero.find("expected a positive number of cores, found 0"), std::string::npos) << zero;
}

}  // namespace
}  // namespace meshtrain
