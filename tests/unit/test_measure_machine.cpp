// cli/measure_machine: the entry it writes is a valid catalog that plans with this machine's measured
// figures (GEMM peaks, attention and loss-softmax rates, memory bandwidth); a renamed entry leaves the
// built-in `cpu` as stated; bad flags name the flag. train/machine: a run's start rechecks a cached peak
// with fewer calls.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "error_text.h"
#include "meshtrain/cli/measure_machine.h"
#include "meshtrain/config/config.h"
#include "meshtrain/core/cpu_features.h"
#include "meshtrain/plan/plan.h"
#include "meshtrain/plan/topology.h"
#include "meshtrain/train/machine.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;

bool contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

std::string error_of(const std::vector<std::string>& arguments) {
  return testing::error_of([&] {
    std::ostringstream out;
    run_measure_machine(arguments, out);
  });
}

class MeasureMachine : public ::testing::Test {
 protected:
  void SetUp() override {
    folder_ = fs::temp_directory_path() / ("meshtrain_measure_" + std::to_string(::getpid()));
    fs::remove_all(folder_);
    fs::create_directories(folder_);
  }
  void TearDown() override { fs::remove_all(folder_); }
  fs::path folder_;
};

TEST_F(MeasureMachine, WritesACatalogThatPlansThisMachine) {
  std::ostringstream out;
  ASSERT_EQ(run_measure_machine({}, out), 0);
  const std::string text = out.str();
  const fs::path file = folder_ / "this_machine.yaml";
  std::ofstream(file) << text;
  // The comment's GFLOP/s and GB/s are the entry's figures (rounded to 0.1 when printed).
  const auto number_after = [&](const std::string& label) {
    const size_t at = text.find(label);
    EXPECT_NE(at, std::string::npos) << label << " in " << text;
    return at == std::string::npos ? 0.0 : std::stod(text.substr(at + label.size()));
  };
  const double peak_gflops = number_after("GEMM peak ");
  const double bandwidth_gbs = number_after("); memory ");

  const Topology stated = load_topology("cpu");
  const Topology measured = load_topology("cpu", file.string());
  EXPECT_GT(measured.float32.peak_flops, 1e9);
  EXPECT_NEAR(measured.float32.peak_flops / 1e9, peak_gflops, 0.1);
  EXPECT_GT(measured.memory_bandwidth, 1e8);
  EXPECT_NEAR(measured.memory_bandwidth / 1e9, bandwidth_gbs, 0.06);
  // The bf16 peak is measured where the CPU has bf16 instructions; everything not measured is the built-in
  // entry's.
  if (cpu_features().avx512_bf16 || cpu_features().amx_bf16) {
    EXPECT_NEAR(measured.bfloat16.peak_flops / 1e9,
                number_after("bfloat16 GEMM peak (bf16 inputs, float32 accumulation) "), 0.1);
  } else {
    EXPECT_EQ(measured.bfloat16.peak_flops, stated.bfloat16.peak_flops);
  }
  // Each op kind's rate, per dtype, as the entry states it, positive, in its unit.
  const auto rates_of = [&](const std::string& field) {
    const double float32 = number_after(field + ": {float32: ");
    const size_t at = text.find(", bfloat16: ", text.find(field));
    EXPECT_NE(at, std::string::npos) << field << " in " << text;
    return std::pair<double, double>{float32,
                                     at == std::string::npos ? 0.0 : std::stod(text.substr(at + 12))};
  };
  struct Rate {
    std::string field;
    double unit;
    double ComputeRates::*of;
  };
  for (const Rate& rate : std::vector<Rate>{{"matmul_tflops", 1e12, &ComputeRates::matmul_flops},
                                            {"attention_tflops", 1e12, &ComputeRates::attention_flops},
                                            {"loss_softmax_glogits", 1e9, &ComputeRates::loss_softmax_logits},
                                            {"elementwise_gbs", 1e9, &ComputeRates::elementwise_bandwidth}}) {
    SCOPED_TRACE(rate.field);
    const auto [float32, bf16] = rates_of(rate.field);
    EXPECT_GT(float32, 0.0);
    EXPECT_GT(bf16, 0.0);
    EXPECT_DOUBLE_EQ(measured.float32.*rate.of, float32 * rate.unit);
    EXPECT_DOUBLE_EQ(measured.bfloat16.*rate.of, bf16 * rate.unit);
  }
  // Matmuls and attention run at most near the bf16 GEMM peak (units a thousand times off would not; the
  // peak and each rate are each the best measured on this machine).
  EXPECT_LE(measured.rates(DType::bf16).matmul_flops, 1.5 * measured.rates(DType::bf16).peak_flops);
  EXPECT_LE(measured.rates(DType::f32).attention_flops, measured.rates(DType::bf16).peak_flops);
  EXPECT_LE(measured.rates(DType::bf16).attention_flops, measured.rates(DType::bf16).peak_flops);
  EXPECT_EQ(measured.memory_bytes, stated.memory_bytes);
  EXPECT_EQ(measured.host_cores, stated.host_cores);
  EXPECT_EQ(measured.host_memory_shared, stated.host_memory_shared);
  EXPECT_EQ(measured.intra_host_bandwidth, stated.intra_host_bandwidth);

  // A plan given the file uses the measured figures.
  PlanRequest request;
  request.config = load_config("qwen3-tiny", {"topologies_path=" + file.string()});
  request.kernels = {KernelName::fwd_bwd};
  const TrainingPlan plan = plan_training(request);
  EXPECT_EQ(plan.topology.float32.peak_flops, measured.float32.peak_flops);
  EXPECT_EQ(plan.topology.memory_bandwidth, measured.memory_bandwidth);
  EXPECT_EQ(plan.topology.float32.matmul_flops, measured.float32.matmul_flops);
  EXPECT_EQ(plan.topology.float32.attention_flops, measured.float32.attention_flops);
  EXPECT_EQ(plan.topology.float32.loss_softmax_logits, measured.float32.loss_softmax_logits);
  EXPECT_EQ(plan.topology.float32.elementwise_bandwidth, measured.float32.elementwise_bandwidth);
}

