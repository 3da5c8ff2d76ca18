// Attention FLOPs per context rank (see context_attention.h).
#include "meshtrain/plan/context_attention.h"

#include <algorithm>
#include <numeric>

#include "meshtrain/data/context_reorder.h"

namespace meshtrain {

double ContextAttentionLoad::total() const {
  return std::accumulate(flops.begin(), flops.end(), 0.0);
}

double ContextAttentionLoad::max_over_mean() const {
  if (flops.empty()) return 0.0;
  const double mean = total() / static_cast<double>(flops.size());
  return mean > 0.0 ? *std::max_element(flops.begin(), flops.end()) / mean : 0.0;
}

ContextAttentionLoad context_attention_load(const TrainingPlan& plan, const KernelPlan& kernel) {
  ContextAttentionLoad load;
  const int64_t C = plan.mesh.size(MeshAxis::context);
  if (C <= 1 || kernel.kernel == KernelName::decode) return load;
  double per_device = 0.0;  // the kernel's attention FLOPs on one rank, as planned (the average)
  for (const PlanOp& op : kernel.ops) {
    if (op.op->kind == OpKind::attention) per_device += op.flops;
  }
  if (per_device == 0.0) return load;
  const Config& config = plan.spec.config;
  // plan_training built this layout already (it refuses a length the reorder cannot cut).
  const ContextLayout layout(effective_context_reorder(config), config.max_target_length, C);
  const std::vector<int64_t> pairs = attention_pairs_per_context_rank(layout);  // [C]
  const double all_pairs = static_cast<double>(std::accumulate(pairs.begin(), pairs.end(), int64_t{0}));
  const double whole = per_device * static_cast<double>(C);
  load.reorder = layout.reorder();
  load.context_ranks = C;
  for (int64_t rank_pairs : pairs) load.flops.push_back(whole * static_cast<double>(rank_pairs) / all_pairs);
  return load;
}

ContextAttentionLoad step_context_attention_load(const TrainingPlan& plan) {
  for (KernelName name : {KernelName::fwd_bwd, KernelName::fwd_bwd_accum}) {
    const auto found = std::find_if(plan.kernels.begin(), plan.kernels.end(),
                                    [&](const KernelPlan& kernel) { return kernel.kernel == name; });
    if (found == plan.kernels.end()) continue;
    ContextAttentionLoad load = context_attention_load(plan, *found);
    const double micro_batches = static_cast<double>(plan.spec.config.gradient_accumulation_steps);
    for (double& flops : load.flops) flops *= micro_batches;
    return load;
  }
  return {};
}

}  // namespace meshtrain
