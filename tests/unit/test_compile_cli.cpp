// Tests for `meshtrain compile`: run_compile in-process with a string stream. The printed figures are checked
// against a fresh plan_training of the same inputs, plan files against serialize_kernel_plan, --search's
// ranking against the step time recomputed from a fresh plan, and bad input against the key it names.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "error_text.h"
#include "meshtrain/cli/compile.h"
#include "meshtrain/cli/info.h"
#include "meshtrain/config/config.h"
#include "meshtrain/core/error.h"
#include "meshtrain/plan/context_attention.h"
#include "meshtrain/plan/pipeline_step.h"
#include "meshtrain/plan/plan.h"
#include "meshtrain/plan/search.h"
#include "meshtrain/train/schedule.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;

bool contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

std::string run(const std::vector<std::string>& arguments) {
  std::ostringstream out;
  EXPECT_EQ(run_compile(arguments, out), 0);
  return out.str();
}

// The message of the MeshError run_compile throws for `arguments` ("" when none).
std::string error_of(const std::vector<std::string>& arguments) {
  return testing::error_of([&] {
    std::ostringstream out;
    run_compile(arguments, out);
  });
}

TrainingPlan fresh_plan(const std::string& config, const std::vector<std::string>& overrides,
                        const std::vector<KernelName>& kernels) {
  PlanRequest request;
  request.config = load_config(config, overrides);
  request.kernels = kernels;
  return plan_training(request);
}

std::string gib_text(double bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f", bytes / (1024.0 * 1024.0 * 1024.0));
  return text;
}

// The block of one kernel: from its "kernel NAME:" line to the next blank line.
std::string kernel_block(const std::string& output, const std::string& name) {
  const size_t start = output.find("\nkernel " + name + ":");
  if (start == std::string::npos) return "";
  return output.substr(start + 1, output.find("\n\n", start + 1) - start - 1);
}

class CompileCli : public ::testing::Test {
 protected:
  void SetUp() override {
    directory_ =
        fs::temp_directory_path() /
        ("meshtrain_compile_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(directory_);
  }
  void TearDown() override { fs::remove_all(directory_); }
  fs::path directory_;
};

// Issue 41: compile and info print the run's learning-rate schedule as a table (its rows are
// LearningRateSchedule.TheTableNamesEachPhaseAndWhatComesAfter's), here a wsd schedule shorter than the run.
TEST_F(CompileCli, CompileAndInfoPrintTheLearningRateSchedule) {
  const std::vector<std::string> overrides = {"kernels=update", "steps=120",
                                              "learning_rate_schedule_steps=100", "lr_schedule_type=wsd"};
  std::vector<std::string> arguments = {"qwen3-tiny"};
  arguments.insert(arguments.end(), overrides.begin(), overrides.end());
  const std::string table =
      learning_rate_schedule_table(learning_rate_schedule(load_config("qwen3-tiny", overrides)), 120);
  std::ostringstream info;
  EXPECT_EQ(run_info(arguments, info), 0);
  for (const std::string& output : {run(arguments), info.str()}) {
    EXPECT_TRUE(contains(output, table)) << output;
    EXPECT_TRUE(contains(output, "learning rate: wsd (linear decay) schedule of 100 steps")) << output;
    EXPECT_TRUE(contains(output, "this run: 120 steps, the last at lr 0 (20 steps after the schedule"))
        << output;
  }
}

TEST_F(CompileCli, PrintsEveryKernelAndTheVerdict) {
  const std::vector<std::string> overrides = {"topology=cpu", "mesh.data=2"};
  const std::string output = run({"qwen3-tiny", overrides[0], overrides[1]});
  const TrainingPlan plan = fresh_plan("qwen3-tiny", overrides, {kKernelNames.begin(), kKernelNames.end()});
  EXPECT_TRUE(contains(output, "identity " + plan.identity.hash)) << output;
  EXPECT_TRUE(contains(output, "data=2 fsdp=1 context=1 expert=1 tensor=1 (2 devices)")) << output;
  for (const KernelPlan& kernel : plan.kernels) {
    const std::string block = kernel_block(output, kernel_name(kernel.kernel));
    ASSERT_FALSE(block.empty()) << "no block for " << kernel_name(kernel.kernel) << " in\n" << output;
    EXPECT_TRUE(contains(block, std::to_string(kernel.ops.size()) + " ops")) << block;
    for (const char* label : {"FLOPs", "bytes accessed", "collective bytes", "arguments", "outputs",
                              "aliases", "temps", "peak", "predicted time"}) {
      EXPECT_TRUE(contains(block, std::string("  ") + label)) << label << " missing in\n" << block;
    }
    // Exact bytes of the memory figures, as planned.
    EXPECT_TRUE(contains(block, "(" + std::to_string(kernel.memory.peak) + " bytes)")) << block;
    EXPECT_TRUE(contains(block, "(" + std::to_string(kernel.memory.temps) + " bytes)")) << block;
  }
  ASSERT_TRUE(plan.fits());
  EXPECT_TRUE(contains(output, "\nfits: " + gib_text(static_cast<double>(plan.arena_bytes)) + " of " +
                                   gib_text(plan.device_memory_bytes) + " GiB\n"))
      << output;
  EXPECT_TRUE(contains(output, "(" + std::to_string(plan.arena_bytes) + " bytes)")) << output;
}

// The topology row names the rates the cost used for the compute dtype: the GEMM peak, attention, the loss's
// softmax and the elementwise ops' bandwidth (a user entry stating them; the built-in GPUs state none).
TEST_F(CompileCli, PrintsTheRatesEachOpKindIsPricedAt) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("meshtrain_compile_rates_" + std::to_string(::getpid()) + ".yaml"))
                               .string();
  std::ofstream(path) << "rated:\n  device_kind: cpu\n  num_devices: 0\n  host_memory_shared: true\n"
                         "  memory_gb: 64\n  peak_tflops: {float32: 0.4, bfloat16: 1.6}\n"
                         "  matmul_tflops: {float32: 0.375, bfloat16: 1.25}\n"
                         "  attention_tflops: {float32: 0.125, bfloat16: 0.25}\n"
                         "  loss_softmax_glogits: {float32: 0.5, bfloat16: 0.75}\n"
                         "  memory_bandwidth_gbs: 20\n  elementwise_gbs: {float32: 5, bfloat16: 6.5}\n"
                         "  intra_host_link_gbs: 20\n";
  const std::string float32 = run({"qwen3-tiny", "topologies_path=" + path, "topology=rated"});
  EXPECT_TRUE(
      contains(float32,
               "peak 0.4 TFLOP/s float32 (matmuls 0.375, attention 0.125, loss softmax 0.5 Glogit/s), "
               "memory 20 GB/s (elementwise 5)"))
      << float32;
  const std::string bf16 = run({"qwen3-tiny", "topologies_path=" + path, "topology=rated", "dtype=bfloat16"});
  EXPECT_TRUE(
      contains(bf16,
               "peak 1.6 TFLOP/s bfloat16 (matmuls 1.25, attention 0.25, loss softmax 0.75 Glogit/s), "
               "memory 20 GB/s (elementwise 6.5)"))
      << bf16;
  std::filesystem::remove(path);
  const std::string gpu = run({"qwen3-tiny", "topology=h100x1", "dtype=bfloat16"});
  EXPECT_TRUE(
      contains(gpu,
               "peak 989 TFLOP/s bfloat16 (matmuls 989, attention 989, loss softmax not priced), memory "
               "3350 GB/s (elementwise 3350)"))
      << gpu;
}

