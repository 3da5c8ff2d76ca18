// The training loop of `meshtrain train`: data, resume, the step kernels with gradient accumulation,
// evaluation, metrics, checkpoints and clean stops on SIGINT / SIGTERM / SIGUSR1 and a wall-time limit
// (train/preemption.h).
#pragma once

#include <cstdint>
#include <cstdio>

#include "meshtrain/config/config.h"
#include "meshtrain/train/preemption.h"

namespace meshtrain {

struct TrainingSummary {
  int64_t first_step = 0;       // 0, or the step a resumed run started from
  int64_t steps_completed = 0;  // optimizer steps done when the run ended
  double last_loss = 0.0;
  double last_eval_loss = -1.0;               // -1: never evaluated
  StopReason stop_reason = StopReason::none;  // why it stopped before config.steps (after saving)
  std::string last_checkpoint;
};

// Stops a run early as a signal would (finish the step, save, return): tests use it to cut a run at step k.
struct RunControl {
  int64_t stop_after_step = -1;  // -1: run to config.steps
};

// Runs config.steps optimizer steps (resuming from the newest committed checkpoint in run_dir). Progress
// goes to `console`; metrics, events, traces and checkpoints under run_dir.
TrainingSummary run_training(const Config& config, std::FILE* console, const RunControl& control = {});

}  // namespace meshtrain
