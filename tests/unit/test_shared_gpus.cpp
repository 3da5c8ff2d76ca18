// Several processes on NVIDIA GPUs (share_gpus, runtime/device_communicator.h): which runs are refused before
// anything is allocated, naming the key, the numbers and the fix; and which communicator a run gets. The GPU
// is a stand-in here: the cpu table with a device that says it runs and how many GPUs it sees.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "error_text.h"
#include "meshtrain/config/config.h"
#include "meshtrain/kernels/cpu/backend.h"
#include "meshtrain/plan/plan.h"
#include "meshtrain/runtime/device_communicator.h"
#include "meshtrain/runtime/engine.h"

namespace meshtrain {
namespace {

using testing::error_of;

// A stand-in GPU: runs (device_check ""), one GPU visible, memory the host may not touch.
const kernels::KernelBackend& one_gpu_backend() {
  static const kernels::KernelBackend table = [] {
    kernels::KernelBackend gpu = kernels::cpu_backend();
    gpu.device_check = [] { return std::string(); };
    gpu.device_count = [] { return 1; };
    gpu.memory_on_host = [] { return false; };
    return gpu;
  }();
  return table;
}

TrainingPlan plan_for(const std::vector<std::string>& overrides, int64_t devices) {
  std::vector<std::string> keys = {
      "base_emb_dim=32",         "base_num_query_heads=4",    "base_num_kv_heads=2", "head_dim=8",
      "base_mlp_dim=48",         "base_num_decoder_layers=2", "vocab_size=64",       "max_target_length=16",
      "per_device_batch_size=2", "dataset_type=synthetic",    "tokenizer_path="};
  keys.insert(keys.end(), overrides.begin(), overrides.end());
  PlanRequest request;
  request.config = load_config("qwen3-tiny", keys);
  request.devices = devices;
  TrainingPlan plan = plan_training(request);
  return plan;
}

TrainingPlan on_one_gpu(TrainingPlan plan) {
  plan.spec.kernels = &one_gpu_backend();
  return plan;
}

TEST(SharedGpus, MoreProcessesThanGpusOnAHostAreRefusedUnlessShared) {
  const TrainingPlan plan = on_one_gpu(plan_for({"topology=h200x2", "mesh.data=2"}, 2));
  const std::string error = error_of([&] { check_plan_runs_here(plan, 2, 2); });
  EXPECT_NE(error.find("config key 'share_gpus'"), std::string::npos) << error;
  EXPECT_NE(error.find("this host's GPUs: 1"), std::string::npos) << error;
  EXPECT_NE(error.find("2 processes on this host"), std::string::npos) << error;
  EXPECT_NE(error.find("set share_gpus=true"), std::string::npos) << error;

  const TrainingPlan shared = on_one_gpu(plan_for({"topology=h200x2", "mesh.data=2", "share_gpus=true"}, 2));
  EXPECT_EQ(error_of([&] { check_plan_runs_here(shared, 2, 2); }), "");
}

TEST(SharedGpus, OneProcessPerGpuNeedsNcclInTheBuild) {
  // Two hosts of one GPU each, one process on each: NCCL's case.
  const TrainingPlan plan = on_one_gpu(plan_for({"topology=h200x2", "mesh.data=2"}, 2));
  const std::string error = error_of([&] { check_plan_runs_here(plan, 2, 1); });
  if (nccl_communicator_built()) {
    EXPECT_EQ(error, "");
  } else {
    EXPECT_NE(error.find("config key 'share_gpus'"), std::string::npos) << error;
    EXPECT_NE(error.find("built without NCCL"), std::string::npos) << error;
    EXPECT_NE(error.find("set share_gpus=true"), std::string::npos) << error;
  }
}

TEST(SharedGpus, ShareGpusOnACpuTopologyIsRefused) {
  const TrainingPlan plan = plan_for({"share_gpus=true"}, 1);
  const std::string error = error_of([&] { check_plan_runs_here(plan, 1, 1); });
  EXPECT_NE(error.find("config key 'share_gpus'"), std::string::npos) << error;
  EXPECT_NE(error.find("topology 'cpu'"), std::string::npos) << error;
  EXPECT_NE(error.find("set share_gpus=false"), std::string::npos) << error;
}

TEST(SharedGpus, LayoutsTheCudaKernelsDoNotRunAreNamed) {
  const std::string tensor = error_of([&] {
    check_plan_runs_here(on_one_gpu(plan_for({"topology=h200x2", "mesh.tensor=2", "share_gpus=true"}, 2)), 2,
                         2);
  });
  EXPECT_NE(tensor.find("config key 'mesh.tensor'"), std::string::npos) << tensor;
  EXPECT_NE(tensor.find("set mesh.tensor=1"), std::string::npos) << tensor;
  // The cpu table has context attention: the refusal follows the table, so take it away.
  kernels::KernelBackend without_context = one_gpu_backend();
  without_context.context_attention_forward = nullptr;
  TrainingPlan context = plan_for({"topology=h200x2", "mesh.context=2", "share_gpus=true"}, 2);
  context.spec.kernels = &without_context;
  const std::string refused = error_of([&] { check_plan_runs_here(context, 2, 2); });
  EXPECT_NE(refused.find("config key 'mesh.context'"), std::string::npos) << refused;
  context.spec.kernels = &one_gpu_backend();
  EXPECT_EQ(error_of([&] { check_plan_runs_here(context, 2, 2); }), "");
}

TEST(SharedGpus, CpuRunsAndOneProcessKeepTheirCommunicator) {
  const TrainingPlan cpu = plan_for({}, 1);
  auto local = std::make_unique<LocalCommunicator>();
  const Communicator* before = local.get();
  EXPECT_EQ(communicator_for_devices(std::move(local), cpu).get(), before);
  const TrainingPlan gpu = on_one_gpu(plan_for({"topology=h200x1", "share_gpus=true"}, 1));
  local = std::make_unique<LocalCommunicator>();
  before = local.get();
  EXPECT_EQ(communicator_for_devices(std::move(local), gpu).get(), before);  // one process: nothing to stage
}

}  // namespace
}  // namespace meshtrain