// Under mesh.expert > 1, compile says what each pair of expert ranks exchanges and one step's all-to-all
// bytes, by hand: deepseek-tiny has N = 16 x 128 = 2048 tokens a device, k = 2, D = 384 and 5 MoE layers;
// at P = 2 each rank holds 4 experts, so dropless blocks are N min(k, 4) = 4096 rows. A micro-batch moves,
// per MoE layer, half (the other rank's block) of the [P, E_l] int32 counts and of four [P B_c, D] float
// blocks (tokens, outputs, and their gradients): 5 x (16 + 4 x 2 x 4096 x 384 x 4 / 2) bytes, GA 3 times.
TEST_F(CompileCli, ExpertParallelPrintsTheBlocksAndTheStepsAllToAllBytes) {
  const std::string dropless =
      run({"deepseek-tiny", "topology=cpu", "mesh.expert=2", "gradient_accumulation_steps=3"});
  const int64_t step_bytes = 3 * 5 * (16 + 4 * 2 * 4096 * 384 * 4 / 2);
  EXPECT_TRUE(contains(dropless,
                       "\nexpert parallelism (P=2, 4 routed experts a rank): all_to_all blocks of "
                       "4096 rows a pair of ranks (dropless"))
      << dropless;
  EXPECT_TRUE(contains(dropless, "(" + std::to_string(step_bytes) + " bytes) all-to-all per device"))
      << dropless;
  // capacity_factor 1: ceil(2048 x 2 / 8) = 512 rows an expert, blocks of 4 x 512 rows.
  const std::string capacity = run({"deepseek-tiny", "topology=cpu", "mesh.expert=2", "capacity_factor=1.0"});
  EXPECT_TRUE(contains(capacity,
                       "all_to_all blocks of 2048 rows a pair of ranks (capacity_factor 1: 512 rows "
                       "an expert)"))
      << capacity;
  EXPECT_FALSE(contains(run({"deepseek-tiny", "topology=cpu"}), "expert parallelism"));
  // At DeepSeek-V3's scale dropless blocks do not fit, and the verdict says what bounds them.
  const std::string v3 =
      run({"deepseek-v3", "topology=h100x2048", "mesh.expert=64", "mesh.fsdp=32", "kernels=fwd_bwd"});
  EXPECT_TRUE(contains(v3, "does not fit")) << v3;
  EXPECT_TRUE(
      contains(v3, "hint: dropless expert parallelism sizes every all_to_all block for the worst case"))
      << v3;
}

TEST_F(CompileCli, PlansOnlyTheChosenKernels) {
  const std::string output = run({"qwen3-tiny", "kernels=update,fwd_bwd"});
  EXPECT_FALSE(kernel_block(output, "fwd_bwd").empty()) << output;
  EXPECT_FALSE(kernel_block(output, "update").empty()) << output;
  EXPECT_FALSE(contains(output, "kernel eval:")) << output;
  EXPECT_FALSE(contains(output, "kernel fwd_bwd_accum:")) << output;
  // Planned in kKernelNames order whatever order the list gives.
  EXPECT_LT(output.find("kernel fwd_bwd:"), output.find("kernel update:"));
}

TEST_F(CompileCli, DoesNotFitListsTheFiveLargestBuffers) {
  const std::vector<std::string> overrides = {"topology=h100x8", "mesh.fsdp=8", "kernels=fwd_bwd,update"};
  const std::string output = run({"qwen3-8b", overrides[0], overrides[1], overrides[2]});
  const TrainingPlan plan = fresh_plan("qwen3-8b", overrides, {KernelName::fwd_bwd, KernelName::update});
  ASSERT_FALSE(plan.fits())
      << "qwen3-8b at batch 4 without remat on 80 GB no longer overflows: pick another case";
  const size_t verdict =
      output.find("\ndoes not fit: " + gib_text(static_cast<double>(plan.arena_bytes)) + " of " +
                  gib_text(plan.device_memory_bytes) + " GiB, largest buffers:\n");
  ASSERT_NE(verdict, std::string::npos) << output;
  std::vector<const PlanBuffer*> owners;
  for (const PlanBuffer& buffer : plan.buffers) {
    if (buffer.part_of < 0) owners.push_back(&buffer);
  }
  std::stable_sort(owners.begin(), owners.end(),
                   [](const PlanBuffer* a, const PlanBuffer* b) { return a->bytes > b->bytes; });
  std::istringstream lines(output.substr(output.find('\n', verdict + 1) + 1));
  for (size_t i = 0; i < 5; ++i) {
    std::string line;
    ASSERT_TRUE(std::getline(lines, line));
    const PlanBuffer& expected = *owners[i];
    EXPECT_EQ(line, "  " + expected.name + " (" + buffer_kind_name(expected.kind) + ", " + expected.layer +
                        ") " + gib_text(static_cast<double>(expected.bytes)) + " GiB (" +
                        std::to_string(expected.bytes) + " bytes)");
  }
}