TEST_F(MeasureMachine, ARenamedEntryLeavesTheBuiltInCpuAsStated) {
  const fs::path file = folder_ / "epyc.yaml";
  std::ostringstream out;
  ASSERT_EQ(run_measure_machine({"--out", file.string(), "--name=my-epyc"}, out), 0);
  EXPECT_TRUE(contains(out.str(), "wrote topology 'my-epyc' to " + file.string())) << out.str();
  EXPECT_TRUE(contains(out.str(), "topologies_path=" + file.string() + " topology=my-epyc")) << out.str();
  const Topology renamed = load_topology("my-epyc", file.string());
  EXPECT_EQ(renamed.device_kind, "cpu");
  EXPECT_GT(renamed.float32.peak_flops, 1e9);
  EXPECT_EQ(load_topology("cpu", file.string()).float32.peak_flops, load_topology("cpu").float32.peak_flops);
}

// A run's start times 40 GEMM calls where this machine has no peak cached, and rechecks a cached one with 5
// (which can only raise it); measure-machine always times 40.
TEST_F(MeasureMachine, ARunRechecksACachedPeakWithFiveCalls) {
  const char* given = std::getenv("XDG_CACHE_HOME");
  const std::string saved = given != nullptr ? given : "";
  ::setenv("XDG_CACHE_HOME", (folder_ / "cache").c_str(), 1);
  const MachineReport first = measure_machine(false, PeakTiming::brief_when_cached);
  const MachineReport again = measure_machine(false, PeakTiming::brief_when_cached);
  const MachineReport full = measure_machine(false, PeakTiming::full);
  if (given != nullptr) {
    ::setenv("XDG_CACHE_HOME", saved.c_str(), 1);
  } else {
    ::unsetenv("XDG_CACHE_HOME");
  }
  EXPECT_EQ(first.peak_calls, 40);
  EXPECT_EQ(first.peak_source, "measured now");
  EXPECT_EQ(again.peak_calls, 5);
  EXPECT_GE(again.gemm_peak_flops, first.gemm_peak_flops);  // the cached figure or a better one
  EXPECT_EQ(full.peak_calls, 40);
  EXPECT_GE(full.gemm_peak_flops, again.gemm_peak_flops);
  EXPECT_TRUE(fs::exists(folder_ / "cache" / "meshtrain")) << "the peak was not cached";
}

TEST_F(MeasureMachine, BadFlagsNameTheFlag) {
  const std::string unknown = error_of({"--output", "x.yaml"});
  EXPECT_TRUE(contains(unknown, "measure-machine argument '--output'")) << unknown;
  EXPECT_TRUE(contains(unknown, "flags: --out, --name")) << unknown;
  EXPECT_TRUE(contains(unknown, "did you mean '--out'?")) << unknown;
  const std::string no_value = error_of({"--out"});
  EXPECT_TRUE(contains(no_value, "measure-machine --out: expected FILE after it")) << no_value;
  const std::string twice = error_of({"--name", "a", "--name=b"});
  EXPECT_TRUE(contains(twice, "given twice")) << twice;
  for (const char* name : {"h100xN", "", "my epyc"}) {
    const std::string bad = error_of({"--name", name});
    EXPECT_TRUE(contains(bad, "measure-machine --name")) << bad;
    EXPECT_TRUE(contains(bad, "'" + std::string(name) + "'")) << bad;
  }
  const std::string folder = error_of({"--out", (folder_ / "missing" / "x.yaml").string()});
  EXPECT_TRUE(contains(folder, "measure-machine --out: expected a file path in an existing folder"))
      << folder;
  EXPECT_FALSE(fs::exists(folder_ / "missing"));
}

}  // namespace
}  // namespace meshtrain
