// Liveness pass: the live ranges of one kernel's temporaries, the input of the allocator.
#include <map>

#include "meshtrain/core/error.h"
#include "meshtrain/plan/passes.h"

namespace meshtrain {

Liveness plan_liveness(const TrainingPlan& plan, const std::vector<PlanStep>& steps, KernelName kernel) {
  const ModelSpec& spec = plan.spec;
  Liveness result;
  result.value_of_step.resize(steps.size());
  std::map<PlanBufferId, size_t> current;  // buffer -> index in result.values
  for (size_t i = 0; i < steps.size(); ++i) {
    const PlanStep& step = steps[i];
    const int32_t op_index = static_cast<int32_t>(i);
    for (const auto& [spec_id, plan_id] : step.buffers) {
      const PlanBuffer& buffer = plan.buffers[static_cast<size_t>(plan_id)];
      if (buffer.persistent || buffer.part_of >= 0 || buffer.stashed) {  // stashed: the slots
        result.value_of_step[i].push_back(Liveness::kPersistent);
        continue;
      }
      // Gradients are accumulated into (only the zeroing ops overwrite them).
      const bool declared_gradient = spec_id < static_cast<BufferId>(spec.buffers.size()) &&
                                     spec.buffer(spec_id).kind == BufferKind::gradient;
      const bool reads =
          contains(step.op->reads, spec_id) || (declared_gradient && step.op->kind != OpKind::memory);
      const auto found = current.find(plan_id);
      if (!reads || found == current.end()) {
        MT_CHECK(!reads || step.op->kind == OpKind::collective, "op '" + step.op->name + "' reads '" +
                                                                    buffer.name + "' before any op of " +
                                                                    kernel_name(kernel) + " writes it");
        result.values.push_back({plan_id, op_index, op_index, 0});
        current[plan_id] = result.values.size() - 1;
      } else {
        result.values[found->second].last_op = op_index;
      }
      result.value_of_step[i].push_back(current[plan_id]);
    }
  }
  return result;
}

}  // namespace meshtrain
