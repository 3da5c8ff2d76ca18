// Reductions and update pass: fwd_bwd's zeroing of the gradient accumulators, and the update kernel: the
// data-parallel reduction of the gradients (all-reduce, or ZeRO-1's reduce-scatter), the global norm
// (partial sums all-reduced over every axis gradients are split on), the clip, AdamW on the local shard,
// and ZeRO-1's parameter all-gather (which belongs to update, aot-plan.md).
#include <algorithm>
#include <cstring>

#include "meshtrain/plan/passes.h"

namespace meshtrain {
namespace {

// The mesh axes over which gradient shards differ, so their squared norms are summed over them.
std::vector<MeshAxis> norm_axes(const TrainingPlan& plan) {
  std::vector<MeshAxis> axes;
  if (plan.spec.config.shard_optimizer_over_data && plan.mesh.size(MeshAxis::data) > 1)
    axes.push_back(MeshAxis::data);
  for (MeshAxis axis : {MeshAxis::fsdp, MeshAxis::expert, MeshAxis::tensor}) {
    if (plan.mesh.size(axis) > 1) axes.push_back(axis);
  }
  if (plan.pipeline.stages > 1) axes.push_back(MeshAxis::stage);  // each stage holds other parameters
  return axes;
}

// A pipeline's tied embedding table, held by its first and last stage, whose gradients they sum.
bool tied_across_stages(const TrainingPlan& plan, int32_t parameter) {
  const PipelineStage& stage = plan.pipeline;
  return stage.stages > 1 && plan.spec.options.tied_embeddings && (stage.first() || stage.last()) &&
         plan.spec.parameters[static_cast<size_t>(parameter)].value == plan.spec.embedding_table;
}

// ZeRO-1 with a strided shard: copies this data rank's blocks of the parameter into the shard buffer.
const OpDecl* add_slice_op(TrainingPlan& plan, const ParameterStorage& store, size_t k) {
  const BufferId full = store.value_store, shard = store.value_data_shard;
  const int64_t outer = store.data_outer, ranks = plan.mesh.size(MeshAxis::data);
  OpDecl op{"zero1/slice/" + plan.spec.parameters[k].canonical_name,
            {full},
            {shard},
            0.0,
            [=](const OpContext& context) {
              const TensorView shard_view = context.view(shard);
              const float* from = context.f32(full);
              float* to = shard_view.f32();
              const int64_t block = shard_view.elements() / outer;
              for (int64_t o = 0; o < outer; ++o) {
                std::memcpy(to + o * block, from + (o * ranks + context.coordinates[MeshAxis::data]) * block,
                            static_cast<size_t>(block) * sizeof(float));
              }
            },
            OpKind::memory};
  op.role = OpRole::zero1_slice;
  op.parameter = static_cast<int32_t>(k);
  return add_plan_op(plan, std::move(op));
}

// One gather of a sharded Muon tensor towards its whole matrices: `shard` (this rank's part) into `full`
// over `axis`, the shards strided by `outer` (add_collective_op).
struct MuonGather {
  MeshAxis axis = MeshAxis::data;
  int64_t outer = 1, ranks = 1, full_elements = 0;
  PlanBufferId shard = -1, full = -1;
};

// Copies this rank's shard of the whole step's result back: `gathers` innermost first, as they were made.
const OpDecl* add_muon_slice_op(TrainingPlan& plan, const std::string& name, int32_t parameter,
                                const std::vector<MuonGather>& gathers) {
  const BufferId whole = gathers.back().full, shard = gathers.front().shard;
  OpDecl op{"muon/slice/" + name,
            {whole},
            {shard},
            0.0,
            [=](const OpContext& context) {
              const float* from = context.f32(whole);
              const TensorView to = context.view(shard);
              float* out = to.f32();
              for (int64_t i = 0; i < to.elements(); ++i) {
                // A shard is [outer][block] of its full [outer][ranks][block]: the index in each full in
                // turn.
                int64_t index = i;
                for (const MuonGather& gather : gathers) {
                  const int64_t block = gather.full_elements / (gather.outer * gather.ranks);
                  index = ((index / block) * gather.ranks + context.coordinates[gather.axis]) * block +
                          index % block;
                }
                out[i] = from[index];
              }
            },
            OpKind::memory};
  op.role = OpRole::muon_slice;
  op.parameter = parameter;
  return add_plan_op(plan, std::move(op));
}

// Muon on a matrix FSDP, ZeRO-1 or tensor parallelism shards: Newton-Schulz needs each matrix whole, so its
// value, reduced gradient and momentum are gathered whole (ZeRO-1's data shards first, then FSDP's, then the
// tensor ranks' parts), every rank of those groups runs the one-process step on the whole (redundantly: the
// same result on each), and keeps its own shards of the value and the momentum.
void add_whole_matrix_muon_steps(TrainingPlan& plan, const OpDecl& op, std::vector<PlanStep>& steps) {
  const size_t k = static_cast<size_t>(op.parameter);
  const ParameterDecl& parameter = plan.spec.parameters[k];
  const ParameterStorage store = plan.storage[k];
  const BufferId momentum = plan.optimizer.parameters[k].moments.at(0);
  const std::string& name = parameter.canonical_name;
  const Shape local = plan.spec.buffer(parameter.value).shape;  // the tensor-local (compute) shape
  const std::vector<DimSharding> compute = plan.buffers[static_cast<size_t>(parameter.value)].sharding;
  const int64_t tensor_ranks = plan.mesh.size(MeshAxis::tensor);
  Shape whole = local;
  for (size_t i = 0; i < compute.size(); ++i) {
    if (std::find(compute[i].axes.begin(), compute[i].axes.end(), MeshAxis::tensor) != compute[i].axes.end())
      whole.dims[i] *= tensor_ranks;
  }
  const PlanBuffer fsdp_shard = plan.buffers[static_cast<size_t>(store.value_store)];
  const bool over_data = store.gradient_data_shard >= 0, over_tensor = whole.elements() != local.elements();
  const auto temporary = [&](const std::string& what, int64_t elements) {
    return add_plan_buffer(plan, PlanBuffer{"muon/" + what + "/" + name,
                                            BufferKind::communication,
                                            fsdp_shard.dtype,
                                            shape_of({{"elements", elements}}),
                                            {DimSharding{}}});
  };
  // `shard` gathered whole (into `data_full` and `fsdp_full` where the plan has those buffers already):
  // the whole's buffer, and the gathers made.
  const auto gather_whole = [&](const std::string& what, PlanBufferId shard, bool data_sharded,
                                PlanBufferId data_full, PlanBufferId fsdp_full) {
    std::vector<MuonGather> gathers;
    PlanBufferId current = shard;
    const auto gather = [&](MeshAxis axis, int64_t outer, PlanBufferId full) {
      steps.push_back(step_of(add_collective_op(
          plan, "muon/gather/" + name + "/" + what + "/" + mesh_axis_name(axis), OpRole::muon_gather,
          op.parameter, CollectiveKind::all_gather, axis, full, current, outer)));
      gathers.push_back({axis, outer, plan.mesh.size(axis),
                         plan.buffers[static_cast<size_t>(full)].shape.elements(), current, full});
      current = full;
    };
    if (data_sharded) {
      gather(MeshAxis::data, store.data_outer,
             data_full >= 0 ? data_full : temporary(what + "_fsdp_shard", fsdp_shard.shape.elements()));
    }
    if (store.gathered) {
      gather(MeshAxis::fsdp, shard_outer(fsdp_shard, MeshAxis::fsdp, local),
             fsdp_full >= 0 ? fsdp_full : temporary(what + "_tensor_part", local.elements()));
    }
    if (over_tensor) {
      gather(MeshAxis::tensor,
             shard_outer(plan.buffers[static_cast<size_t>(parameter.value)], MeshAxis::tensor, whole),
             temporary(what + "_whole", whole.elements()));
    }
    return std::make_pair(current, gathers);
  };
  // ZeRO-1 keeps the value whole over data (its shard is gathered back after AdamW's step).
  const auto [value, value_gathers] = gather_whole("value", store.value_store, false, -1, parameter.value);
  const auto [gradient, gradient_gathers] =
      gather_whole("gradient", over_data ? store.gradient_data_shard : store.gradient_store, over_data,
                   store.gradient_store, parameter.gradient);
  const auto [whole_momentum, momentum_gathers] = gather_whole("momentum", momentum, over_data, -1, -1);
  steps.push_back(
      bind_step(bind_step(bind_step(step_of(&op), parameter.value, value), parameter.gradient, gradient),
                momentum, whole_momentum));
  if (!value_gathers.empty())
    steps.push_back(step_of(add_muon_slice_op(plan, name + "/value", op.parameter, value_gathers)));
  steps.push_back(step_of(add_muon_slice_op(plan, name + "/momentum", op.parameter, momentum_gathers)));
}

}  // namespace

const OpDecl* add_zero_gradients_op(TrainingPlan& plan) {
  std::vector<BufferId> gradient_stores;
  for (const ParameterStorage& store : plan.storage) gradient_stores.push_back(store.gradient_store);
  OpDecl zero{"optimizer/zero_gradients", gradient_stores, gradient_stores, 0.0, nullptr, OpKind::memory};
  zero.run = [gradient_stores](const OpContext& context) {
    for (BufferId id : gradient_stores) {
      const TensorView gradient = context.view(id);
      context.kernels->memory_fill(gradient.data, 0, gradient.bytes());
    }
  };
  zero.role = OpRole::zero_gradients;
  return add_plan_op(plan, std::move(zero));
}

std::vector<PlanStep> update_steps(TrainingPlan& plan) {
  const ModelSpec& spec = plan.spec;
  const Mesh& mesh = plan.mesh;
  std::vector<PlanStep> steps;
  int64_t token_ranks = 1;
  for (MeshAxis axis : kTokenMeshAxes) token_ranks *= mesh.size(axis);
  if (token_ranks > 1) {
    const BufferId count = add_plan_buffer(plan, PlanBuffer{"optimizer/valid_count",
                                                            BufferKind::communication,
                                                            DType::i32,
                                                            shape_of({{"count", 2}}),
                                                            {DimSharding{}}});
    for (MeshAxis axis : kTokenMeshAxes) {
      if (mesh.size(axis) > 1) {
        steps.push_back(step_of(add_collective_op(
            plan, std::string("optimizer/reduce_valid_count/") + mesh_axis_name(axis),
            OpRole::reduce_valid_count, -1, CollectiveKind::all_reduce, axis, count, kNoBuffer)));
      }
    }
  }
  for (const OpDecl& op : plan.optimizer.update) {
    if (op.parameter < 0) {
      if (op.role == OpRole::clip && !norm_axes(plan).empty()) {
        // 8 bytes: the engine sends the squared norm as one double.
        const BufferId partial = add_plan_buffer(plan, PlanBuffer{"optimizer/norm_partial",
                                                                  BufferKind::communication,
                                                                  DType::f32,
                                                                  shape_of({{"sum", 2}}),
                                                                  {DimSharding{}}});
        for (MeshAxis axis : norm_axes(plan)) {
          steps.push_back(step_of(add_collective_op(
              plan, std::string("optimizer/reduce_grad_norm/") + mesh_axis_name(axis),
              OpRole::reduce_grad_norm, -1, CollectiveKind::all_reduce, axis, partial, kNoBuffer)));
        }
      }
      steps.push_back(step_of(&op));
      continue;
    }
    const size_t k = static_cast<size_t>(op.parameter);
    const ParameterDecl& parameter = spec.parameters[k];
    const ParameterStorage& store = plan.storage[k];
    const std::string& name = parameter.canonical_name;
    const bool is_norm = op.role == OpRole::grad_norm;
    // The two ends' partial gradients of a tied table (group 2: the first and last stage ranks).
    if (is_norm && tied_across_stages(plan, op.parameter)) {
      steps.push_back(step_of(add_collective_op(
          plan, "stage/tied_all_reduce/" + name, OpRole::tied_embedding_reduction, op.parameter,
          CollectiveKind::all_reduce, MeshAxis::stage, store.gradient_store, kNoBuffer, 1, false, 2)));
    }
    // Context ranks hold different tokens of the same rows, expert and fsdp ranks different rows: the
    // gradient of a parameter they share is a partial sum over them, summed here like over data (before any
    // ZeRO-1 scatter; under FSDP the fsdp shard). The routed experts split over the expert axis take every
    // expert rank's tokens through the all-to-all, so their gradients are whole there; a parameter FSDP
    // shards is reduce-scattered over fsdp by its pass, but one too small to split (mHC's three scales over
    // two fsdp ranks) stays whole on every fsdp rank and is all-reduced here.
    for (MeshAxis axis : {MeshAxis::context, MeshAxis::expert, MeshAxis::fsdp}) {
      if (!is_norm || mesh.size(axis) == 1 ||
          plan.buffers[static_cast<size_t>(store.gradient_store)].split_over(axis))
        continue;
      steps.push_back(step_of(add_collective_op(
          plan, std::string(mesh_axis_name(axis)) + "/all_reduce/" + name, OpRole::data_gradient_reduction,
          op.parameter, CollectiveKind::all_reduce, axis, store.gradient_store, kNoBuffer)));
    }
    if (is_norm && parameter.gradient_partial_over_tensor && mesh.size(MeshAxis::tensor) > 1) {
      steps.push_back(step_of(add_collective_op(
          plan, "tensor/all_reduce/" + name, OpRole::tensor_gradient_reduction, op.parameter,
          CollectiveKind::all_reduce, MeshAxis::tensor, store.gradient_store, kNoBuffer)));
    }
    // A kv head replicated on several tensor ranks: each holds the part of its gradient that its own query
    // heads produced; the replicas sum them.
    const int64_t replicas = kv_replicas(plan, parameter.value);
    if (is_norm && replicas > 1) {
      steps.push_back(
          step_of(add_collective_op(plan, "tensor/kv_replicas_all_reduce/" + name,
                                    OpRole::kv_replica_reduction, op.parameter, CollectiveKind::all_reduce,
                                    MeshAxis::tensor, store.gradient_store, kNoBuffer, 1, false, replicas)));
    }
    if (op.role == OpRole::muon &&
        (store.gathered || store.gradient_data_shard >= 0 ||
         plan.buffers[static_cast<size_t>(parameter.value)].split_over(MeshAxis::tensor))) {
      add_whole_matrix_muon_steps(plan, op, steps);
      continue;
    }
    if (store.gradient_data_shard >= 0) {
      if (is_norm) {
        steps.push_back(
            step_of(add_collective_op(plan, "zero1/reduce_scatter/" + name, OpRole::zero1_reduce_scatter,
                                      op.parameter, CollectiveKind::reduce_scatter, MeshAxis::data,
                                      store.gradient_store, store.gradient_data_shard, store.data_outer)));
      }
      if (!is_norm && store.data_outer > 1) steps.push_back(step_of(add_slice_op(plan, store, k)));
      steps.push_back(bind_step(bind_step(step_of(&op), parameter.gradient, store.gradient_data_shard),
                                parameter.value, store.value_data_shard));
      if (!is_norm) {
        steps.push_back(step_of(add_collective_op(
            plan, "zero1/gather/" + name, OpRole::zero1_all_gather, op.parameter, CollectiveKind::all_gather,
            MeshAxis::data, store.value_store, store.value_data_shard, store.data_outer)));
      }
      continue;
    }
    if (is_norm && mesh.size(MeshAxis::data) > 1) {
      steps.push_back(step_of(
          add_collective_op(plan, "data/all_reduce/" + name, OpRole::data_gradient_reduction, op.parameter,
                            CollectiveKind::all_reduce, MeshAxis::data, store.gradient_store, kNoBuffer)));
    }
    steps.push_back(bind_step(bind_step(step_of(&op), parameter.value, store.value_store), parameter.gradient,
                              store.gradient_store));
  }
  return steps;
}

double step_share(const TrainingPlan& plan, const PlanStep& step) {
  if (step.op->role != OpRole::grad_norm) return 1.0;
  double share = 1.0;
  // A gradient replicated over an axis its norm is reduced on counts once over the replicas.
  const PlanBuffer& gradient = plan.buffers[static_cast<size_t>(step.buffers.front().second)];
  for (MeshAxis axis : norm_axes(plan)) {
    // Stage ranks hold different parameters (no replicas), but both ends a tied table: the first counts it.
    if (axis == MeshAxis::stage) continue;
    if (!gradient.split_over(axis)) share /= static_cast<double>(plan.mesh.size(axis));
  }
  if (tied_across_stages(plan, step.op->parameter) && !plan.pipeline.first()) share = 0.0;
  // Replicated kv heads count once over their replicas.
  share /= static_cast<double>(
      kv_replicas(plan, plan.spec.parameters[static_cast<size_t>(step.op->parameter)].value));
  return share;
}

}  // namespace meshtrain
