// train/run: the Run object's set-up phases and step() on one process: steps counted, the outcome of each
// step, a stop after step k, the final save and the run files, and an exact unshuffled batch.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "error_text.h"
#include "meshtrain/core/error.h"
#include "meshtrain/data/shards.h"
#include "meshtrain/data/tokenizer/tokenizer.h"
#include "meshtrain/kernels/backend.h"
#include "meshtrain/plan/decode.h"
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

// The identity every rank compares covers the libraries, where the code is, not only the executable.
TEST(RunIdentity, CoversTheExecutableAndTheMeshtrainLibraries) {
  const std::vector<std::string> files = process_code_files();
  ASSERT_FALSE(files.empty());
  EXPECT_EQ(files.front(), "/proc/self/exe");
  const auto loaded = [&](const std::string& library) {
    return std::any_of(files.begin(), files.end(),
                       [&](const std::string& file) { return fs::path(file).filename() == library; });
  };
  EXPECT_TRUE(loaded("libmeshtrain_core.so")) << "files: " << files.size();
  EXPECT_TRUE(loaded("libmeshtrain_train.so"));
  EXPECT_TRUE(loaded("libmeshtrain_runtime.so"));
  // The same code and config give the same identity; one key changed, another.
  const Config config = tiny_config("identity", 3);
  EXPECT_EQ(run_identity(config), run_identity(tiny_config("identity", 3)));
  EXPECT_NE(run_identity(config), run_identity(tiny_config("identity", 4)));
}

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
  EXPECT_EQ(summary.stop_reason, StopReason::none);
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
    EXPECT_EQ(summary.stop_reason, StopReason::requested);
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