TEST_F(CompileCli, OutputIsStableAndExplainAddsUp) {
  const std::vector<std::string> arguments = {"qwen3-tiny", "mesh.fsdp=2", "remat_policy=full", "--explain"};
  // The planning wall time is the one figure that may differ between runs.
  const auto without_timing = [](std::string text) {
    const size_t at = text.find("planned in ");
    if (at != std::string::npos) {
      const size_t begin = at + std::string("planned in ").size();
      text.erase(begin, text.find(" ms", begin) - begin);
    }
    return text;
  };
  const std::string first = run(arguments);
  EXPECT_EQ(without_timing(first), without_timing(run(arguments)));
  const TrainingPlan plan = fresh_plan("qwen3-tiny", {"mesh.fsdp=2", "remat_policy=full"},
                                       {kKernelNames.begin(), kKernelNames.end()});
  size_t persistent = 0, layer0 = 0;
  for (const PlanBuffer& buffer : plan.buffers) {
    if (!buffer.persistent || buffer.part_of >= 0) continue;
    persistent += buffer.bytes;
    if (buffer.layer == "decoder/layers_0") layer0 += buffer.bytes;
  }
  EXPECT_TRUE(contains(first, "persistent region (arguments of every kernel)")) << first;
  EXPECT_TRUE(contains(first, "(" + std::to_string(persistent) + " bytes)\n")) << first;
  // qwen3-tiny's six layers are alike: one row for all of them.
  EXPECT_TRUE(contains(first, "decoder/layers_0..5")) << first;
  EXPECT_TRUE(contains(first, "(" + std::to_string(layer0) + " bytes) each")) << first;
  for (const KernelPlan& kernel : plan.kernels) {
    std::set<PlanBufferId> distinct;
    size_t distinct_bytes = 0;
    for (const PlanValue& value : kernel.values) {
      if (distinct.insert(value.buffer).second)
        distinct_bytes += plan.buffers[static_cast<size_t>(value.buffer)].bytes;
    }
    EXPECT_TRUE(contains(first, std::string("  ") + kernel_name(kernel.kernel) + " temporaries: " +
                                    std::to_string(distinct.size()) + " distinct buffers, " +
                                    gib_text(static_cast<double>(distinct_bytes)) + " GiB (" +
                                    std::to_string(distinct_bytes) + " bytes) if none shared memory"))
        << kernel_name(kernel.kernel) << "\n"
        << first;
    EXPECT_TRUE(contains(first, "the temps extent is " + gib_text(static_cast<double>(kernel.memory.temps)) +
                                    " GiB (" + std::to_string(kernel.memory.temps) + " bytes)"))
        << kernel_name(kernel.kernel);
  }
}

TEST_F(CompileCli, PlanOutWritesWhatSerializeKernelPlanGives) {
  const std::string stem = (directory_ / "nested" / "tiny").string();
  const std::vector<std::string> overrides = {"mesh.data=2", "kernels=fwd_bwd,update"};
  const std::string output = run({"qwen3-tiny", overrides[0], overrides[1], "plan_out=" + stem});
  const TrainingPlan plan = fresh_plan("qwen3-tiny", overrides, {KernelName::fwd_bwd, KernelName::update});
  for (KernelName kernel : {KernelName::fwd_bwd, KernelName::update}) {
    const std::string path = plan_file_path(stem, kernel);
    EXPECT_TRUE(contains(output, "  " + path + " (")) << output;
    std::ifstream file(path, std::ios::binary);
    ASSERT_TRUE(file) << path;
    std::stringstream text;
    text << file.rdbuf();
    EXPECT_EQ(text.str(), serialize_kernel_plan(plan, kernel)) << path;
    EXPECT_NO_THROW(verify_plan_file(plan, kernel, stem));
  }
  EXPECT_FALSE(fs::exists(plan_file_path(stem, KernelName::eval)));
  for (const auto& entry : fs::directory_iterator(directory_ / "nested")) {
    EXPECT_EQ(entry.path().extension(), ".json") << "left behind: " << entry.path();
  }
}

// The FLOPs of a kernel's attention ops, per device as planned (the average over context ranks).
double attention_flops_of(const KernelPlan& kernel) {
  double flops = 0.0;
  for (const PlanOp& op : kernel.ops) flops += op.op->kind == OpKind::attention ? op.flops : 0.0;
  return flops;
}

// The printed "attention per context rank (...): rank 0 X UNIT  rank 1 ...  max/mean M" line: the per-rank
// figures in FLOPs and max / mean. Empty when the output has no such line.
struct PrintedContextAttention {
  std::string line;
  std::vector<double> flops;
  double max_over_mean = 0.0;
};
PrintedContextAttention printed_context_attention(const std::string& output) {
  PrintedContextAttention printed;
  const size_t start = output.find("\nattention per context rank (");
  if (start == std::string::npos) return printed;
  printed.line = output.substr(start + 1, output.find('\n', start + 1) - start - 1);
  std::istringstream words(printed.line.substr(printed.line.find("):") + 2));
  for (std::string word; words >> word;) {
    if (word == "rank") {
      size_t rank = 0;
      double value = 0.0;
      std::string unit;
      words >> rank >> value >> unit;
      EXPECT_EQ(rank, printed.flops.size()) << printed.line;
      const double scale = unit == "TFLOP" ? 1e12 : unit == "GFLOP" ? 1e9 : unit == "MFLOP" ? 1e6 : 1.0;
      printed.flops.push_back(value * scale);
    } else if (word == "max/mean") {
      words >> printed.max_over_mean;
    }
  }
  return printed;
}

