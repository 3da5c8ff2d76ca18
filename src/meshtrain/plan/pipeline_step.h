// A pipeline mesh's step as planned (shared/specs/pipeline.md, "The plan is the schedule"): every stage
// rank's plan, the schedule run against the stages' predicted forward and backward times (the planned
// bubble), and whether every stage fits its device. `meshtrain compile` and the search both use it.
#pragma once

#include <cstdint>
#include <vector>

#include "meshtrain/plan/pipeline_schedule.h"
#include "meshtrain/plan/plan.h"

namespace meshtrain {

// The schedule's op times from the stage plans (stage s's plan at index s): global chunk c's forward and
// backward are the predicted seconds (KernelPlan::seconds) of the forward and backward kernels of its rank
// c mod P for its chunk there (c / P: rank s holds chunks s, s + P, ...), zero_bubble's B_input and W its
// backward_input and backward_weight kernels' (B their sum); transfers take no time (they are non-blocking
// and overlap compute where the schedule allows).
PipelineOpTimes stage_op_times(const std::vector<TrainingPlan>& stages);

// The spec table's bubble fraction for equal chunks: (P - 1) / (V M + P - 1) for GPipe, 1F1B and
// interleaved 1F1B (V = 1 but for interleaved); zero_bubble's (P - 1)(F + B_input - W) / (M (F + B) + that)
// with the mean op times of `times`. The simulation of equal op times gives the same figure.
double pipeline_bubble_formula(const PipelineSchedule& schedule, const PipelineOpTimes& times);

struct PipelineStepPlan {
  std::vector<TrainingPlan> stages;  // stage s's plan at index s
  PipelineSimulation simulation;     // the schedule over stage_op_times(stages)
  // The schedule's span plus the slowest stage's update: every stage updates once its last backward is
  // done, and the tied table's sum between the ends waits for both.
  double step_seconds = 0.0;
  size_t largest_arena_bytes = 0;  // over the stages
  bool fits = true;                // every stage's arena within its device's memory
};

// Plans every stage rank of `request`'s mesh (mesh.stage > 1; request.stage is ignored), in parallel, and
// simulates the schedule over their predicted times. A plan's errors (MeshError) are the first stage's.
PipelineStepPlan plan_pipeline_step(const PlanRequest& request);

}  // namespace meshtrain
