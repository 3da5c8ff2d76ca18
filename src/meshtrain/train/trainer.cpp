// run_training: the set-up every rank must agree on, then a Run stepped until it is done or stopped.
#include "meshtrain/train/trainer.h"

#include <omp.h>

#include <cstdio>
#include <utility>

#include "meshtrain/checkpoint/checkpoint.h"
#include "meshtrain/comm/communicator.h"
#include "meshtrain/core/error.h"
#include "meshtrain/core/stop_signals.h"
#include "meshtrain/runtime/device_communicator.h"
#include "meshtrain/train/run.h"

namespace meshtrain {
namespace {

// "4 ranks on 2 hosts, started by mpirun in SLURM job 12; rank 0: 2 thread(s) (...)" for a job of several
// ranks or one SLURM started; "" for one process alone (its machine line says its threads).
std::string describe_launch(Communicator& world, const ProcessPlacement& placement) {
  int64_t hosts = placement.local_rank == 0 ? 1 : 0;
  if (world.size() > 1) world.all_reduce(comm_buffer(&hosts, 1), ReduceOp::sum, "setup/hosts");
  if (world.size() == 1 && placement.launcher == "one process") return "";
  return std::to_string(world.size()) + " rank(s) on " + std::to_string(hosts) + " host(s), started by " +
         placement.launcher + "; rank 0: " + std::to_string(placement.threads) + " thread(s) (" +
         placement.threads_source + ")";
}

TrainingSummary train_on_ranks(const Config& config, RunSetup setup, std::FILE* console,
                               const RunControl& control, RunRanks& ranks) {
  Run run(config, std::move(setup), console, ranks);
  while (run.steps_left() && run.step(control) != StepOutcome::stopped) {
  }
  return run.finish();
}

}  // namespace

TrainingSummary run_training(const Config& given_config, std::FILE* console, const RunControl& control) {
  // From here a SIGINT / SIGTERM / SIGUSR1 is recorded, set-up included: the first step boundary stops. Once
  // the run is over the process only exits: a late SIGTERM / SIGUSR1 is ignored.
  const StopSignals stop_signals(StopSignals::Afterwards::ignored);
  // A checkpoint the run starts from decides the layout the user left unset.
  Config config = given_config;
  const std::string adopted = adopt_checkpoint_layout(config);
  // One process, or every rank of an mpirun job.
  RunRanks ranks;
  ranks.world = make_world_communicator(config.collective_timeout_s);
  // Rank, world and host ranks from MPI, checked against the launcher's variables; this rank's threads.
  const ProcessPlacement placement = run_setup_on_all_ranks(
      *ranks.world, [&] { return discover_process_placement(*ranks.world, omp_get_num_procs()); });
  const std::string launch = describe_launch(*ranks.world, placement);
  // Every rank derives it alike, before the plan, so the plan, the loader and config.yaml all see it.
  const std::string derived = run_setup_on_all_ranks(
      *ranks.world, [&] { return keep_checkpoint_global_batch(config, ranks.world->size()); });
  RunSetup setup = run_setup_on_all_ranks(*ranks.world, [&] {
    return prepare_run(config, ranks.world->size(), ranks.world->rank(), &placement);
  });
  if (ranks.world->size() > 1) {  // one process has no other to differ from
    run_setup_on_all_ranks(*ranks.world, [&] {
      ranks.world->require_same_on_all_ranks(run_identity(config),
                                             "the meshtrain binary and resolved config");
    });
  }
  // NCCL, or MPI staged through host memory, where the ranks' devices are GPUs
  // (runtime/device_communicator.h).
  ranks.world = communicator_for_devices(std::move(ranks.world), setup.plan);
  if (ranks.world->rank() == 0) {
    if (!launch.empty()) std::fprintf(console, "meshtrain: %s\n", launch.c_str());
    if (!adopted.empty()) std::fprintf(console, "%s\n", adopted.c_str());
    if (!derived.empty()) std::fprintf(console, "meshtrain: %s\n", derived.c_str());
  }
  try {
    return train_on_ranks(config, std::move(setup), console, control, ranks);
  } catch (const MeshError& error) {
    // An error one rank sees must end the others too, not leave them waiting in a collective.
    if (ranks.world->size() > 1) {
      std::fprintf(stderr, "meshtrain: error (rank %d): %s\n", ranks.world->rank(), error.what());
      std::fflush(stderr);
      ranks.world->abort_all_ranks(1);
    }
    throw;
  }
}

}  // namespace meshtrain
