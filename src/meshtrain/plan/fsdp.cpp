// FSDP pass: gathers each sharded parameter before its first use in each phase (forward, then backward: the
// full copy is freed in between), zeroes its full gradient before the backward's first write, and
// reduce-scatters it into the persistent shard after the last.
#include <map>

#include "meshtrain/plan/passes.h"

namespace meshtrain {

std::vector<std::vector<PlanStep>> insert_fsdp(TrainingPlan& plan,
                                               const std::vector<std::vector<const OpDecl*>>& phases,
                                               const std::vector<std::vector<bool>>& recompute,
                                               bool with_gradients) {
  const ModelSpec& spec = plan.spec;
  std::vector<std::vector<PlanStep>> steps(phases.size());
  for (size_t p = 0; p < phases.size(); ++p) {
    const std::vector<const OpDecl*>& ops = phases[p];
    std::map<size_t, std::vector<const OpDecl*>> before, after;
    for (size_t k = 0; k < spec.parameters.size(); ++k) {
      const ParameterDecl& parameter = spec.parameters[k];
      const ParameterStorage& store = plan.storage[k];
      if (!store.gathered) continue;
      // What is gathered as one: the parameter, or each layer of a stacked one (its block of the shard).
      struct Unit {
        std::string name;
        BufferId value, gradient;
        PlanBufferId value_store, gradient_store;
      };
      std::vector<Unit> units;
      if (!parameter.stacked()) {
        units.push_back({parameter.canonical_name, parameter.value, parameter.gradient, store.value_store,
                         store.gradient_store});
      }
      for (size_t i = 0; i < parameter.members.size(); ++i) {
        const ParameterDecl::Member& member = parameter.members[i];
        units.push_back({member.canonical_name, member.value, member.gradient, store.member_value_stores[i],
                         member.gradient == kNoBuffer ? -1 : store.member_gradient_stores[i]});
      }
      const int32_t index = static_cast<int32_t>(k);
      for (const Unit& unit : units) {
        size_t first_read = ops.size(), first_write = ops.size(), last_write = 0;
        for (size_t i = 0; i < ops.size(); ++i) {
          if (first_read == ops.size() && contains(ops[i]->reads, unit.value)) first_read = i;
          if (contains(ops[i]->writes, unit.gradient)) {
            first_write = std::min(first_write, i);
            last_write = i;
          }
        }
        const int64_t outer = shard_outer(plan.buffers[static_cast<size_t>(unit.value_store)], MeshAxis::fsdp,
                                          spec.buffer(unit.value).shape);
        if (first_read < ops.size()) {
          before[first_read].push_back(add_collective_op(
              plan, "fsdp/gather/" + unit.name + (p == 0 ? "" : "#backward"), OpRole::fsdp_gather, index,
              CollectiveKind::all_gather, MeshAxis::fsdp, unit.value, unit.value_store, outer));
        }
        if (with_gradients && first_write < ops.size()) {
          const BufferId full = unit.gradient;
          OpDecl zero{"fsdp/zero/" + unit.name,
                      {},
                      {full},
                      0.0,
                      [full](const OpContext& context) {
                        const TensorView view = context.view(full);
                        context.kernels->memory_fill(view.data, 0, view.bytes());
                      },
                      OpKind::memory};
          zero.role = OpRole::fsdp_zero;
          zero.parameter = index;
          before[first_write].push_back(add_plan_op(plan, std::move(zero)));
          after[last_write].push_back(add_collective_op(
              plan, "fsdp/reduce_scatter/" + unit.name, OpRole::fsdp_reduce_scatter, index,
              CollectiveKind::reduce_scatter, MeshAxis::fsdp, full, unit.gradient_store, outer, true));
        }
      }
    }
    for (size_t i = 0; i < ops.size(); ++i) {
      for (const OpDecl* op : before[i]) steps[p].push_back(step_of(op));
      steps[p].push_back(step_of(ops[i], recompute[p][i]));
      for (const OpDecl* op : after[i]) steps[p].push_back(step_of(op));
    }
  }
  return steps;
}

}  // namespace meshtrain
