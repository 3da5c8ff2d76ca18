// The training step and loop: gradient accumulation normalised by the global token count, bitwise-exact
// resume, clean stops on SIGINT, and the errors a user meets first.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "gradcheck.h"
#include "meshtrain/checkpoint/checkpoint.h"
#include "meshtrain/core/error.h"
#include "meshtrain/data/loader.h"
#include "meshtrain/data/sources.h"
#include "meshtrain/model/spec.h"
#include "meshtrain/runtime/engine.h"
#include "meshtrain/train/trainer.h"

extern char** environ;

namespace meshtrain {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> tiny_overrides(const std::string& run_dir) {
  return {
      "base_emb_dim=32",         "base_num_query_heads=4",    "base_num_kv_heads=2", "head_dim=8",
      "base_mlp_dim=48",         "base_num_decoder_layers=2", "vocab_size=100",      "max_target_length=16",
      "per_device_batch_size=2", "dataset_type=synthetic",    "tokenizer_path=",     "dataset_path=",
      "eval_dataset_path=",      "eval_interval=0",           "checkpoint_period=0", "learning_rate=1e-2",
      "run_dir=" + run_dir};
}

// Replaces (or adds) key=value in an override list: the same key twice is a config error.
std::vector<std::string> with(std::vector<std::string> overrides, const std::string& key,
                              const std::string& value) {
  std::erase_if(overrides, [&](const std::string& item) { return item.starts_with(key + "="); });
  overrides.push_back(key + "=" + value);
  return overrides;
}

std::string fresh_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("meshtrain_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(dir);
  return dir.string();
}

std::vector<double> losses_of(const std::string& run_dir) {
  std::vector<double> losses;
  std::ifstream in(run_dir + "/metrics.jsonl");
  for (std::string line; std::getline(in, line);) losses.push_back(nlohmann::json::parse(line).at("loss"));
  return losses;
}

std::vector<float> all_parameters(const Engine& engine) {
  std::vector<float> values;
  for (const ParameterDecl& parameter : engine.spec().parameters) {
    const TensorView view = engine.view(parameter.value);
    values.insert(values.end(), view.f32(), view.f32() + view.elements());
  }
  return values;
}

// GA = 4 with micro-batch b equals one step on 4b: the same rows, the loss divided once by the global count.
TEST(TrainingStep, AccumulationOverFourMicroBatchesEqualsOneLargeBatch) {
  std::vector<std::string> base = tiny_overrides(fresh_dir("ga"));
  const auto config_with = [&](int64_t batch, int64_t accumulation) {
    return load_config("qwen3-tiny", with(with(base, "per_device_batch_size", std::to_string(batch)),
                                          "gradient_accumulation_steps", std::to_string(accumulation)));
  };
  const Config small = config_with(2, 4), large = config_with(8, 1);
  const auto loader_for = [](const Config& c) {
    LoaderOptions options;
    options.sequence_length = c.max_target_length;
    options.per_device_batch_size = c.per_device_batch_size;
    options.gradient_accumulation_steps = c.gradient_accumulation_steps;
    options.vocab_size = c.vocab_size;
    return BatchLoader(open_synthetic_rows(options), options);
  };
  Engine accumulated(small), single(large);
  BatchLoader small_loader = loader_for(small), large_loader = loader_for(large);
  for (int step = 0; step < 3; ++step) {
    LossSums sums_small;
    for (int micro = 0; micro < 4; ++micro) {
      const Batch batch = small_loader.micro_batch(0, micro);
      const LossSums s = micro == 0 ? accumulated.fwd_bwd(batch) : accumulated.fwd_bwd_accum(batch);
      sums_small.loss_sum += s.loss_sum;
      sums_small.valid_count += s.valid_count;
    }
    const LossSums sums_large = single.fwd_bwd(large_loader.micro_batch(0, 0));
    EXPECT_EQ(sums_small.valid_count, sums_large.valid_count);
    const double loss_error = std::fabs(sums_small.loss_sum - sums_large.loss_sum) / sums_large.loss_sum;
    testing::report_error("GA=4 vs batch 4b: loss, step " + std::to_string(step), loss_error, 1e-6);
    EXPECT_LT(loss_error, 1e-6);
    // Gradients are compared, not the parameters after AdamW: Adam divides by sqrt(v), which turns the
    // rounding noise of near-zero gradients into full-size steps of either sign.
    for (size_t p = 0; p < accumulated.spec().parameters.size(); ++p) {
      const TensorView a = accumulated.view(accumulated.spec().parameters[p].gradient);
      const TensorView b = single.view(single.spec().parameters[p].gradient);
      const double gradient_error =
          testing::relative_error(std::vector<float>(a.f32(), a.f32() + a.elements()),
                                  std::vector<float>(b.f32(), b.f32() + b.elements()));
      EXPECT_LT(gradient_error, 1e-5)
          << accumulated.spec().buffer(accumulated.spec().parameters[p].value).name << " step " << step;
    }
    const UpdateResult a = accumulated.update(sums_small.valid_count, 1e-2, step);
    const UpdateResult b = single.update(sums_large.valid_count, 1e-2, step);
    const double norm_error = std::fabs(a.raw_grad_norm - b.raw_grad_norm) / b.raw_grad_norm;
    testing::report_error("GA=4 vs batch 4b: gradient norm, step " + std::to_string(step), norm_error, 1e-6);
    EXPECT_LT(norm_error, 1e-6);
    // Re-synchronise, so that every step compares the two paths from the same parameters and moments.
    for (size_t p = 0; p < single.spec().parameters.size(); ++p) {
      const ParameterState& from = single.plan().optimizer.state(p);
      const ParameterState& to = accumulated.plan().optimizer.state(p);
      for (const auto& [source, destination] :
           {std::pair{single.spec().parameters[p].value, accumulated.spec().parameters[p].value},
            std::pair{from.moments.at(0), to.moments.at(0)},
            std::pair{from.moments.at(1), to.moments.at(1)}}) {
        std::memcpy(accumulated.view(destination).data, single.view(source).data,
                    single.view(source).bytes());
      }
    }
    small_loader.advance();
    large_loader.advance();
  }
}

TEST(TrainingStep, NoValidTargetsGivesZeroGradientNotNan) {
  Engine engine(load_config("qwen3-tiny", tiny_overrides(fresh_dir("empty"))));
  LoaderOptions options;
  options.sequence_length = 16;
  options.per_device_batch_size = 2;
  options.vocab_size = 100;
  Batch batch = BatchLoader(open_synthetic_rows(options), options).micro_batch(0, 0);
  std::fill(batch.loss_mask.begin(), batch.loss_mask.end(), 0);
  const LossSums sums = engine.fwd_bwd(batch);
  EXPECT_EQ(sums.valid_count, 0);
  const UpdateResult update = engine.update(0, 1e-2, 0);
  EXPECT_EQ(update.raw_grad_norm, 0.0);
  for (float value : all_parameters(engine)) ASSERT_TRUE(std::isfinite(value));
}

// N steps straight, or k steps, stop, resume, N-k steps: the same losses, compared with ==.
TEST(TrainingLoop, ResumeIsBitwiseExact) {
  const std::string straight = fresh_dir("straight"), resumed = fresh_dir("resumed");
  const auto config_for = [](const std::string& dir) {
    std::vector<std::string> overrides = tiny_overrides(dir);
    overrides.push_back("steps=6");
    overrides.push_back("gradient_accumulation_steps=2");
    return load_config("qwen3-tiny", overrides);
  };
  std::FILE* quiet = std::fopen("/dev/null", "w");
  run_training(config_for(straight), quiet);
  const TrainingSummary first_part = run_training(config_for(resumed), quiet, RunControl{3});
  EXPECT_EQ(first_part.stop_reason, StopReason::requested);
  EXPECT_EQ(first_part.steps_completed, 3);
  const TrainingSummary second_part = run_training(config_for(resumed), quiet);
  std::fclose(quiet);
  EXPECT_EQ(second_part.first_step, 3);
  const std::vector<double> expected = losses_of(straight), actual = losses_of(resumed);
  ASSERT_EQ(expected.size(), 6u);
  ASSERT_EQ(actual.size(), 6u);
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_EQ(actual[i], expected[i]) << "step " << i + 1;
  EXPECT_LT(expected.back(), expected.front());
  fs::remove_all(straight);
  fs::remove_all(resumed);
}

// SIGINT finishes the current step, saves a checkpoint and exits cleanly (status 130).
TEST(TrainingLoop, SigintSavesAndExitsCleanly) {
  const std::string run_dir = fresh_dir("sigint");
  std::vector<std::string> words = {MESHTRAIN_BINARY, "train", "qwen3-tiny", "steps=100000"};
  for (const std::string& override_text : tiny_overrides(run_dir)) words.push_back(override_text);
  std::vector<char*> argv;
  for (std::string& word : words) argv.push_back(word.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  pid_t child = 0;
  ASSERT_EQ(posix_spawn(&child, MESHTRAIN_BINARY, &actions, nullptr, argv.data(), environ), 0);
  posix_spawn_file_actions_destroy(&actions);
  // Wait until a few steps are logged, then interrupt. No deadline: a loaded machine may be slow to start
  // the child, and one that never logs is caught by ctest's own timeout; a child that exits early fails here.
  int status = 0;
  while (losses_of(run_dir).size() < 3) {
    ASSERT_EQ(waitpid(child, &status, WNOHANG), 0) << "the run ended before logging 3 steps";
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  kill(child, SIGINT);
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status)) << "killed by a signal instead of exiting";
  EXPECT_EQ(WEXITSTATUS(status), 130);
  const std::optional<std::string> latest = latest_checkpoint(run_dir + "/checkpoints");
  ASSERT_TRUE(latest.has_value());
  const int64_t logged = static_cast<int64_t>(losses_of(run_dir).size());
  EXPECT_EQ(*latest, run_dir + "/checkpoints/step_" + std::string(8 - std::to_string(logged).size(), '0') +
                         std::to_string(logged));
  fs::remove_all(run_dir);
}

TEST(TrainingLoop, MissingDataNamesTheFixAndWritesNothing) {
  const std::string run_dir = fresh_dir("nodata");
  std::vector<std::string> overrides = tiny_overrides(run_dir);
  overrides = with(with(overrides, "dataset_type", "tokens"), "dataset_path", run_dir + "/missing.tokens");
  try {
    std::FILE* quiet = std::fopen("/dev/null", "w");
    run_training(load_config("qwen3-tiny", overrides), quiet);
    std::fclose(quiet);
    FAIL() << "expected an error";
  } catch (const MeshError& error) {
    EXPECT_NE(std::string(error.what()).find("missing.tokens"), std::string::npos) << error.what();
  }
  EXPECT_FALSE(fs::exists(run_dir + "/checkpoints"));
}

}  // namespace
}  // namespace meshtrain
