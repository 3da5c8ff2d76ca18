#include "meshtrain/cli/train.h"

#include <cstdio>
#include <memory>
#include <string>

#include "meshtrain/cli/arguments.h"
#include "meshtrain/comm/communicator.h"
#include "meshtrain/core/error.h"
#include "meshtrain/train/trainer.h"

namespace meshtrain {

int run_train(const std::vector<std::string>& arguments) {
  // Under mpirun every rank reads the same arguments: a bad key is printed by each of them before any exits
  // (the ranks agree on it first; the config's own collective_timeout_s is not known yet).
  constexpr double kConfigAgreementTimeoutSeconds = 300.0;
  const std::unique_ptr<Communicator> world = make_world_communicator(kConfigAgreementTimeoutSeconds);
  const Config config = run_setup_on_all_ranks(*world, [&] {
    const ParsedArguments parsed = parse_arguments(find_command("train"), arguments);
    Config loaded = load_config(parsed.config(), parsed.overrides);
    if (!(loaded.collective_timeout_s > 0.0)) {
      fail("config key 'collective_timeout_s'", "a positive number of seconds",
           to_text(loaded.collective_timeout_s),
           "set collective_timeout_s=300 (or more for very large models)");
    }
    return loaded;
  });
  // Under mpirun only the first rank speaks; every rank exits with the same status (train/preemption.h: 75
  // asks the job script to requeue the job).
  if (world->rank() != 0) return exit_status_for(run_training(config, stdout).stop_reason);
  std::fprintf(stdout, "meshtrain train %s: %zu config keys resolved (written to %s/config.yaml)\n",
               config.model_name.c_str(), config.resolved.size(), config.run_dir.c_str());
  const TrainingSummary summary = run_training(config, stdout);
  std::fprintf(stdout, "done: steps %lld..%lld, last loss %.4f", static_cast<long long>(summary.first_step),
               static_cast<long long>(summary.steps_completed), summary.last_loss);
  if (summary.last_eval_loss >= 0.0) std::fprintf(stdout, ", eval loss %.4f", summary.last_eval_loss);
  if (!summary.last_checkpoint.empty())
    std::fprintf(stdout, ", checkpoint %s", summary.last_checkpoint.c_str());
  std::fprintf(stdout, "\n");
  return exit_status_for(summary.stop_reason);
}

}  // namespace meshtrain