TEST_F(CompileCli, ContextParallelPrintsTheAttentionFlopsOfEachContextRank) {
  struct Case {
    std::vector<std::string> overrides;
    std::string label;  // in the printed line
    int64_t ranks;
  };
  const std::vector<Case> cases = {
      {{"mesh.context=2"}, "(dual_chunk_swap, C=2; one step: 1 micro-batch", 2},
      {{"mesh.context=4", "gradient_accumulation_steps=2", "remat_policy=full"},
       "(dual_chunk_swap, C=4; one step: 2 micro-batches",
       4},
      {{"mesh.context=2", "context_parallel_reorder=striped"}, "(striped, C=2;", 2},
      {{"mesh.context=4", "context_parallel_reorder=striped", "max_target_length=512"}, "(striped, C=4;", 4},
      {{"mesh.context=4", "context_parallel_load_balance=false"},
       "(none: context_parallel_load_balance=false, C=4;",
       4},
  };
  for (const Case& c : cases) {
    std::vector<std::string> overrides = {"topology=cpu"};
    overrides.insert(overrides.end(), c.overrides.begin(), c.overrides.end());
    std::vector<std::string> arguments = {"qwen3-tiny"};
    arguments.insert(arguments.end(), overrides.begin(), overrides.end());
    const std::string output = run(arguments);
    const PrintedContextAttention printed = printed_context_attention(output);
    ASSERT_FALSE(printed.line.empty()) << output;
    EXPECT_TRUE(contains(printed.line, c.label)) << printed.line;
    ASSERT_EQ(printed.flops.size(), static_cast<size_t>(c.ranks)) << printed.line;

    // The figures are the plan's: fwd_bwd's attention ops (per device, the average over ranks) times C is
    // the whole sequence's; a step is GA of them; each rank's share is its causal pairs'.
    const TrainingPlan plan = fresh_plan("qwen3-tiny", overrides, {kKernelNames.begin(), kKernelNames.end()});
    const KernelPlan& fwd_bwd = plan.kernel(KernelName::fwd_bwd);
    // fwd_bwd_accum runs the same attention, so a step's is GA x fwd_bwd's.
    EXPECT_EQ(attention_flops_of(plan.kernel(KernelName::fwd_bwd_accum)), attention_flops_of(fwd_bwd));
    const ContextAttentionLoad step = step_context_attention_load(plan);
    const double whole_step = attention_flops_of(fwd_bwd) * static_cast<double>(c.ranks) *
                              static_cast<double>(plan.spec.config.gradient_accumulation_steps);
    EXPECT_DOUBLE_EQ(step.total(), whole_step) << printed.line;
    ASSERT_EQ(step.flops.size(), printed.flops.size());
    for (size_t rank = 0; rank < step.flops.size(); ++rank) {
      EXPECT_NEAR(printed.flops[rank], step.flops[rank], 0.006 * step.flops[rank])
          << printed.line;  // 2 decimals
    }
    EXPECT_NEAR(printed.max_over_mean, step.max_over_mean(), 0.0005) << printed.line;
    if (plan.spec.config.context_parallel_load_balance) {
      EXPECT_LE(step.max_over_mean(), 1.01) << printed.line;  // balanced within 1%
    } else {
      // A plain split over 4 ranks: rank r has about (2r + 1) / 16 of the pairs, the last 7 / 4 of the mean.
      EXPECT_GT(step.max_over_mean(), 1.3) << printed.line;
      EXPECT_NEAR(step.max_over_mean(), 1.744, 0.001) << printed.line;
      EXPECT_TRUE(std::is_sorted(step.flops.begin(), step.flops.end())) << printed.line;
    }
    if (plan.spec.config.context_parallel_reorder == ContextReorder::dual_chunk_swap &&
        plan.spec.config.context_parallel_load_balance) {
      EXPECT_EQ(*std::max_element(step.flops.begin(), step.flops.end()),
                *std::min_element(step.flops.begin(), step.flops.end()))
          << printed.line;
      EXPECT_TRUE(contains(printed.line, "max/mean 1.000")) << printed.line;
    }

    // Each kernel's plan file records its own figures, summing to C x its attention FLOPs per device.
    for (const KernelPlan& kernel : plan.kernels) {
      const nlohmann::json file = nlohmann::json::parse(serialize_kernel_plan(plan, kernel.kernel));
      const ContextAttentionLoad load = context_attention_load(plan, kernel);
      if (load.empty()) {
        EXPECT_FALSE(file["cost"].contains("attention_flops_per_context_rank")) << kernel_name(kernel.kernel);
        continue;
      }
      EXPECT_EQ(file["cost"]["attention_flops_per_context_rank"].get<std::vector<double>>(), load.flops)
          << kernel_name(kernel.kernel);
      EXPECT_DOUBLE_EQ(load.total(), attention_flops_of(kernel) * static_cast<double>(c.ranks));
    }
    EXPECT_TRUE(context_attention_load(plan, plan.kernel(KernelName::update)).empty());
    EXPECT_FALSE(context_attention_load(plan, plan.kernel(KernelName::eval)).empty());
  }

  // One context rank: no such line, no such plan-file entry.
  const std::string single = run({"qwen3-tiny", "topology=cpu", "mesh.data=2"});
  EXPECT_FALSE(contains(single, "attention per context rank")) << single;
  const TrainingPlan plan = fresh_plan("qwen3-tiny", {"mesh.data=2"}, {KernelName::fwd_bwd});
  EXPECT_FALSE(
      contains(serialize_kernel_plan(plan, KernelName::fwd_bwd), "attention_flops_per_context_rank"));
}

// "1.433 s" / "12.500 ms" / "3.0 us" -> seconds
double parse_seconds(const std::string& value, const std::string& unit) {
  const double number = std::stod(value);
  return unit == "s" ? number : unit == "ms" ? number * 1e-3 : number * 1e-6;
}

TEST_F(CompileCli, SearchRanksFittingConfigurationsByStepTime) {
  const std::vector<std::string> overrides = {"topology=cpu", "mesh.data=2", "per_device_batch_size=4"};
  const SearchResult result = search_training_configurations(load_config("qwen3-tiny", overrides));
  EXPECT_EQ(result.devices, 2);
  EXPECT_EQ(result.global_batch, 8);
  // context 1: tensor in {1, 2} (6 query heads, one host), data x fsdp the rest; context 2: one mesh;
  // batch x GA = 4; three remat policies. Stage 2: one mesh, GA {1, 2, 4}: gpipe 3 times, 1f1b, zero_bubble
  // and interleaved twice each.
  EXPECT_EQ(result.planned, (2 + 1 + 1) * 3 * 3 + (3 + 2 + 2 + 2) * 3);
  ASSERT_FALSE(result.fitting.empty());
  for (size_t i = 1; i < result.fitting.size(); ++i) {
    EXPECT_LE(result.fitting[i - 1].step_seconds, result.fitting[i].step_seconds) << "rank " << i;
  }
  // The step time of the best is fwd_bwd + (GA - 1) x fwd_bwd_accum + update of its own plan (a pipelined
  // one's: tests/unit/test_search.cpp, StageCandidatesAreRankedByTheirPipelineStep).
  for (const FittingCandidate& best : {result.fitting.front(), result.fitting.back()}) {
    if (best.candidate.pipelined()) continue;
    std::vector<std::string> candidate = {"topology=cpu"};
    std::istringstream words(best.candidate.overrides());
    for (std::string word; words >> word;) candidate.push_back(word);
    const TrainingPlan plan = fresh_plan(
        "qwen3-tiny", candidate, {KernelName::fwd_bwd, KernelName::fwd_bwd_accum, KernelName::update});
    EXPECT_EQ(plan.mesh.to_string(), best.candidate.mesh.to_string());
    EXPECT_EQ(plan.arena_bytes, best.arena_bytes);
    EXPECT_DOUBLE_EQ(best.step_seconds,
                     plan.kernel(KernelName::fwd_bwd).seconds +
                         static_cast<double>(best.candidate.gradient_accumulation_steps - 1) *
                             plan.kernel(KernelName::fwd_bwd_accum).seconds +
                         plan.kernel(KernelName::update).seconds);
  }

  // The command prints the same ranking, fastest first.
  const std::string output = run({"qwen3-tiny", overrides[0], overrides[1], overrides[2], "--search"});
  EXPECT_TRUE(contains(output,
                       "\nsearched: data x stage x fsdp x context x tensor = 2; stage 1, 2 (at most the 6 "
                       "layers; gpipe, and 1f1b where gradient_accumulation_steps >= stage); context 1, 2; "
                       "tensor <= 2 and dividing the 6 query heads;"))
      << output;
  EXPECT_TRUE(contains(output, "planned " + std::to_string(result.planned) + " candidates")) << output;
  EXPECT_TRUE(contains(output, std::to_string(result.fitting.size()) + " fit;")) << output;
  // Table rows: "  rank data stage fsdp context tensor batch GA remat schedule arena time unit".
  std::vector<double> printed;
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);) {
    if (!line.starts_with("  ") || line.size() < 3 || !std::isdigit(static_cast<unsigned char>(line[2])))
      continue;
    std::istringstream fields(line);
    size_t rank = 0;
    int64_t data = 0, stage = 0, fsdp = 0, context = 0, tensor = 0, batch = 0, ga = 0;
    std::string remat, schedule, arena, time, unit;
    if (!(fields >> rank >> data >> stage >> fsdp >> context >> tensor >> batch >> ga >> remat >> schedule >>
          arena >> time >> unit))
      continue;
    EXPECT_EQ(rank, printed.size() + 1);
    printed.push_back(parse_seconds(time, unit));
  }
  ASSERT_EQ(printed.size(), std::min<size_t>(result.fitting.size(), 10)) << output;
  for (size_t i = 1; i < printed.size(); ++i) EXPECT_LE(printed[i - 1], printed[i]) << output;
  EXPECT_TRUE(contains(
      output, "best: meshtrain compile <config> topology=cpu " + result.fitting[0].candidate.overrides()))
      << output;
}

