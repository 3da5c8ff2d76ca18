// train/run: the Run object's set-up phases and step() on one process: steps counted, the outcome of each
// step, a stop after step k, the final save and the run files.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "meshtrain/core/error.h"
#include "meshtrain/runtime/engine.h"
#include "meshtrain/train/run.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;

Config tiny_config(const std::string& run_dir, int64_t steps) {
  return load_config(
      "qwen3-tiny",
      {"base_emb_dim=32", "base_num_query_heads=4", "base_num_kv_heads=2", "head_dim=8", "base_mlp_dim=48",
       "base_num_decoder_layers=2", "vocab_size=100", "max_target_length=16", "per_device_batch_size=2",
       "dataset_type=synthetic", "tokenizer_path=", "dataset_path=", "eval_dataset_path=", "eval_interval=0",
       "checkpoint_period=0", "learning_rate=1e-2", "steps=" + std::to_string(steps), "run_dir=" + run_dir});
}

// (Inside a TEST_F, plain `Run` names gtest's Test::Run: hence meshtrain::Run.)
class RunTest : public ::testing::Test {
 protected:
  void SetUp() override {
    run_dir_ = (fs::temp_directory_path() / ("meshtrain_run_" + std::to_string(getpid()))).string();
    fs::remove_all(run_dir_);
    ranks_.world = make_world_communicator(60.0);
  }
  void TearDown() override {
    std::fclose(console_);
    fs::remove_all(run_dir_);
  }

  std::string run_dir_;
  RunRanks ranks_;
  std::FILE* console_ = std::fopen("/dev/null", "w");
};

TEST_F(RunTest, StepsUntilDoneThenSaves) {
  const Config config = tiny_config(run_dir_, 3);
  meshtrain::Run run(config, prepare_run(config, 1), console_, ranks_);
  EXPECT_TRUE(fs::is_regular_file(run_dir_ + "/config.yaml")) << "set-up writes the run files";
  EXPECT_TRUE(fs::is_regular_file(run_dir_ + "/plan_fwd_bwd.json"));
  int steps = 0;
  while (run.steps_left()) {
    EXPECT_EQ(run.step({}), StepOutcome::trained);
    ++steps;
  }
  EXPECT_EQ(steps, 3);
  const TrainingSummary summary = run.finish();
  EXPECT_EQ(summary.first_step, 0);
  EXPECT_EQ(summary.steps_completed, 3);
  EXPECT_FALSE(summary.interrupted);
  EXPECT_NE(summary.last_checkpoint.find("step_00000003"), std::string::npos) << summary.last_checkpoint;
  std::ifstream metrics(run_dir_ + "/metrics.jsonl");
  int lines = 0;
  for (std::string line; std::getline(metrics, line);) ++lines;
  EXPECT_EQ(lines, 3);
}

TEST_F(RunTest, StopAfterStepEndsTheRunAndAResumeContinues) {
  const Config config = tiny_config(run_dir_, 4);
  {
    meshtrain::Run run(config, prepare_run(config, 1), console_, ranks_);
    EXPECT_EQ(run.step({2}), StepOutcome::trained);
    EXPECT_EQ(run.step({2}), StepOutcome::stopped);
    const TrainingSummary summary = run.finish();
    EXPECT_TRUE(summary.interrupted);
    EXPECT_EQ(summary.steps_completed, 2);
  }
  RunRanks resumed_ranks;
  resumed_ranks.world = make_world_communicator(60.0);
  meshtrain::Run resumed(config, prepare_run(config, 1), console_, resumed_ranks);
  int steps = 0;
  while (resumed.steps_left()) {
    resumed.step({});
    ++steps;
  }
  EXPECT_EQ(steps, 2);
  EXPECT_EQ(resumed.finish().first_step, 2);
}

TEST_F(RunTest, NonPositiveStepsIsASetupError) {
  EXPECT_THROW(prepare_run(tiny_config(run_dir_, 0), 1), MeshError);
}

}  // namespace
}  // namespace meshtrain

namespace meshtrain {
namespace {

// Expert parallelism runs: each rank holds E / P routed experts (the stacked weights' first dim split over
// expert), the assignments travel in fixed all_to_all blocks over the expert axis (counts, tokens and the
// experts' output forward; the two gradients backward), and only the parameters the expert ranks share
// (not the routed experts) have their gradients all-reduced over expert.
TEST(RunsHere, AnExpertAxisSplitsTheRoutedExpertsAndPassesTheirRows) {
  PlanRequest request;
  request.config = load_config(
      "deepseek-tiny", {"num_experts=4", "base_moe_mlp_dim=32", "mesh.expert=2", "base_num_decoder_layers=2",
                        "dataset_type=synthetic", "tokenizer_path="});
  request.devices = 2;
  const TrainingPlan plan = plan_training(request);
  check_plan_runs_here(plan, 2);
  const ModelSpec& spec = plan.spec;
  int64_t routed = 0;
  for (const ParameterDecl& parameter : spec.parameters) {
    const Shape& shape = spec.buffer(parameter.value).shape;
    if (parameter.canonical_name.find("/moe/routed_experts/") == std::string::npos) continue;
    ++routed;
    EXPECT_EQ(shape.dims[0], 2) << parameter.canonical_name;  // 4 experts over 2 ranks
  }
  EXPECT_EQ(routed, 3);  // one MoE layer: wi_0, wi_1, wo
  int64_t all_to_alls = 0;
  for (const PlanOp& op : plan.kernel(KernelName::fwd_bwd).ops) {
    if (op.op->kind == OpKind::collective && op.op->collective.kind == CollectiveKind::all_to_all) {
      EXPECT_EQ(op.op->collective.axis, MeshAxis::expert) << op.op->name;
      EXPECT_GT(op.collective_bytes, 0.0) << op.op->name;
      ++all_to_alls;
    }
  }
  EXPECT_EQ(all_to_alls, 5);  // counts, tokens, output; two gradients
  std::set<std::string> reduced_over_expert;
  for (const PlanOp& op : plan.kernel(KernelName::update).ops) {
    if (op.op->kind == OpKind::collective && op.op->collective.axis == MeshAxis::expert &&
        op.op->role == OpRole::data_gradient_reduction)
      reduced_over_expert.insert(spec.parameters[static_cast<size_t>(op.op->parameter)].canonical_name);
  }
  EXPECT_EQ(reduced_over_expert.size(), spec.parameters.size() - 3);
  for (const std::string& name : reduced_over_expert)
    EXPECT_EQ(name.find("/moe/routed_experts/"), std::string::npos) << name;
}

}  // namespace
}  // namespace meshtrain