// Issue 41: with learning_rate_schedule_steps set, a run of 2 steps resumed to 4 trains what a 4-step run
// does, bitwise (losses, rates, gradient norms, and the weights and moments saved at step 4); without it the
// first leg decays over its own 2 steps and the weights part from step 1 on.
TEST_F(RunTest, AResumeWithMoreStepsKeepsASetScheduleBitwise) {
  const auto train = [&](const std::string& run_dir, int64_t steps, const std::string& schedule_steps) {
    Config config = tiny_config(run_dir, steps);
    config.set("learning_rate_schedule_steps", schedule_steps);
    RunRanks ranks;
    ranks.world = make_world_communicator(60.0);
    meshtrain::Run run(config, prepare_run(config, 1), console_, ranks);
    while (run.steps_left()) run.step({});
    run.finish();
  };
  const auto trained = [](const std::string& run_dir) {  // per step: what the step computed and read
    std::vector<nlohmann::json> steps;
    std::ifstream metrics(run_dir + "/metrics.jsonl");
    for (std::string line; std::getline(metrics, line);) {
      const nlohmann::json record = nlohmann::json::parse(line);
      steps.push_back({{"loss", record.at("loss")},
                       {"lr", record.at("lr")},
                       {"grad_norm", record.at("grad_norm")},
                       {"raw_grad_norm", record.at("raw_grad_norm")},
                       {"batch_crc32c", record.at("batch_crc32c")}});
    }
    return steps;
  };
  const auto saved_state = [](const std::string& run_dir) {
    std::ifstream file(run_dir + "/checkpoints/step_00000004/shards/rank_00000.safetensors",
                       std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  };
  train(run_dir_ + "/whole", 4, "4");
  train(run_dir_ + "/legs", 2, "4");
  train(run_dir_ + "/legs", 4, "4");
  const std::vector<nlohmann::json> whole = trained(run_dir_ + "/whole"), legs = trained(run_dir_ + "/legs");
  ASSERT_EQ(whole.size(), 4u);
  ASSERT_EQ(legs, whole);
  const std::string state = saved_state(run_dir_ + "/whole");
  ASSERT_FALSE(state.empty());
  EXPECT_TRUE(saved_state(run_dir_ + "/legs") == state) << "the weights and moments at step 4 differ";

  train(run_dir_ + "/unset", 2, "-1");
  train(run_dir_ + "/unset", 4, "-1");
  const std::vector<nlohmann::json> unset = trained(run_dir_ + "/unset");
  ASSERT_EQ(unset.size(), 4u);
  EXPECT_NE(unset[1].at("lr"), whole[1].at("lr")) << "the 2-step leg has a schedule of its own";
  EXPECT_NE(unset[2].at("loss"), whole[2].at("loss"));
}

// A full state resumes with its global batch: gradient_accumulation_steps derived for the new device count
// and batch size, or a count that cannot divide it refused before anything loads; weights only derive
// nothing.
TEST_F(RunTest, ResumeKeepsTheCheckpointsGlobalBatch) {
  {
    Config saved = tiny_config(run_dir_, 2);
    saved.set("gradient_accumulation_steps", "2");  // 2 rows x 2 micro-batches: 4 rows a step
    meshtrain::Run run(saved, prepare_run(saved, 1), console_, ranks_);
    while (run.steps_left()) run.step({});
    run.finish();
  }
  Config one_row = tiny_config(run_dir_, 4);
  one_row.set("per_device_batch_size", "1");
  const std::string line = keep_checkpoint_global_batch(one_row, 1);
  EXPECT_EQ(one_row.gradient_accumulation_steps, 4);
  EXPECT_NE(std::find(one_row.resolved.begin(), one_row.resolved.end(),
                      std::pair<std::string, std::string>{"gradient_accumulation_steps", "4"}),
            one_row.resolved.end())
      << "config.yaml and the checkpoints record the derived value";
  for (const char* needle : {"gradient_accumulation_steps 1 -> 4", "global batch of 4 rows", "step_00000002",
                             "per_device_batch_size 1 x 1 process"})
    EXPECT_NE(line.find(needle), std::string::npos) << needle << " in " << line;
  Config two_ranks = tiny_config(run_dir_, 4);
  two_ranks.set("per_device_batch_size", "1");
  keep_checkpoint_global_batch(two_ranks, 2);
  EXPECT_EQ(two_ranks.gradient_accumulation_steps, 2);
  Config same = tiny_config(run_dir_, 4);
  same.set("gradient_accumulation_steps", "2");
  EXPECT_EQ(keep_checkpoint_global_batch(same, 1), "") << "nothing to say when the config already keeps it";
  // The resumed run trains with it.
  meshtrain::Run resumed(one_row, prepare_run(one_row, 1), console_, ranks_);
  EXPECT_EQ(resumed.step({}), StepOutcome::trained);

  Config three_rows = tiny_config(run_dir_, 4);
  three_rows.set("per_device_batch_size", "3");
  three_rows.set("mesh.data", "2");
  const std::string refused = testing::error_of([&] { keep_checkpoint_global_batch(three_rows, 2); });
  for (const char* needle : {"step_00000002/metadata.json: data_cursor", "global batch of 4 rows",
                             "per_device_batch_size 3 x 2 processes = 6 rows a micro-batch", "mesh data=2",
                             "whose product divides 4"})
    EXPECT_NE(refused.find(needle), std::string::npos) << needle << " in " << refused;

  const std::string checkpoint = run_dir_ + "/checkpoints/step_00000002";
  Config full_state = tiny_config(run_dir_ + "_elsewhere", 4);
  full_state.set("per_device_batch_size", "1");
  full_state.load_full_state_path = checkpoint;
  EXPECT_NE(keep_checkpoint_global_batch(full_state, 1), "");
  EXPECT_EQ(full_state.gradient_accumulation_steps, 4);
  Config weights_only = tiny_config(run_dir_ + "_elsewhere", 4);
  weights_only.set("per_device_batch_size", "3");
  weights_only.load_parameters_path = checkpoint;
  EXPECT_EQ(keep_checkpoint_global_batch(weights_only, 1), "") << "weights only start a new data order";
  EXPECT_EQ(weights_only.gradient_accumulation_steps, 1);
}

// Each step's record says how long it waited for its batches (prepared a step ahead) and which tokens it
// read; the trace shows the wait.
TEST_F(RunTest, StepRecordsItsDataWaitAndBatchChecksum) {
  Config config = tiny_config(run_dir_, 3);
  config.set("profiler", "trace");
  config.set("profiler_steps", "2");
  meshtrain::Run run(config, prepare_run(config, 1), console_, ranks_);
  while (run.steps_left()) run.step({});
  run.finish();
  std::ifstream metrics(run_dir_ + "/metrics.jsonl");
  std::set<std::string> checksums;
  for (std::string line; std::getline(metrics, line);) {
    const nlohmann::json record = nlohmann::json::parse(line);
    EXPECT_GE(record.at("data_wait_s").get<double>(), 0.0);
    EXPECT_NEAR(record.at("data_wait_fraction").get<double>(),
                record["data_wait_s"].get<double>() / record["step_time_s"].get<double>(), 1e-12);
    checksums.insert(record.at("batch_crc32c").get<std::string>());
  }
  EXPECT_EQ(checksums.size(), 3u) << "every step reads other tokens";
  const nlohmann::json trace = nlohmann::json::parse(std::ifstream(run_dir_ + "/trace_step2.json"));
  int waits = 0;
  for (const nlohmann::json& event : trace.at("traceEvents"))
    waits += event.at("name") == "data_wait" && event.at("cat") == "data";
  EXPECT_EQ(waits, 1);
}

// A skipped step (non-finite loss, skip_nonfinite_steps) consumes its batch as an unskipped one does: the
// step after reads the tokens the run without the fault read.
TEST_F(RunTest, SkippedStepConsumesItsBatch) {
  const auto checksums = [&](const std::string& run_dir, const char* fault) {
    Config config = tiny_config(run_dir, 3);
    config.set("skip_nonfinite_steps", "true");
    if (fault != nullptr) ::setenv("MESHTRAIN_FAULT", fault, 1);
    RunRanks ranks;
    ranks.world = make_world_communicator(60.0);
    {
      meshtrain::Run run(config, prepare_run(config, 1), console_, ranks);
      std::vector<StepOutcome> outcomes;
      while (run.steps_left()) outcomes.push_back(run.step({}));
      run.finish();
      EXPECT_EQ(outcomes[1], fault != nullptr ? StepOutcome::skipped : StepOutcome::trained);
    }
    ::unsetenv("MESHTRAIN_FAULT");
    std::map<int64_t, std::string> by_step;
    std::ifstream metrics(run_dir + "/metrics.jsonl");
    for (std::string line; std::getline(metrics, line);) {
      const nlohmann::json record = nlohmann::json::parse(line);
      by_step[record.at("step").get<int64_t>()] = record.at("batch_crc32c").get<std::string>();
    }
    return by_step;
  };
  const std::map<int64_t, std::string> clean = checksums(run_dir_ + "/clean", nullptr);
  const std::map<int64_t, std::string> skipped = checksums(run_dir_ + "/skipped", "nan_loss:2:0");
  ASSERT_EQ(clean.size(), 3u);
  ASSERT_EQ(skipped.size(), 2u) << "a skipped step writes no record";
  EXPECT_EQ(skipped.at(1), clean.at(1));
  EXPECT_EQ(skipped.at(3), clean.at(3));
}

// z_loss_multiplier m > 0: every step's record has z_loss (the mean of m lse^2 over the valid tokens), and
// loss is lm_loss + z_loss (a dense model has no balance loss). At step 1 the weights are the initial ones:
// lm_loss is the run's without the z-loss, and with logits near 0 every lse is near log(100) (the 100 valid
// of 128 padded columns). Later steps differ: the z-loss's gradient trained them. m = 0: no z_loss.
TEST_F(RunTest, ZLossIsReportedApartAndAddedToTheLoss) {
  const auto records = [&](const std::string& run_dir, const std::string& multiplier) {
    Config config = tiny_config(run_dir, 3);
    config.set("z_loss_multiplier", multiplier);
    {
      meshtrain::Run run(config, prepare_run(config, 1), console_, ranks_);
      while (run.steps_left()) EXPECT_EQ(run.step({}), StepOutcome::trained);
      run.finish();
    }
    std::vector<nlohmann::json> lines;
    std::ifstream metrics(run_dir + "/metrics.jsonl");
    for (std::string line; std::getline(metrics, line);) lines.push_back(nlohmann::json::parse(line));
    return lines;
  };
  const double multiplier = 0.01;
  const std::vector<nlohmann::json> with = records(run_dir_ + "/z_loss", "0.01");
  const std::vector<nlohmann::json> without = records(run_dir_ + "/plain", "0");
  ASSERT_EQ(with.size(), 3u);
  ASSERT_EQ(without.size(), 3u);
  for (size_t step = 0; step < 3; ++step) {
    const double z_loss = with[step].at("z_loss"), lm_loss = with[step].at("lm_loss");
    EXPECT_GT(z_loss, 0.0) << "step " << step + 1;
    EXPECT_EQ(with[step].at("loss").get<double>(), lm_loss + z_loss) << "step " << step + 1;
    EXPECT_FALSE(without[step].contains("z_loss")) << "step " << step + 1;
    EXPECT_EQ(without[step].at("loss"), without[step].at("lm_loss")) << "step " << step + 1;
  }
  EXPECT_NEAR(std::sqrt(with[0].at("z_loss").get<double>() / multiplier), std::log(100.0), 0.02);
  EXPECT_EQ(with[0].at("lm_loss"), without[0].at("lm_loss"));
  EXPECT_NE(with[1].at("lm_loss"), without[1].at("lm_loss"));
  EXPECT_NE(with[2].at("lm_loss"), without[2].at("lm_loss"));
}

TEST_F(RunTest, NonPositiveStepsIsASetupError) {
  EXPECT_THROW(prepare_run(tiny_config(run_dir_, 0), 1), MeshError);
}

// The exact batch of issue 37: a token shard of B documents of S tokens each, packing=false,
// enable_data_shuffling=false, per_device_batch_size=B, gradient_accumulation_steps=1. The step trains on
// those B rows, every one of the B x S targets counted (metrics.jsonl's valid_tokens), and the first step
// of a shard with B more documents after them sees the same batch (bitwise the same loss). Which rows the
// loader gives, cell by cell: ExactBatchTest in test_loader.cpp.
TEST_F(RunTest, AnExactUnshuffledBatchTrainsOnItsBTimesSTargets) {
  constexpr int64_t kRows = 4, kSequence = 16;
  const fs::path data = fs::path(run_dir_) / "data";
  fs::create_directories(data);
  const Tokenizer tokenizer = train_bpe_tokenizer({"in the beginning"}, 257, {"<|endoftext|>"});
  save_trained_tokenizer(tokenizer, (data / "tokenizer.json").string());
  const int32_t eos = *tokenizer.eos_id();
  ASSERT_GT(eos, 200) << "the documents' ids 1..200 must not hold the EOS id";
  std::vector<std::vector<int32_t>> documents(2 * kRows);
  for (int64_t i = 0; i < 2 * kRows; ++i) {
    for (int64_t c = 0; c < kSequence; ++c)
      documents[i].push_back(static_cast<int32_t>(1 + (i * 37 + c) % 200));
  }
  // One step on `count` documents (a shard in its own folder), into its own run_dir: the step's metrics.
  const auto first_step = [&](int64_t count) {
    const fs::path folder = data / ("first_" + std::to_string(count));
    fs::create_directories(folder);
    write_token_shard((folder / "train.tokens").string(),
                      std::vector(documents.begin(), documents.begin() + count), eos);
    Config config = tiny_config((folder / "run").string(), 1);
    for (const auto& [key, value] : std::vector<std::pair<std::string, std::string>>{
             {"dataset_type", "tokens"},
             {"dataset_path", folder.string()},
             {"tokenizer_path", (data / "tokenizer.json").string()},
             {"vocab_size", "257"},
             {"max_target_length", std::to_string(kSequence)},
             {"packing", "false"},
             {"enable_data_shuffling", "false"},
             {"per_device_batch_size", std::to_string(kRows)},
             {"gradient_accumulation_steps", "1"}}) {
      config.set(key, value);
    }
    RunRanks ranks;
    ranks.world = make_world_communicator(60.0);
    meshtrain::Run run(config, prepare_run(config, 1), console_, ranks);
    EXPECT_EQ(run.step({}), StepOutcome::trained);
    run.finish();
    std::ifstream metrics(folder / "run" / "metrics.jsonl");
    std::string line;
    std::getline(metrics, line);
    return nlohmann::json::parse(line);
  };
  const nlohmann::json exact = first_step(kRows);
  EXPECT_EQ(exact.at("valid_tokens").get<int64_t>(), kRows * kSequence);
  const nlohmann::json longer = first_step(2 * kRows);
  EXPECT_EQ(longer.at("valid_tokens").get<int64_t>(), kRows * kSequence);
  EXPECT_EQ(longer.at("loss").get<double>(), exact.at("loss").get<double>());
}

}  // namespace
}  // namespace meshtrain

