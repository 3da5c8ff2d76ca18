// Storage pass: every spec buffer at its per-device size, where each parameter and its gradient persist
// (the spec's buffers, or FSDP's shards), ZeRO-1's data shards, and the persistent region's offsets.
#include <algorithm>

#include "meshtrain/core/arena.h"
#include "meshtrain/plan/passes.h"

namespace meshtrain {

void plan_storage(TrainingPlan& plan) {
  const ModelSpec& spec = plan.spec;
  const Mesh& mesh = plan.mesh;
  const ShardingLayout& sharding = spec.sharding;
  for (const BufferDecl& decl : spec.buffers) {
    PlanBuffer buffer{decl.name, decl.kind, decl.dtype, decl.shape, sharding.compute_layout(decl.shape).dims};
    // A pipeline chunk's input activation arrives per micro-batch into its activation slot.
    const auto id = static_cast<BufferId>(plan.buffers.size());
    buffer.stashed = std::any_of(spec.chunks.begin(), spec.chunks.end(),
                                 [id](const ChunkSection& chunk) { return chunk.boundary.input == id; });
    buffer.persistent = !buffer.stashed && (decl.kind == BufferKind::parameter ||
                                            decl.kind == BufferKind::gradient ||
                                            decl.kind == BufferKind::optimizer_state ||
                                            decl.kind == BufferKind::step_counter ||
                                            decl.kind == BufferKind::cache || decl.kind == BufferKind::input);
    if (decl.stack != kNoBuffer) {
      // A layer's block of a stacked parameter: a view, placed with its stack below.
      buffer.part_of = decl.stack;
      buffer.part_offset = static_cast<size_t>(decl.stack_index) *
                           static_cast<size_t>(buffer.shape.elements()) * dtype_bytes(buffer.dtype);
      buffer.persistent = false;
    }
    if (decl.kind == BufferKind::optimizer_state) {
      const TensorSharding layout =
          sharding.storage_layout(decl.shape, spec.config.shard_optimizer_over_data);
      buffer.shape = layout.local;
      buffer.sharding = layout.dims;
    }
    add_plan_buffer(plan, std::move(buffer));
  }
  for (const ParameterDecl& parameter : spec.parameters) {
    ParameterStorage store{parameter.value, parameter.gradient, false, -1, -1, 1, {}, {}};
    const BufferDecl& value = spec.buffer(parameter.value);
    const TensorSharding fsdp = sharding.storage_layout(value.shape, false);
    if (fsdp.local.elements() != value.shape.elements()) {
      // FSDP: the shard persists; the full (tensor-local) value and gradient exist only around their uses.
      store.gathered = true;
      for (PlanBufferId id : {parameter.value, parameter.gradient}) {
        PlanBuffer& full = plan.buffers[static_cast<size_t>(id)];
        PlanBuffer shard{"fsdp_shard/" + full.name, full.kind, full.dtype, fsdp.local, fsdp.dims};
        shard.persistent = true;
        full.kind = BufferKind::communication;
        full.persistent = false;
        const PlanBufferId shard_id = add_plan_buffer(plan, std::move(shard));
        (id == parameter.value ? store.value_store : store.gradient_store) = shard_id;
      }
    }
    for (size_t i = 0; i < parameter.members.size(); ++i) {
      const ParameterDecl::Member& member = parameter.members[i];
      if (!store.gathered) {
        store.member_value_stores.push_back(member.value);
        store.member_gradient_stores.push_back(member.gradient);
        continue;
      }
      // FSDP: each layer gathers its own block of the stacked shard, as the per-layer layout gathers the
      // layer's own shard (the layer axis is never split, so the block is the layer's shard).
      const TensorSharding member_fsdp = sharding.storage_layout(spec.buffer(member.value).shape, false);
      for (BufferId id : {member.value, member.gradient}) {
        if (id == kNoBuffer) continue;
        PlanBuffer& full = plan.buffers[static_cast<size_t>(id)];
        full.kind = BufferKind::communication;
        full.part_of = -1;
        full.part_offset = 0;
        const bool is_value = id == member.value;
        PlanBuffer shard{"fsdp_shard/" + full.name, is_value ? BufferKind::parameter : BufferKind::gradient,
                         full.dtype, member_fsdp.local, member_fsdp.dims};
        shard.part_of = is_value ? store.value_store : store.gradient_store;
        shard.part_offset = i * static_cast<size_t>(member_fsdp.local.elements()) * dtype_bytes(full.dtype);
        (is_value ? store.member_value_stores : store.member_gradient_stores)
            .push_back(add_plan_buffer(plan, shard));
      }
    }
    if (spec.config.shard_optimizer_over_data && mesh.size(MeshAxis::data) > 1) {
      const TensorSharding zero1 = sharding.storage_layout(value.shape, true);
      if (zero1.local.elements() * mesh.size(MeshAxis::data) == fsdp.local.elements()) {
        const PlanBuffer value_store = plan.buffers[static_cast<size_t>(store.value_store)];
        const PlanBuffer gradient_store = plan.buffers[static_cast<size_t>(store.gradient_store)];
        store.data_outer =
            shard_outer(PlanBuffer{"", BufferKind::parameter, value_store.dtype, zero1.local, zero1.dims},
                        MeshAxis::data, fsdp.local);
        // A contiguous shard is this rank's slot of the parameter; a strided one (a dim after a tensor-split
        // dim) is copied out into a temporary before AdamW.
        PlanBuffer value_shard{"data_shard/" + value_store.name,
                               store.data_outer == 1 ? BufferKind::parameter : BufferKind::communication,
                               value_store.dtype, zero1.local, zero1.dims};
        if (store.data_outer == 1) {
          value_shard.part_of = store.value_store;
          value_shard.data_rank_slot = true;
        }
        store.value_data_shard = add_plan_buffer(plan, std::move(value_shard));
        // A contiguous gradient shard persists, so its reduce-scatter can start during the last micro-batch's
        // backward; a strided one goes through a staging buffer in update.
        PlanBuffer gradient_shard{"data_shard/" + gradient_store.name, BufferKind::communication,
                                  gradient_store.dtype, zero1.local, zero1.dims};
        gradient_shard.persistent = store.data_outer == 1;
        store.gradient_data_shard = add_plan_buffer(plan, std::move(gradient_shard));
      }
    }
    plan.storage.push_back(store);
  }
  // Persistent region: parameters, gradients, optimizer state, step counter (decode: caches), then the batch.
  size_t offset = 0;
  for (BufferKind kind :
       {BufferKind::parameter, BufferKind::gradient, BufferKind::optimizer_state, BufferKind::step_counter,
        BufferKind::cache, BufferKind::input, BufferKind::communication}) {
    for (PlanBuffer& buffer : plan.buffers) {
      if (!buffer.persistent || buffer.kind != kind) continue;
      buffer.offset = offset;
      offset += align_up(buffer.bytes);
    }
  }
  plan.persistent_bytes = offset;
  for (PlanBuffer& buffer : plan.buffers) {
    if (buffer.part_of >= 0)
      buffer.offset = plan.buffers[static_cast<size_t>(buffer.part_of)].offset + buffer.part_offset;
  }
}

PlanBufferId view_owner(const TrainingPlan& plan, PlanBufferId id) {
  const PlanBuffer& buffer = plan.buffers[static_cast<size_t>(id)];
  return buffer.part_of >= 0 && !buffer.data_rank_slot ? buffer.part_of : id;
}

}  // namespace meshtrain
