// A stage rank's step program from its pipeline schedule (plan/pipeline_schedule.h): the schedule's ops as
// program entries (F and B as the split kernels forward and backward, zero_bubble's B_input and W as
// backward_input and backward_weight, sends and receives as transfers),
// each (micro-batch, chunk) bound to an activation slot for as long as an entry uses it.
#pragma once

#include <cstdint>

#include "meshtrain/plan/pipeline_schedule.h"
#include "meshtrain/plan/program.h"

namespace meshtrain {

struct StageProgram {
  StepProgram program;
  // Activation slots the program uses at once: a (micro-batch, chunk) holds one from its first entry (the
  // receive of its activation, or its forward) to its last (its backward or W, or the send of its input
  // gradient), the lowest free one.
  int64_t slots = 0;
};

// `stage`'s entries of `schedule`: zero_gradients, then its ops in order, then update; eval: one
// micro-batch's forward through this stage (its activation received first and sent after, as in training)
// in slot 0.
StageProgram plan_stage_program(const PipelineSchedule& schedule, int64_t stage);

}  // namespace meshtrain
