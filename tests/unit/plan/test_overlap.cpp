// The overlap schedule of the plan: which update reductions may start after each op of the last
// micro-batch's backward, and the bucket capacity.
#include <gtest/gtest.h>

#include "tiny_plan.h"

namespace meshtrain {
namespace {

// Index in `kernel` of the op after which update op `u` is ready; ops.size() when never.
size_t ready_at(const TrainingPlan& plan, KernelName kernel, size_t u) {
  const std::vector<std::vector<size_t>>& ready = plan.overlap.ready_after.at(kernel);
  for (size_t i = 0; i < ready.size(); ++i) {
    if (std::find(ready[i].begin(), ready[i].end(), u) != ready[i].end()) return i;
  }
  return ready.size();
}

TEST(Overlap, NoDataAxisNoSchedule) {
  const TrainingPlan plan = testing::tiny_plan({"mesh.fsdp=2"});
  EXPECT_TRUE(plan.overlap.ready_after.empty());
  EXPECT_EQ(plan.overlap.bucket_capacity, 0u);
}

TEST(Overlap, EachReductionStartsAfterItsGradientsLastWriter) {
  for (const std::vector<std::string>& mesh :
       {std::vector<std::string>{"mesh.data=2"}, {"mesh.data=2", "shard_optimizer_over_data=true"}}) {
    const TrainingPlan plan = testing::tiny_plan(mesh);
    const KernelPlan& update = plan.kernel(KernelName::update);
    for (KernelName name : {KernelName::fwd_bwd, KernelName::fwd_bwd_accum}) {
      const KernelPlan& kernel = plan.kernel(name);
      ASSERT_EQ(plan.overlap.ready_after.at(name).size(), kernel.ops.size());
      size_t scheduled = 0;
      for (size_t u = 0; u < update.ops.size(); ++u) {
        const OpDecl& op = *update.ops[u].op;
        const size_t at = ready_at(plan, name, u);
        if (at == kernel.ops.size()) continue;
        ++scheduled;
        EXPECT_TRUE(op.role == OpRole::data_gradient_reduction || op.role == OpRole::zero1_reduce_scatter)
            << op.name;
        // The op it waits for touches the gradient; no later op does.
        const auto touches = [&](size_t i) {
          for (const auto& binding : kernel.ops[i].buffers) {
            if (binding.second == op.collective.buffer) return true;
          }
          return false;
        };
        EXPECT_TRUE(touches(at)) << op.name;
        for (size_t i = at + 1; i < kernel.ops.size(); ++i) EXPECT_FALSE(touches(i)) << op.name;
      }
      EXPECT_GT(scheduled, 0u);
    }
  }
}

TEST(Overlap, LastLayersGradientsAreReadyFirst) {
  const TrainingPlan plan = testing::tiny_plan({"mesh.data=2"});
  const KernelPlan& update = plan.kernel(KernelName::update);
  size_t first_of_last_layer = SIZE_MAX, first_of_first_layer = SIZE_MAX, last_of_last_layer = 0;
  for (size_t u = 0; u < update.ops.size(); ++u) {
    const OpDecl& op = *update.ops[u].op;
    if (op.role != OpRole::data_gradient_reduction) continue;
    const std::string& name = plan.spec.parameters[static_cast<size_t>(op.parameter)].canonical_name;
    const size_t at = ready_at(plan, KernelName::fwd_bwd, u);
    if (name.find("layers_1/") != std::string::npos) {
      first_of_last_layer = std::min(first_of_last_layer, at);
      last_of_last_layer = std::max(last_of_last_layer, at);
    }
    if (name.find("layers_0/") != std::string::npos)
      first_of_first_layer = std::min(first_of_first_layer, at);
  }
  ASSERT_NE(first_of_last_layer, SIZE_MAX);
  ASSERT_NE(first_of_first_layer, SIZE_MAX);
  EXPECT_LT(first_of_last_layer, first_of_first_layer);
  EXPECT_LT(last_of_last_layer, first_of_first_layer);
}

TEST(Overlap, BucketIsAnEighthOfTheGradientsUpTo4MiB) {
  const TrainingPlan plan = testing::tiny_plan({"mesh.data=2"});
  size_t gradients = 0;
  for (const PlanBuffer& buffer : plan.buffers) {
    if (buffer.persistent && buffer.kind == BufferKind::gradient) gradients += buffer.bytes;
  }
  EXPECT_EQ(plan.overlap.bucket_capacity, gradients / 8);
  const TrainingPlan large = testing::tiny_plan({"mesh.data=2", "base_emb_dim=1024", "base_mlp_dim=4096"});
  EXPECT_EQ(large.overlap.bucket_capacity, size_t{4} << 20);
}

}  // namespace
}  // namespace meshtrain
