// The planner's passes, in the order plan_training() runs them, and the pieces they share. Each pass is a
// function with a narrow input and output; plan.h holds the plan they build.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "meshtrain/plan/plan.h"

namespace meshtrain {

// An op in kernel order with the plan buffer behind every spec buffer id it touches (before liveness).
struct PlanStep {
  const OpDecl* op = nullptr;
  bool recompute = false;
  std::vector<std::pair<BufferId, PlanBufferId>> buffers;  // reads then writes, each id once
};

// Whether an op's reads or writes list `id`.
inline bool contains(const std::vector<BufferId>& ids, BufferId id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

// The step of `op` with every buffer bound to the spec's own (same id).
PlanStep step_of(const OpDecl* op, bool recompute = false);
// `step` with `spec_id` bound to `plan_id` (a shard, or a parameter's storage).
PlanStep bind_step(PlanStep step, BufferId spec_id, PlanBufferId plan_id);

// Adds one of the plan's own buffers (sizes its bytes, names its layer).
PlanBufferId add_plan_buffer(TrainingPlan& plan, PlanBuffer buffer);
// Adds one of the plan's own ops; the pointer stays valid for the plan's life.
const OpDecl* add_plan_op(TrainingPlan& plan, OpDecl op);
// A collective op of the plan over `axis`. `outer` > 1: the shards are strided in the full buffer;
// `accumulate`: a reduce-scatter adds into its (persistent) shard. Either needs a staging buffer, planned
// like any temporary. `group`: ranks in the group (0: the whole axis).
const OpDecl* add_collective_op(TrainingPlan& plan, const std::string& name, OpRole role, int32_t parameter,
                                CollectiveKind kind, MeshAxis axis, BufferId buffer, BufferId shard,
                                int64_t outer = 1, bool accumulate = false, int64_t group = 0);
// Elements before the dim of `store` that `axis` splits (beyond the compute layout): 1 when shards are
// contiguous blocks of the full buffer of shape `full`.
int64_t shard_outer(const PlanBuffer& store, MeshAxis axis, const Shape& full);

// storage.cpp: every spec buffer at its per-device size, parameter storage (FSDP shards, ZeRO-1 data
// shards) and the persistent region's offsets: fills plan.buffers, plan.storage, plan.persistent_bytes.
void plan_storage(TrainingPlan& plan);
// storage.cpp: the buffer a stacked parameter's layer view (or a view of its shard) lives in; `id` itself
// otherwise (ZeRO-1's data-rank slots included).
PlanBufferId view_owner(const TrainingPlan& plan, PlanBufferId id);

// remat.cpp: the backward op order of the spec under its remat policy, each block's recomputed forward ops
// first: of ModelSpec::loss_backward's ops [begin, end) (a chunk's), every op by default.
std::vector<PlanStep> backward_with_recompute(const ModelSpec& spec, size_t begin = 0, size_t end = SIZE_MAX);

// fsdp.cpp: `phases` (forward, then backward or the eval loss) with FSDP's gathers of each sharded
// parameter before its first use in each phase, and (with_gradients) the zeroing of its full gradient
// before the first write and its reduce-scatter into the shard after the last; the steps of each phase.
std::vector<std::vector<PlanStep>> insert_fsdp(TrainingPlan& plan,
                                               const std::vector<std::vector<const OpDecl*>>& phases,
                                               const std::vector<std::vector<bool>>& recompute,
                                               bool with_gradients);

// reductions.cpp: fwd_bwd's first op (and zero_gradients' only one), zeroing every gradient accumulator.
const OpDecl* add_zero_gradients_op(TrainingPlan& plan);
// reductions.cpp: the update kernel's steps: the gradient reductions, the global norm, the clip, AdamW on
// the local shard, ZeRO-1's parameter all-gather.
std::vector<PlanStep> update_steps(TrainingPlan& plan);
// reductions.cpp: OpContext::share of a step (a gradient norm over replicated gradients counts once).
double step_share(const TrainingPlan& plan, const PlanStep& step);

// liveness.cpp: the live ranges of the temporaries of one kernel's steps (a write that does not read
// starts a new value), and for each step and binding the value it touches (kPersistent: none).
struct Liveness {
  static constexpr size_t kPersistent = SIZE_MAX;
  std::vector<PlanValue> values;                   // offsets not yet placed
  std::vector<std::vector<size_t>> value_of_step;  // [step][binding] -> index in values
};
Liveness plan_liveness(const TrainingPlan& plan, const std::vector<PlanStep>& steps, KernelName kernel);

// backward_split.cpp: zero_bubble's partition of the backward steps [cut, end) of `steps` (fwd_bwd_accum's,
// with their liveness): a weight-gradient op (OpDecl::weight_gradients_only) runs in backward_weight, after
// every input op, and so does every later op that reads what one of them wrote (FSDP's reduce-scatter of a
// gathered weight gradient); a weight op that would then pass an input op touching the same persistent
// memory (a gradient summed in another order) stays an input op. Relative orders within each part are the
// fused order's, so the math does not change.
struct BackwardSplit {
  std::vector<bool> weight;  // per step: runs in backward_weight
  // (step, binding) of weight steps reading a value a later input op adds into: they read a copy of it,
  // taken in backward_input where the weight step stood in the fused order.
  std::vector<std::pair<size_t, size_t>> captures;
};
BackwardSplit split_backward(const TrainingPlan& plan, const std::vector<PlanStep>& steps, size_t cut,
                             const Liveness& liveness);

// cost.cpp: each op's FLOPs (a shard's share), bytes accessed, collective payload and predicted time, and
// the kernel's totals.
void cost_kernel(const TrainingPlan& plan, KernelPlan& kernel);
// cost.cpp: payload bytes per rank of a collective on a `full_bytes` buffer over `ranks` (aot-plan.md).
double collective_payload_bytes(CollectiveKind kind, double full_bytes, double ranks);
// cost.cpp: the kernel's memory figures (aot-plan.md) with `temps` bytes of temporaries.
MemoryFigures memory_figures(const TrainingPlan& plan, const KernelPlan& kernel, size_t temps);

// overlap.cpp: which update reductions may start after each op of fwd_bwd / fwd_bwd_accum, and the bucket
// capacity.
OverlapSchedule plan_overlap(const TrainingPlan& plan);

// identity.cpp: what the plan depends on: the config keys marked as plan keys, topology, mesh and threads.
PlanIdentity plan_identity(const Config& config, const Mesh& mesh, const Topology& topology, int64_t threads);
// identity.cpp: the hash of "key=value" lines (PlanIdentity::hash; a stage plan adds its stage and rehashes).
std::string plan_identity_hash(const std::vector<std::pair<std::string, std::string>>& keys);

}  // namespace meshtrain
