// The pieces the planner's passes share: steps and their bindings, and the plan's own buffers and ops.
#include <set>

#include "meshtrain/plan/passes.h"

namespace meshtrain {
namespace {

std::string layer_of(const std::string& name) {
  // "adam_m/decoder/layers_3/mlp/wo/kernel" -> "decoder/layers_3"; "token_embedder/out" -> "token_embedder"
  const size_t layers = name.find("layers_");
  if (layers != std::string::npos) return "decoder/" + name.substr(layers, name.find('/', layers) - layers);
  for (const char* top : {"token_embedder", "position_embedder", "decoder/decoder_norm",
                          "decoder/logits_dense", "loss", "optimizer", "batch", "scratch"}) {
    if (name.find(top) != std::string::npos) return top;
  }
  return "other";
}

}  // namespace

PlanStep step_of(const OpDecl* op, bool recompute) {
  PlanStep step{op, recompute, {}};
  std::set<BufferId> seen;
  for (const std::vector<BufferId>* ids : {&op->reads, &op->writes}) {
    for (BufferId id : *ids) {
      if (seen.insert(id).second) step.buffers.emplace_back(id, id);
    }
  }
  return step;
}

PlanStep bind_step(PlanStep step, BufferId spec_id, PlanBufferId plan_id) {
  for (auto& binding : step.buffers) {
    if (binding.first == spec_id) binding.second = plan_id;
  }
  return step;
}

PlanBufferId add_plan_buffer(TrainingPlan& plan, PlanBuffer buffer) {
  buffer.bytes = static_cast<size_t>(buffer.shape.elements()) * dtype_bytes(buffer.dtype);
  if (buffer.layer.empty()) buffer.layer = layer_of(buffer.name);
  plan.buffers.push_back(std::move(buffer));
  return static_cast<PlanBufferId>(plan.buffers.size() - 1);
}

const OpDecl* add_plan_op(TrainingPlan& plan, OpDecl op) {
  plan.plan_ops.push_back(std::move(op));
  return &plan.plan_ops.back();
}

const OpDecl* add_collective_op(TrainingPlan& plan, const std::string& name, OpRole role, int32_t parameter,
                                CollectiveKind kind, MeshAxis axis, BufferId buffer, BufferId shard,
                                int64_t outer, bool accumulate, int64_t group) {
  OpDecl op{name,
            {},
            {},
            0.0,
            nullptr,
            OpKind::collective,
            {kind, axis, group > 0 ? group : plan.mesh.size(axis), buffer, shard}};
  op.role = role;
  op.parameter = parameter;
  op.collective.outer = outer;
  op.reads = {kind == CollectiveKind::all_gather ? shard : buffer};
  op.writes = {kind == CollectiveKind::reduce_scatter || kind == CollectiveKind::all_to_all ? shard : buffer};
  if (accumulate) op.reads.push_back(shard);
  const PlanBuffer& full = plan.buffers[static_cast<size_t>(buffer)];
  size_t staging_elements = outer > 1 ? static_cast<size_t>(full.shape.elements()) : 0;
  if (accumulate)
    staging_elements += static_cast<size_t>(plan.buffers[static_cast<size_t>(shard)].shape.elements());
  if (staging_elements > 0) {
    const DType dtype = full.dtype;
    op.collective.staging =
        add_plan_buffer(plan, PlanBuffer{"staging/" + name,
                                         BufferKind::communication,
                                         dtype,
                                         shape_of({{"elements", static_cast<int64_t>(staging_elements)}}),
                                         {DimSharding{}}});
    op.writes.push_back(op.collective.staging);
  }
  return add_plan_op(plan, std::move(op));
}

int64_t shard_outer(const PlanBuffer& store, MeshAxis axis, const Shape& full) {
  int64_t outer = 1;
  for (size_t i = 0; i < store.sharding.size(); ++i) {
    const std::vector<MeshAxis>& axes = store.sharding[i].axes;
    if (std::find(axes.begin(), axes.end(), axis) != axes.end()) return outer;
    outer *= full.dims[i];
  }
  return 1;
}

}  // namespace meshtrain
