// Every stage rank's plan and the step the schedule makes of them (see pipeline_step.h).
#include "meshtrain/plan/pipeline_step.h"

#include <algorithm>
#include <exception>

namespace meshtrain {

PipelineOpTimes stage_op_times(const std::vector<TrainingPlan>& stages) {
  const PipelineSchedule& schedule = stages.front().pipeline.schedule;
  const bool split = schedule.kind == PipelineScheduleKind::zero_bubble;
  PipelineOpTimes times;
  for (int64_t chunk = 0; chunk < schedule.chunks(); ++chunk) {
    const TrainingPlan& stage = stages.at(static_cast<size_t>(schedule.rank_of_chunk(chunk)));
    const int64_t local = chunk / schedule.stages;
    times.forward.push_back(stage.kernel(KernelName::forward, local).seconds);
    // zero_bubble's stages plan the backward as its two parts, the others whole.
    const double input = split ? stage.kernel(KernelName::backward_input, local).seconds : 0.0;
    const double weight = split ? stage.kernel(KernelName::backward_weight, local).seconds : 0.0;
    times.backward_input.push_back(input);
    times.backward_weight.push_back(weight);
    times.backward.push_back(split ? input + weight : stage.kernel(KernelName::backward, local).seconds);
  }
  return times;
}

double pipeline_bubble_formula(const PipelineSchedule& schedule, const PipelineOpTimes& times) {
  const auto P = static_cast<double>(schedule.stages), M = static_cast<double>(schedule.micro_batches),
             V = static_cast<double>(schedule.repeats);
  if (schedule.kind != PipelineScheduleKind::zero_bubble) return (P - 1.0) / (V * M + P - 1.0);
  // The spec's ZB-H1 row with each op's mean time over the chunks: idle (P - 1)(F + B_input - W), which
  // holds for W <= B_input (a W longer than B_input leaves (P - 1) F).
  const auto mean = [](const std::vector<double>& values) {
    double sum = 0.0;
    for (double value : values) sum += value;
    return values.empty() ? 0.0 : sum / static_cast<double>(values.size());
  };
  const double F = mean(times.forward), input = mean(times.backward_input), W = mean(times.backward_weight);
  const double idle = (P - 1.0) * (F + std::max(0.0, input - W));
  return idle / (M * (F + input + W) + idle);
}

PipelineStepPlan plan_pipeline_step(const PlanRequest& request) {
  const int64_t stage_count = resolve_plan_target(request).mesh.size(MeshAxis::stage);
  PipelineStepPlan step;
  step.stages.resize(static_cast<size_t>(stage_count));
  std::vector<std::exception_ptr> errors(static_cast<size_t>(stage_count));
  // Each stage's plan is independent and deterministic; an exception must not leave the OpenMP region.
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t stage = 0; stage < stage_count; ++stage) {
    try {
      PlanRequest stage_request = request;
      stage_request.stage = stage;
      step.stages[static_cast<size_t>(stage)] = plan_training(stage_request);
    } catch (...) {
      errors[static_cast<size_t>(stage)] = std::current_exception();
    }
  }
  for (const std::exception_ptr& error : errors) {
    if (error) std::rethrow_exception(error);
  }
  step.simulation =
      simulate_pipeline_schedule(step.stages.front().pipeline.schedule, stage_op_times(step.stages));
  double slowest_update = 0.0;
  for (const TrainingPlan& stage : step.stages) {
    if (const KernelPlan* update = stage.find(KernelName::update))
      slowest_update = std::max(slowest_update, update->seconds);
    step.largest_arena_bytes = std::max(step.largest_arena_bytes, stage.arena_bytes);
    step.fits = step.fits && stage.fits();
  }
  step.step_seconds = step.simulation.makespan_seconds + slowest_update;
  return step;
}

}  // namespace meshtrain