// --memory-budget=SIZE keeps exactly the candidates whose arena is within it, in the same order.
TEST_F(CompileCli, SearchKeepsWhatFitsAMemoryBudget) {
  const std::vector<std::string> overrides = {"topology=cpu", "mesh.data=2", "per_device_batch_size=4"};
  const Config config = load_config("qwen3-tiny", overrides);
  const SearchResult unbounded = search_training_configurations(config);
  ASSERT_GT(unbounded.fitting.size(), 2u);
  // A budget one byte under the fastest candidate's arena drops it and every other candidate that large.
  const size_t budget = unbounded.fitting.front().arena_bytes - 1;
  const SearchResult bounded = search_training_configurations(config, static_cast<double>(budget));
  EXPECT_EQ(bounded.memory_budget_bytes, static_cast<double>(budget));
  EXPECT_EQ(bounded.memory_limit_bytes(), static_cast<double>(budget));
  std::vector<std::string> expected;
  for (const FittingCandidate& fit : unbounded.fitting) {
    if (fit.arena_bytes <= budget) expected.push_back(fit.candidate.overrides());
  }
  std::vector<std::string> kept;
  for (const FittingCandidate& fit : bounded.fitting) kept.push_back(fit.candidate.overrides());
  ASSERT_FALSE(kept.empty());
  EXPECT_LT(kept.size(), unbounded.fitting.size());
  EXPECT_EQ(kept, expected);

  const std::string output = run({"qwen3-tiny", overrides[0], overrides[1], overrides[2], "--search",
                                  "--memory-budget=" + std::to_string(budget)});
  EXPECT_TRUE(contains(output, " per device (memory budget ")) << output;
  EXPECT_TRUE(contains(output, std::to_string(kept.size()) + " fit;")) << output;
  EXPECT_TRUE(contains(output, "best: meshtrain compile <config> topology=cpu " + kept.front())) << output;
  // A budget nothing fits names the budget, not the device.
  const std::string none =
      run({"qwen3-tiny", overrides[0], overrides[1], overrides[2], "--search", "--memory-budget=1MiB"});
  EXPECT_TRUE(contains(none, "no configuration fits: the smallest arena is ")) << none;
  EXPECT_TRUE(contains(none, "of 0.00 GiB (the memory budget)")) << none;
  // The value as the next word, as every flag takes one (the same budget: the planning time differs).
  const std::string spaced =
      run({"qwen3-tiny", overrides[0], overrides[1], overrides[2], "--search", "--memory-budget", "1MiB"});
  EXPECT_TRUE(contains(spaced, "of 0.00 GiB (the memory budget)")) << spaced;

  // Bad budgets: above the device's memory, without --search, without a value, not a size.
  const std::string above = error_of({"qwen3-tiny", "--search", "--memory-budget=100000GiB"});
  EXPECT_TRUE(contains(above, "meshtrain compile --memory-budget")) << above;
  EXPECT_TRUE(contains(above, "topology 'cpu'")) << above;
  EXPECT_TRUE(contains(above, "100000.00 GiB")) << above;
  const std::string alone = error_of({"qwen3-tiny", "--memory-budget=8GiB"});
  EXPECT_TRUE(contains(alone, "together with --search")) << alone;
  const std::string bare = error_of({"qwen3-tiny", "--search", "--memory-budget"});
  EXPECT_TRUE(contains(bare, "meshtrain compile --memory-budget")) << bare;
  EXPECT_TRUE(contains(bare, "SIZE after it")) << bare;
  const std::string words = error_of({"qwen3-tiny", "--search", "--memory-budget=lots"});
  EXPECT_TRUE(contains(words, "a size of at least one byte")) << words;
  EXPECT_TRUE(contains(words, "'lots'")) << words;
}

