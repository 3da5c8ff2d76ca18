// Overlap schedule: the data-axis gradient reductions of update that may start during the last
// micro-batch's backward, each after the last op that touches its gradient, and the bucket size.
#include <set>

#include "meshtrain/plan/passes.h"

namespace meshtrain {
namespace {

// Bucket size for starting data-axis reductions during the last backward: 4 MiB (PyTorch DDP uses 25 MB),
// or an eighth of all reduced gradient bytes for small models, so the first bucket leaves early.
constexpr size_t kReductionBucketBytes = size_t{4} << 20;

}  // namespace

OverlapSchedule plan_overlap(const TrainingPlan& plan) {
  OverlapSchedule schedule;
  if (plan.mesh.size(MeshAxis::data) == 1 || !plan.find(KernelName::update)) return schedule;
  const KernelPlan& update = plan.kernel(KernelName::update);
  size_t reduced_bytes = 0;
  for (KernelName name : {KernelName::fwd_bwd, KernelName::fwd_bwd_accum}) {
    const KernelPlan* kernel = plan.find(name);
    if (!kernel) continue;
    std::vector<std::vector<size_t>>& ready = schedule.ready_after[name];
    ready.assign(kernel->ops.size(), {});
    std::set<PlanBufferId> reduced_earlier;  // e.g. QK-norm gradients all-reduced over tensor first
    for (size_t u = 0; u < update.ops.size(); ++u) {
      const OpDecl& op = *update.ops[u].op;
      if (op.kind == OpKind::collective && op.collective.axis != MeshAxis::data) {
        reduced_earlier.insert(op.collective.buffer);
      }
      if (reduced_earlier.count(op.collective.buffer)) continue;
      const bool gradient_reduction =
          op.role == OpRole::data_gradient_reduction || op.role == OpRole::zero1_reduce_scatter;
      // A strided shard's reduce-scatter packs through staging, which is update's temporary.
      if (!gradient_reduction || op.collective.staging != kNoBuffer) continue;
      // The gradient is final after the last op of the kernel that touches its store.
      const PlanBufferId store = op.collective.buffer;
      size_t last = kernel->ops.size();
      for (size_t i = 0; i < kernel->ops.size(); ++i) {
        for (const auto& binding : kernel->ops[i].buffers) {
          // A stacked gradient is written through its layers' views.
          if (view_owner(plan, binding.second) == store) last = i;
        }
      }
      if (last < kernel->ops.size()) ready[last].push_back(u);
      if (name == KernelName::fwd_bwd) reduced_bytes += plan.buffers[static_cast<size_t>(store)].bytes;
    }
  }
  schedule.bucket_capacity = std::max<size_t>(1, std::min(kReductionBucketBytes, reduced_bytes / 8));
  return schedule;
}

}  // namespace meshtrain
