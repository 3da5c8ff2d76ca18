// The attention work of each context rank (shared/specs/context-parallel.md): the plan's attention FLOPs,
// which every rank is planned with as the average over the context ranks, laid over the ranks by each
// one's share of the causal (query, key) pairs under the reorder the run applies. `meshtrain compile`
// prints them and plan files record them, so a plain split's imbalance and a balanced reorder's evenness
// are figures of the plan.
#pragma once

#include <cstdint>
#include <vector>

#include "meshtrain/mesh/context_reorder.h"
#include "meshtrain/plan/plan.h"

namespace meshtrain {

// One kernel's attention FLOPs per context rank.
//   whole = C x (the FLOPs of the kernel's attention ops, per device): the whole sequence's attention FLOPs
//           as planned. Every rank's ops are planned alike, at the average over the ranks (the forward
//           4 B L S H d / 2 for L queries against S keys, the causal half; the backward 2.5 x that), remat
//           recomputes included.
//   flops[r] = whole x pairs[r] / (pairs summed over ranks), pairs = attention_pairs_per_context_rank.
// So the ranks sum to `whole`, and max / mean is the reorder's imbalance. Empty when mesh.context is 1, for
// the decode kernel, and for a kernel without attention ops.
struct ContextAttentionLoad {
  ContextReorder reorder = ContextReorder::none;  // the effective reorder (none: load balancing off)
  int64_t context_ranks = 1;                      // C
  std::vector<double> flops;                      // [C]

  bool empty() const { return flops.empty(); }
  double total() const;          // sum over ranks: the whole sequence's attention FLOPs
  double max_over_mean() const;  // 1 when balanced; 0 when empty
};

ContextAttentionLoad context_attention_load(const TrainingPlan& plan, const KernelPlan& kernel);

// The training step's attention per context rank: gradient_accumulation_steps micro-batches, each the
// forward + backward of fwd_bwd (fwd_bwd_accum runs the same attention ops; when only it is planned, its
// figures). Empty when neither kernel is planned or mesh.context is 1.
ContextAttentionLoad step_context_attention_load(const TrainingPlan& plan);

}  // namespace meshtrain