TEST_F(CompileCli, SearchSkipsInvalidMeshesAndSaysWhenNothingFits) {
  // qwen3-0.6b: 16 query / 8 kv heads; on 8 devices tensor in {1, 2, 4, 8} all divide both, so use a model
  // whose kv heads a tensor degree the query heads allow does not divide: qwen3-tiny (6 / 2) with tensor 3.
  const SearchResult tiny =
      search_training_configurations(load_config("qwen3-tiny", {"topology=cpu", "mesh.data=6"}));
  EXPECT_GT(tiny.invalid, 0) << "tensor 3 and 6 split 6 query heads but not 2 kv heads";
  EXPECT_LT(tiny.invalid, tiny.planned);
  // Context 3 and 6 cannot cut 128 tokens into 2C chunks: skipped, not planned and not a failure. Context 1:
  // 9 meshes (tensor 1, 2, 3, 6 with fsdp dividing the rest), context 2: 3; batch x GA = 16: 5 splits.
  // Stages 2, 3 and 6 (6 layers) over 3, 2 and 1 devices left: 3, 4 and 1 meshes; GA {16, 8, 4, 2, 1}:
  // gpipe each, 1f1b and zero_bubble where GA >= the stages (4, 3 and 2 times each), interleaved where the
  // stages divide GA and hold 2 layers each (4, 0 and 0 times).
  EXPECT_EQ(tiny.contexts.searched, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(tiny.contexts.skipped, (std::vector<int64_t>{3, 6}));
  EXPECT_EQ(tiny.stages, (std::vector<int64_t>{1, 2, 3, 6}));
  EXPECT_EQ(tiny.planned, (9 + 3) * 5 * 3 + (3 * (5 + 4 + 4 + 4) + 4 * (5 + 3 + 3) + 1 * (5 + 2 + 2)) * 3);
  const std::string six = run({"qwen3-tiny", "topology=cpu", "mesh.data=6", "--search"});
  EXPECT_TRUE(contains(six,
                       "; context 1, 2 (skipped 3, 6: max_target_length=128 does not split over them with "
                       "context_parallel_reorder=dual_chunk_swap); "))
      << six;
  // 14B on one 16 GB chip at batch 1: nothing fits, and the smallest arena is reported.
  std::ostringstream out;
  EXPECT_EQ(run_compile({"qwen3-14b", "topology=v5e-1", "per_device_batch_size=1", "--search"}, out), 0);
  EXPECT_TRUE(contains(out.str(), "no configuration fits: the smallest arena is ")) << out.str();
  // A config every candidate rejects says why instead of an empty table.
  const std::string rejected =
      run({"qwen3-tiny", "mesh.data=2", "logical_axis_rules.heads=data", "--search"});
  EXPECT_TRUE(
      contains(rejected, "every candidate was rejected; the first: config key 'logical_axis_rules.heads'"))
      << rejected;
}

TEST_F(CompileCli, BadInputNamesTheKey) {
  const std::string unknown = error_of({"qwen3-tiny", "topology=h1000x8"});
  EXPECT_TRUE(contains(unknown, "config key 'topology'")) << unknown;
  for (const char* name : {"cpu", "h100xN", "v6e-N"}) EXPECT_TRUE(contains(unknown, name)) << unknown;

  const std::string product = error_of({"qwen3-tiny", "topology=h100x8", "mesh.fsdp=4"});
  EXPECT_TRUE(contains(product, "config key 'mesh'")) << product;
  EXPECT_TRUE(contains(product, "product of 8")) << product;

  const std::string heads = error_of({"qwen3-tiny", "mesh.tensor=4"});
  EXPECT_TRUE(contains(heads, "config key 'base_num_query_heads'")) << heads;
  EXPECT_TRUE(contains(heads, "tensor degree 4")) << heads;

  const std::string kernel = error_of({"qwen3-tiny", "kernels=fwd_bwd,updat"});
  EXPECT_TRUE(contains(kernel, "config key 'kernels'")) << kernel;
  EXPECT_TRUE(contains(kernel, "did you mean 'update'")) << kernel;

  const std::string flag = error_of({"qwen3-tiny", "--explian"});
  EXPECT_TRUE(contains(flag, "did you mean '--explain'")) << flag;

  const std::string both = error_of({"qwen3-tiny", "--explain", "--search"});
  EXPECT_TRUE(contains(both, "not both")) << both;

  const std::string search_out = error_of({"qwen3-tiny", "plan_out=/tmp/x", "--search"});
  EXPECT_TRUE(contains(search_out, "config key 'plan_out'")) << search_out;

  const std::string missing = error_of({});
  EXPECT_TRUE(contains(missing, "meshtrain compile")) << missing;
}

// Context parallelism's bad input: a row length the reorder cannot cut and a context degree that does not
// divide the devices are refused before anything is planned, naming the keys, the values and the fix.
TEST_F(CompileCli, ContextParallelBadInputNamesTheKeysTheValuesAndTheFix) {
  const std::string dual = error_of({"qwen3-tiny", "topology=cpu", "mesh.context=2", "max_target_length=18"});
  EXPECT_TRUE(
      contains(dual,
               "config key 'max_target_length' (with mesh.context=2 and "
               "context_parallel_reorder=dual_chunk_swap): expected a multiple of 2 x mesh.context = 4"))
      << dual;
  EXPECT_TRUE(contains(dual, "found max_target_length=18")) << dual;
  EXPECT_TRUE(contains(dual,
                       "fix: use a max_target_length that is a multiple of 2 x mesh.context = 4 (16 or 20), "
                       "or context_parallel_reorder=striped"))
      << dual;

  const std::string striped = error_of({"qwen3-tiny", "topology=cpu", "mesh.context=4",
                                        "max_target_length=130", "context_parallel_reorder=striped"});
  EXPECT_TRUE(contains(striped,
                       "config key 'max_target_length' (with mesh.context=4 and "
                       "context_parallel_reorder=striped): expected a multiple of mesh.context = 4"))
      << striped;
  EXPECT_TRUE(contains(striped, "found max_target_length=130")) << striped;
  EXPECT_TRUE(
      contains(striped, "fix: use a max_target_length that is a multiple of mesh.context = 4 (128 or 132)"))
      << striped;

  const std::string plain = error_of({"qwen3-tiny", "topology=cpu", "mesh.context=4", "max_target_length=130",
                                      "context_parallel_load_balance=false"});
  EXPECT_TRUE(contains(plain, "(with mesh.context=4 and context_parallel_load_balance=false)")) << plain;
  EXPECT_TRUE(contains(plain, "expected a multiple of mesh.context = 4")) << plain;

  // mesh.context not dividing the devices: as a fixed mesh and with another axis filling in.
  const std::string fixed = error_of({"qwen3-tiny", "topology=h100x8", "mesh.context=3"});
  EXPECT_TRUE(contains(fixed,
                       "config key 'mesh': expected a product of 8 (the devices of topology h100x8), "
                       "found data=1 fsdp=1 context=3 expert=1 tensor=1 (product 3) (fix: "))
      << fixed;
  const std::string filled = error_of({"qwen3-tiny", "topology=h100x8", "mesh.data=-1", "mesh.context=3"});
  EXPECT_TRUE(
      contains(filled,
               "config key 'mesh': expected axes whose product divides the 8 devices of topology "
               "h100x8, found data=-1 fsdp=1 context=3 expert=1 tensor=1 (product of the fixed axes 3)"))
      << filled;
  EXPECT_TRUE(contains(filled, "(fix: change the fixed mesh.* axes so that their product divides 8)"))
      << filled;
  // The search skips such degrees instead (SearchSkipsInvalidMeshesAndSaysWhenNothingFits).
}

// run_compile's output and the MeshError it ends with, for a run that is refused after printing.
std::pair<std::string, std::string> output_and_error(const std::vector<std::string>& arguments) {
  std::ostringstream out;
  const std::string error = testing::error_of([&] { run_compile(arguments, out); });
  return {out.str(), error};
}

// "0.02 GiB (25165824 bytes)", as compile prints a figure.
std::string bytes_text(double bytes) {
  char text[64];
  std::snprintf(text, sizeof text, "%.2f GiB (%.0f bytes)", bytes / (1024.0 * 1024.0 * 1024.0), bytes);
  return text;
}

// Under mesh.stage > 1: the placement (each stage rank's chunks and layers, where the embedding and the head
// are, a tied table on both ends), then every stage rank's plan: its figures equal a fresh plan_training of
// that stage, its bubble the schedule simulated over the fresh plans' forward and backward times; plan_out
// writes each stage's files under STEM_stage<s> (and none under STEM).
TEST_F(CompileCli, StagesPrintEveryStagesPlanAndWriteItsFiles) {
  const std::string stem = (directory_ / "plan").string();
  const std::vector<std::string> overrides = {"topology=cpu",
                                              "mesh.stage=2",
                                              "base_num_decoder_layers=5",
                                              "gradient_accumulation_steps=4",
                                              "pipeline_schedule=1f1b",
                                              "logits_via_embedding=true",
                                              "max_target_length=32",
                                              "per_device_batch_size=2"};
  std::vector<std::string> arguments = {"qwen3-tiny"};
  arguments.insert(arguments.end(), overrides.begin(), overrides.end());
  arguments.push_back("plan_out=" + stem);
  const std::string output = run(arguments);
  EXPECT_TRUE(
      contains(output, "mesh               data=1 stage=2 fsdp=1 context=1 expert=1 tensor=1 (2 devices)"))
      << output;
  EXPECT_TRUE(contains(output, "plan               2 stage plans of 5 kernels each, planned in ")) << output;
  EXPECT_TRUE(contains(output,
                       "pipeline           mesh.stage 2 x num_pipeline_repeats 1 = 2 chunks of 5 layers (the "
                       "default placement: 1 chunks of 3, then 1 of 2), pipeline_schedule 1f1b over "
                       "gradient_accumulation_steps 4 micro-batches"))
      << output;
  EXPECT_TRUE(contains(output, "\nstage 0: chunk 0 (layers 0..2, embedding): 3 layers\n")) << output;
  EXPECT_TRUE(
      contains(output, "\nstage 1: chunk 1 (layers 3..4, final norm, unembedding and loss): 2 layers\n"))
      << output;
  EXPECT_TRUE(contains(output, "tied embeddings    stage 0 and stage 1 each hold the embedding table"))
      << output;

  std::vector<TrainingPlan> stages;
  PipelineOpTimes times;
  for (int64_t s = 0; s < 2; ++s) {
    PlanRequest request;
    request.config = load_config("qwen3-tiny", overrides);
    request.stage = s;
    stages.push_back(plan_training(request));
    times.forward.push_back(stages.back().kernel(KernelName::forward).seconds);
    times.backward.push_back(stages.back().kernel(KernelName::backward).seconds);
  }
  times.backward_input = times.backward_weight = {0.0, 0.0};
  const PipelineSimulation simulation = simulate_pipeline_schedule(stages[0].pipeline.schedule, times);
  for (size_t s = 0; s < 2; ++s) {
    const TrainingPlan& plan = stages[s];
    const size_t begin = output.find("\nstage " + std::to_string(s) + ": ");
    ASSERT_NE(begin, std::string::npos) << output;
    const std::string block = output.substr(begin, output.find("\nfits: ", begin) - begin);
    EXPECT_TRUE(contains(block, "identity           " + plan.identity.hash)) << block;
    double parameters = 0.0;
    size_t largest_temps = 0;
    for (const PlanBuffer& buffer : plan.buffers) {
      if (buffer.persistent && buffer.part_of < 0 && buffer.kind == BufferKind::parameter)
        parameters += static_cast<double>(buffer.bytes);
    }
    for (const KernelPlan& kernel : plan.kernels)
      largest_temps = std::max(largest_temps, kernel.memory.temps);
    EXPECT_TRUE(contains(block, "parameters         " + bytes_text(parameters))) << block;
    EXPECT_TRUE(contains(block, std::to_string(plan.stash.slots) + " slots in flight x " +
                                    std::to_string(plan.stash.slot_bytes) + " bytes"))
        << block;
    EXPECT_TRUE(contains(block, ": peak " + bytes_text(static_cast<double>(largest_temps)))) << block;
    EXPECT_EQ(plan.arena_bytes, plan.persistent_bytes + largest_temps);
    EXPECT_GT(step_transfer_bytes(plan), 0.0);
    EXPECT_TRUE(
        contains(block, "point-to-point     " + bytes_text(step_transfer_bytes(plan)) + " sent a step ("))
        << block;
    char bubble[64];
    std::snprintf(bubble, sizeof bubble, "bubble             %.2f%% of the schedule's span idle",
                  100.0 * simulation.ranks[s].bubble_fraction);
    EXPECT_TRUE(contains(block, bubble)) << block;
    EXPECT_TRUE(contains(block, "the formula gives 20.00%")) << block;  // (2 - 1) / (4 + 2 - 1)
    EXPECT_TRUE(contains(block, "process arena: persistent")) << block;
    for (const KernelPlan& kernel : plan.kernels) {
      const fs::path path = plan_file_path(stem + "_stage" + std::to_string(s), kernel.kernel);
      std::ifstream file(path);
      ASSERT_TRUE(file) << path;
      const std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
      EXPECT_EQ(text, serialize_kernel_plan(plan, kernel.kernel)) << path;
      EXPECT_TRUE(contains(output, path.string())) << output;
      EXPECT_FALSE(fs::exists(plan_file_path(stem, kernel.kernel))) << "no unstaged file for " << path;
    }
  }
  EXPECT_TRUE(contains(output, "\npipeline step: predicted ")) << output;
  EXPECT_TRUE(contains(output, "the formula (P - 1) / (M + P - 1) = 20.00%")) << output;
  EXPECT_TRUE(contains(output, "\nfits: every stage; the largest arena is stage ")) << output;
  // --explain adds each stage's kernels and its memory breakdown, after the stage's figures.
  std::vector<std::string> explained(arguments.begin(), arguments.end() - 1);  // no plan_out
  explained.push_back("--explain");
  const std::string explain = run(explained);
  for (const std::string stage : {"\nstage 0: ", "\nstage 1: "}) {
    const size_t at = explain.find(stage);
    ASSERT_NE(at, std::string::npos) << explain;
    const size_t kernel = explain.find("\nkernel backward: ", at),
                 breakdown = explain.find("\nmemory by", at);
    EXPECT_NE(kernel, std::string::npos) << explain;
    EXPECT_LT(kernel, breakdown) << explain;
  }

  // deepseek-v3's 61 layers over 16 stages with 64 expert ranks: the default placement, untied, no position
  // table; the stage axis filled in from the topology; its default micro-batch does not fit.
  const std::string deepseek = run({"deepseek-v3", "topology=h100x2048", "mesh.stage=-1", "mesh.expert=64",
                                    "mesh.fsdp=2", "gradient_accumulation_steps=16"});
  EXPECT_TRUE(contains(deepseek, "data=1 stage=16 fsdp=2 context=1 expert=64 tensor=1 (2048 devices)"))
      << deepseek;
  EXPECT_TRUE(contains(deepseek, "16 stage plans of 5 kernels each")) << deepseek;
  EXPECT_TRUE(
      contains(deepseek, "= 16 chunks of 61 layers (the default placement: 13 chunks of 4, then 3 of 3)"))
      << deepseek;
  EXPECT_TRUE(contains(deepseek, "\nstage 0: chunk 0 (layers 0..3, embedding): 4 layers\n")) << deepseek;
  EXPECT_TRUE(contains(deepseek, "\nstage 12: chunk 12 (layers 48..51): 4 layers\n")) << deepseek;
  EXPECT_TRUE(contains(deepseek, "\nstage 13: chunk 13 (layers 52..54): 3 layers\n")) << deepseek;
  EXPECT_TRUE(contains(deepseek,
                       "\nstage 15: chunk 15 (layers 58..60, final norm, unembedding and loss): 3 layers\n"))
      << deepseek;
  EXPECT_FALSE(contains(deepseek, "tied embeddings")) << deepseek;
  EXPECT_TRUE(contains(deepseek, "\ndoes not fit: 16 of 16 stages; the largest arena is stage ")) << deepseek;

  // GPT-2's position table sits with the embedding; an explicit split is named as such.
  const std::string gpt2 =
      run({"gpt2-124m", "topology=cpu", "mesh.stage=3", "pipeline_layers_per_chunk=[3,5,4]",
           "gradient_accumulation_steps=3", "max_target_length=32", "per_device_batch_size=1"});
  EXPECT_TRUE(contains(gpt2, "= 3 chunks of 12 layers (pipeline_layers_per_chunk)")) << gpt2;
  EXPECT_TRUE(contains(gpt2, "chunk 0 (layers 0..2, embedding and position table): 3 layers")) << gpt2;
  EXPECT_TRUE(contains(gpt2, "\nstage 1: chunk 1 (layers 3..7): 5 layers\n")) << gpt2;
}

// A placement that cannot be made is the error (nothing printed), also for one stage; one stage with the
// default keys prints no placement and plans as before.
TEST_F(CompileCli, BadPlacementsNameTheKeysTheValuesAndTheFix) {
  const auto [chunks_output, chunks] =
      output_and_error({"qwen3-tiny", "topology=cpu", "mesh.stage=3", "base_num_decoder_layers=2"});
  EXPECT_TRUE(chunks_output.empty()) << chunks_output;
  EXPECT_TRUE(contains(chunks,
                       "config keys 'mesh.stage' / 'num_pipeline_repeats': expected at most "
                       "base_num_decoder_layers = 2 chunks"))
      << chunks;
  const std::string split = error_of({"qwen3-tiny", "topology=cpu", "pipeline_layers_per_chunk=[1,3]"});
  EXPECT_TRUE(contains(split,
                       "config key 'pipeline_layers_per_chunk': expected mesh.stage x "
                       "num_pipeline_repeats = 1 x 1 = 1 layer counts"))
      << split;
  const std::string repeats = error_of({"qwen3-tiny", "topology=cpu", "num_pipeline_repeats=0"});
  EXPECT_TRUE(contains(repeats, "config key 'num_pipeline_repeats'")) << repeats;
  // The schedule's rules (plan/pipeline_schedule.h) come after the placement's: 1f1b needs M >= P.
  const auto [micro_output, micro_batches] = output_and_error({"qwen3-tiny", "topology=cpu", "mesh.stage=2"});
  EXPECT_TRUE(micro_output.empty()) << micro_output;
  EXPECT_TRUE(contains(micro_batches,
                       "gradient_accumulation_steps: expected at least mesh.stage=2 micro-batches "
                       "with pipeline_schedule=1f1b"))
      << micro_batches;
  const std::string product = error_of({"qwen3-tiny", "topology=h100x8", "mesh.stage=3"});
  EXPECT_TRUE(contains(product, "found data=1 stage=3 fsdp=1 context=1 expert=1 tensor=1 (product 3)"))
      << product;
  const std::string one_stage =
      run({"qwen3-tiny", "topology=cpu", "mesh.stage=1", "pipeline_schedule=gpipe"});
  EXPECT_FALSE(contains(one_stage, "pipeline")) << one_stage;
  EXPECT_TRUE(contains(one_stage, "data=1 fsdp=1 context=1 expert=1 tensor=1 (1 devices)")) << one_stage;
}

// Engram under context parallelism: the ShortConv's halo passes are planned at 2 x halo x G D float32
// values per rank and row (dual_chunk_swap: one pass each way; a plain split: one), forward and backward,
// whatever the sequence length; and the tables' rows split over tensor, so tables larger than one device
// plan to fit on eight.
TEST_F(CompileCli, EngramHalosArePlannedIndependentOfTheSequenceLength) {
  const auto halo_bytes = [](const std::string& length, const std::string& balance) {
    const TrainingPlan plan =
        fresh_plan("deepseek-custom-tiny",
                   {"max_target_length=" + length, "mesh.context=2", "per_device_batch_size=2",
                    "context_parallel_load_balance=" + balance, "dataset_type=synthetic", "tokenizer_path="},
                   {KernelName::fwd_bwd});
    double bytes = 0.0;
    for (const PlanOp& op : plan.kernel(KernelName::fwd_bwd).ops) {
      if (op.op->name.find("/short_conv/pass_halo") != std::string::npos) bytes += op.collective_bytes;
    }
    return bytes;
  };
  // deepseek-custom-tiny: Engram on 2 layers, K 4, N 3 (halo 9), G 4 x D 384. Each rank holds 2 x 2 rows
  // (per_device_batch_size x devices: the batch is not split over context). One pass sends a run's tails.
  const double layers = 2, G_D = 4 * 384, halo = 9, rows_per_rank = 2 * 2;
  const double per_pass = rows_per_rank * halo * G_D * 4;  // float32
  // dual_chunk_swap: two passes in the forward and two in the backward; a plain split: one and one.
  EXPECT_EQ(halo_bytes("128", "true"), layers * 2 * 2 * per_pass);
  EXPECT_EQ(halo_bytes("512", "true"), halo_bytes("128", "true"));
  EXPECT_EQ(halo_bytes("128", "false"), layers * 2 * per_pass);

  const std::string text = run({"deepseek-custom", "mesh.tensor=8", "topology=h100x8"});
  EXPECT_NE(text.find("engram             2 layers, 32 hash tables of 7246888 rows together x 512"),
            std::string::npos)
      << text;
  const TrainingPlan whole = fresh_plan("deepseek-custom", {}, {KernelName::update});
  const TrainingPlan split =
      fresh_plan("deepseek-custom", {"mesh.tensor=8", "topology=h100x8"}, {KernelName::update});
  const auto table_bytes = [](const TrainingPlan& plan) {
    double bytes = 0.0;
    for (const PlanBuffer& buffer : plan.buffers)
      if (buffer.persistent && buffer.name.ends_with("/engram/multi_head_embedding/embedding"))
        bytes += static_cast<double>(buffer.bytes);
    return bytes;
  };
  EXPECT_GT(table_bytes(whole), whole.device_memory_bytes);  // 55 GiB of tables on a 23.5 GiB device
  EXPECT_EQ(table_bytes(split), table_bytes(whole) / 8);
}

}  // namespace
}  // namespace meshtrain