namespace meshtrain {
namespace {

// What check_plan_runs_here asks the device itself (device_resources), given here without a device: the
// planned arena plus the bytes the process holds beside it must fit the free memory (to the byte), the host
// (free_bytes 0) is not checked, and bfloat16 needs a device that runs it, except in a decode plan (float32).
TEST(RunsHere, TheDeviceMustHoldTheArenaAndRunTheDtype) {
  PlanRequest request;
  request.config = load_config("qwen3-tiny", {"dataset_type=synthetic", "tokenizer_path="});
  request.devices = 1;
  const TrainingPlan plan = plan_training(request);
  constexpr size_t kOverhead = size_t{96} << 20;
  kernels::DeviceResources gpu{"Test GPU (GPU 0, compute capability 9.0)", plan.arena_bytes + kOverhead,
                               kOverhead, true};
  EXPECT_EQ(testing::error_of([&] { check_device_runs_plan(plan, gpu); }), "");  // exactly fits
  gpu.free_bytes -= 1;
  const std::string short_of_memory = testing::error_of([&] { check_device_runs_plan(plan, gpu); });
  for (const std::string& part :
       {std::string("plan for topology 'cpu'"), std::string("Test GPU (GPU 0, compute capability 9.0)"),
        std::string("the planned arena "), std::string(" + 0.09375 GiB the process holds beside it"),
        std::string("more than is free"), std::string("nvidia-smi"), std::string("per_device_batch_size")}) {
    EXPECT_NE(short_of_memory.find(part), std::string::npos) << part << " not in: " << short_of_memory;
  }
  const kernels::DeviceResources host{"host memory", 0, 0, true};
  EXPECT_EQ(testing::error_of([&] { check_device_runs_plan(plan, host); }), "");

  PlanRequest bf16_request = request;
  bf16_request.config =
      load_config("qwen3-tiny", {"dataset_type=synthetic", "tokenizer_path=", "dtype=bfloat16"});
  const TrainingPlan bf16_plan = plan_training(bf16_request);
  kernels::DeviceResources turing{"Tesla T4 (GPU 0, compute capability 7.5)", size_t{15} << 30, kOverhead,
                                  false};
  const std::string no_bf16 = testing::error_of([&] { check_device_runs_plan(bf16_plan, turing); });
  for (const std::string& part : {std::string("config key 'dtype'"), std::string("compute capability 8.0"),
                                  std::string("bfloat16 on Tesla T4 (GPU 0, compute capability 7.5)"),
                                  std::string("set dtype=float32")}) {
    EXPECT_NE(no_bf16.find(part), std::string::npos) << part << " not in: " << no_bf16;
  }
  EXPECT_EQ(testing::error_of([&] { check_device_runs_plan(plan, turing); }), "") << "float32 runs there";
  EXPECT_EQ(testing::error_of([&] { check_device_runs_plan(plan_decode(bf16_request.config, 4), turing); }),
            "")
      << "a decode plan computes in float32";
}

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
