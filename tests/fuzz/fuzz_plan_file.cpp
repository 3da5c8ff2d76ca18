// Plan files (plan/plan.h, `meshtrain compile ... plan_out=STEM`, read back by plan_in) on arbitrary bytes:
// the input is compared with the update plan of a one-layer Qwen3 four wide, made once, as a run with plan_in
// does.
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_files.h"
#include "meshtrain/config/config.h"
#include "meshtrain/core/error.h"
#include "meshtrain/plan/plan.h"

namespace {

// The config of the seed corpus's plan files (tests/fuzz/README.md, "Seeds").
const meshtrain::TrainingPlan& tiny_plan() {
  static const meshtrain::TrainingPlan plan = [] {
    meshtrain::PlanRequest request;
    request.config = meshtrain::load_config(
        "qwen3-tiny",
        {"base_emb_dim=4", "base_num_query_heads=2", "base_num_kv_heads=1", "head_dim=2", "base_mlp_dim=4",
         "base_num_decoder_layers=1", "vocab_size=8", "max_target_length=4", "per_device_batch_size=1"});
    request.kernels = {meshtrain::KernelName::update};
    return meshtrain::plan_training(request);
  }();
  return plan;
}

}  // namespace

// Loads the plan before fuzzing starts, so its time is not counted against the first input's timeout.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tiny_plan();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace meshtrain;
  const std::string stem = (fuzz::scratch_directory() / "tiny").string();
  fuzz::write_scratch_file("tiny_update.json", {reinterpret_cast<const char*>(data), size});
  try {
    verify_plan_file(tiny_plan(), KernelName::update, stem);
  } catch (const MeshError&) {
    // Any file but the very plan is rejected.
  }
  return 0;
}
