// plan/pipeline_step: every stage rank planned, the schedule simulated over the stages' predicted forward and
// backward times (the planned bubble), checked against independent plans and against the closed form of a
// 1F1B step whose last stage is the slowest; the spec's formula against equal chunks.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "meshtrain/config/config.h"
#include "meshtrain/core/error.h"
#include "meshtrain/plan/pipeline_step.h"

namespace meshtrain {
namespace {

PlanRequest stage_request(const std::vector<std::string>& overrides) {
  std::vector<std::string> all = {"topology=cpu", "mesh.stage=2", "max_target_length=32",
                                  "per_device_batch_size=2"};
  all.insert(all.end(), overrides.begin(), overrides.end());
  PlanRequest request;
  request.config = load_config("qwen3-tiny", all);
  return request;
}

TrainingPlan stage_plan(PlanRequest request, int64_t stage) {
  request.stage = stage;
  return plan_training(request);
}

// Each stage's plan is plan_training's for that stage rank; the op times are its forward and backward
// kernels' predicted seconds; the step is the simulation's span plus the slowest update.
TEST(PipelineStep, PlansEveryStageAndSimulatesTheirPredictedTimes) {
  for (const char* schedule : {"gpipe", "1f1b"}) {
    const PlanRequest request =
        stage_request({"gradient_accumulation_steps=4", std::string("pipeline_schedule=") + schedule});
    const PipelineStepPlan step = plan_pipeline_step(request);
    ASSERT_EQ(step.stages.size(), 2u) << schedule;
    double slowest_update = 0.0;
    size_t largest_arena = 0;
    PipelineOpTimes times;
    for (int64_t s = 0; s < 2; ++s) {
      const TrainingPlan fresh = stage_plan(request, s);
      const TrainingPlan& planned = step.stages[static_cast<size_t>(s)];
      EXPECT_EQ(planned.pipeline.stage, s);
      EXPECT_EQ(planned.identity.hash, fresh.identity.hash) << schedule << " stage " << s;
      EXPECT_EQ(planned.arena_bytes, fresh.arena_bytes) << schedule << " stage " << s;
      times.forward.push_back(fresh.kernel(KernelName::forward).seconds);
      times.backward.push_back(fresh.kernel(KernelName::backward).seconds);
      slowest_update = std::max(slowest_update, fresh.kernel(KernelName::update).seconds);
      largest_arena = std::max(largest_arena, fresh.arena_bytes);
    }
    const PipelineOpTimes derived = stage_op_times(step.stages);
    EXPECT_EQ(derived.forward, times.forward) << schedule;
    EXPECT_EQ(derived.backward, times.backward) << schedule;
    times.backward_input = times.backward_weight = {0.0, 0.0};
    const PipelineSimulation expected = simulate_pipeline_schedule(step.stages[0].pipeline.schedule, times);
    EXPECT_EQ(step.simulation.makespan_seconds, expected.makespan_seconds) << schedule;
    for (size_t s = 0; s < 2; ++s)
      EXPECT_EQ(step.simulation.ranks[s].bubble_fraction, expected.ranks[s].bubble_fraction) << schedule;
    EXPECT_EQ(step.step_seconds, expected.makespan_seconds + slowest_update) << schedule;
    EXPECT_EQ(step.largest_arena_bytes, largest_arena) << schedule;
    EXPECT_TRUE(step.fits) << schedule;
  }
}

// Interleaved 1F1B (V = 2): global chunk c runs on rank c mod P as its chunk c / P there, so the op times
// of chunks 0..3 are stage 0's chunk 0, stage 1's chunk 0, stage 0's chunk 1, stage 1's chunk 1.
TEST(PipelineStep, InterleavedChunksTakeTheirRanksChunkKernels) {
  const PipelineStepPlan step =
      plan_pipeline_step(stage_request({"gradient_accumulation_steps=2", "pipeline_schedule=interleaved_1f1b",
                                        "num_pipeline_repeats=2", "base_num_decoder_layers=4"}));
  const PipelineOpTimes times = stage_op_times(step.stages);
  ASSERT_EQ(times.forward.size(), 4u);
  for (int64_t chunk = 0; chunk < 4; ++chunk) {
    const TrainingPlan& rank = step.stages[static_cast<size_t>(chunk % 2)];
    EXPECT_EQ(times.forward[static_cast<size_t>(chunk)], rank.kernel(KernelName::forward, chunk / 2).seconds);
    EXPECT_EQ(times.backward[static_cast<size_t>(chunk)],
              rank.kernel(KernelName::backward, chunk / 2).seconds);
  }
  // The last chunk (the head and loss) is the slowest backward: not stage 0's second chunk's.
  EXPECT_GT(times.backward[3], times.backward[2]);
  EXPECT_EQ(step.simulation.makespan_seconds,
            simulate_pipeline_schedule(step.stages[0].pipeline.schedule, times).makespan_seconds);
}

// qwen3-tiny's last stage (with the unembedding and loss over 8192 tokens) is the slower one, and each of
// stage 0's forward + backward fits in one of its own: under 1F1B it never waits after its first forward
// arrives, so the step is F0 + M (F1 + B1) + B0 and stage 1 idles F0 + B0 of it. Unequal chunks: not the
// formula.
TEST(PipelineStep, OneFOneBWithASlowerLastStageIsItsClosedForm) {
  const int64_t micro_batches = 4;
  const PipelineStepPlan step = plan_pipeline_step(stage_request(
      {"gradient_accumulation_steps=" + std::to_string(micro_batches), "pipeline_schedule=1f1b"}));
  const auto seconds = [&](size_t stage, KernelName kernel) {
    return step.stages[stage].kernel(kernel).seconds;
  };
  const double F0 = seconds(0, KernelName::forward), B0 = seconds(0, KernelName::backward),
               F1 = seconds(1, KernelName::forward), B1 = seconds(1, KernelName::backward);
  ASSERT_GT(F1 + B1, F0 + B0) << "the closed form needs the last stage to be the slower";
  const double span = F0 + static_cast<double>(micro_batches) * (F1 + B1) + B0;
  EXPECT_NEAR(step.simulation.makespan_seconds, span, 1e-9 * span);
  EXPECT_NEAR(step.simulation.ranks[1].bubble_fraction, (F0 + B0) / span, 1e-9);
  EXPECT_NEAR(step.simulation.ranks[0].idle_seconds, span - static_cast<double>(micro_batches) * (F0 + B0),
              1e-9 * span);
  EXPECT_NE(step.simulation.ranks[1].bubble_fraction,
            pipeline_bubble_formula(step.stages[0].pipeline.schedule, stage_op_times(step.stages)));
}

// The spec table's (P - 1) / (V M + P - 1) is what the simulation gives when every chunk takes as long;
// zero bubble's (P - 1)(F + B_input - W) / (M (F + B) + that) too, where W <= B_input (a longer W leaves
// (P - 1) F idle).
TEST(PipelineStep, FormulaEqualsTheSimulationOfEqualChunks) {
  using Kind = PipelineScheduleKind;
  for (const auto& [kind, stages, micro_batches, repeats] :
       std::vector<std::tuple<Kind, int64_t, int64_t, int64_t>>{{Kind::gpipe, 2, 1, 1},
                                                                {Kind::gpipe, 4, 3, 1},
                                                                {Kind::one_f_one_b, 2, 2, 1},
                                                                {Kind::one_f_one_b, 4, 8, 1},
                                                                {Kind::interleaved_one_f_one_b, 2, 4, 2},
                                                                {Kind::zero_bubble, 2, 2, 1},
                                                                {Kind::zero_bubble, 4, 8, 1}}) {
    const PipelineSchedule schedule = build_pipeline_schedule(kind, stages, micro_batches, repeats);
    for (const auto& [input, weight] : std::vector<std::pair<double, double>>{{0.25, 0.35}, {0.4, 0.2}}) {
      const PipelineOpTimes times = equal_chunk_op_times(stages * repeats, 0.3, input, weight);
      const PipelineSimulation simulation = simulate_pipeline_schedule(schedule, times);
      const double P = static_cast<double>(stages), M = static_cast<double>(micro_batches),
                   V = static_cast<double>(repeats);
      const double idle = (P - 1) * (0.3 + std::max(0.0, input - weight));
      const double expected = kind == Kind::zero_bubble ? idle / (M * (0.3 + input + weight) + idle)
                                                        : (P - 1) / (V * M + P - 1);
      EXPECT_NEAR(pipeline_bubble_formula(schedule, times), expected, 1e-15);
      EXPECT_NEAR(simulation.max_bubble_fraction, pipeline_bubble_formula(schedule, times), 1e-12)
          << pipeline_schedule_name(kind) << " P=" << stages << " M=" << micro_batches << " V=" << repeats
          << " B_input=" << input << " W=" << weight;
    }
  }
}

// A stage plan's error (here 1F1B with fewer micro-batches than stages) is plan_training's MeshError.
TEST(PipelineStep, BadSchedulesAreThePlansErrors) {
  try {
    plan_pipeline_step(stage_request({"gradient_accumulation_steps=1", "pipeline_schedule=1f1b"}));
    FAIL() << "planned 1f1b with 1 micro-batch on 2 stages";
  } catch (const MeshError& error) {
    EXPECT_NE(std::string(error.what()).find("gradient_accumulation_steps"), std::string::npos)
        << error.what();
  }
}

}  // namespace
}  // namespace meshtrain
