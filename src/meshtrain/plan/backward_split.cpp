// zero_bubble's split of a micro-batch's backward into its input part (B_input) and its weight part (W):
// which steps move to W and which values W must read from a copy, on the fused order's liveness.
#include <set>

#include "meshtrain/plan/passes.h"

namespace meshtrain {
namespace {

// Bytes of the persistent region a binding touches, to tell whether two ops touch the same memory: a view
// inside another buffer is its part of it, a ZeRO-1 data-rank slot (its place depends on the rank) the whole
// of it.
std::pair<size_t, size_t> persistent_range(const TrainingPlan& plan, PlanBufferId id) {
  const PlanBuffer& buffer = plan.buffers[static_cast<size_t>(id)];
  if (buffer.part_of < 0) return {buffer.offset, buffer.offset + buffer.bytes};
  const std::pair<size_t, size_t> owner = persistent_range(plan, buffer.part_of);
  if (buffer.data_rank_slot) return owner;
  return {owner.first + buffer.part_offset, owner.first + buffer.part_offset + buffer.bytes};
}

bool writes(const PlanStep& step, size_t binding) {
  return contains(step.op->writes, step.buffers[binding].first);
}

// Whether steps `a` and `b` touch overlapping persistent memory, one of them writing it (their order then
// matters: a gradient accumulated twice is summed in order). Slot buffers (boundary buffers) are left out:
// only input ops touch them.
bool persistent_conflict(const TrainingPlan& plan, const Liveness& liveness, size_t a, size_t b,
                         const std::vector<PlanStep>& steps) {
  for (size_t x = 0; x < steps[a].buffers.size(); ++x) {
    const PlanBufferId first = steps[a].buffers[x].second;
    if (liveness.value_of_step[a][x] != Liveness::kPersistent ||
        plan.buffers[static_cast<size_t>(first)].stashed)
      continue;
    const auto [first_begin, first_end] = persistent_range(plan, first);
    for (size_t y = 0; y < steps[b].buffers.size(); ++y) {
      const PlanBufferId second = steps[b].buffers[y].second;
      if (liveness.value_of_step[b][y] != Liveness::kPersistent ||
          plan.buffers[static_cast<size_t>(second)].stashed || !(writes(steps[a], x) || writes(steps[b], y)))
        continue;
      const auto [second_begin, second_end] = persistent_range(plan, second);
      if (first_begin < second_end && second_begin < first_end) return true;
    }
  }
  return false;
}

}  // namespace

BackwardSplit split_backward(const TrainingPlan& plan, const std::vector<PlanStep>& steps, size_t cut,
                             const Liveness& liveness) {
  // A weight op whose move would reorder it with an input op on the same persistent memory stays an input op;
  // so does every weight op a moved step follows, when that step is the one in the way. Each round demotes
  // at least one, so this ends.
  std::vector<bool> demoted(steps.size(), false);
  for (;;) {
    BackwardSplit split;
    split.weight.assign(steps.size(), false);
    // The weight ops each step follows (itself, or those that wrote a value it touches), and each value's.
    std::vector<std::set<size_t>> roots(steps.size()), value_roots(liveness.values.size());
    for (size_t i = cut; i < steps.size(); ++i) {
      const PlanStep& step = steps[i];
      if (step.op->weight_gradients_only && !step.recompute && !demoted[i]) roots[i].insert(i);
      // A step that reads or adds into what a weight op wrote runs after it: in W too.
      for (size_t b = 0; b < step.buffers.size(); ++b) {
        const size_t value = liveness.value_of_step[i][b];
        if (value != Liveness::kPersistent)
          roots[i].insert(value_roots[value].begin(), value_roots[value].end());
      }
      if (roots[i].empty()) continue;
      split.weight[i] = true;
      for (size_t b = 0; b < step.buffers.size(); ++b) {
        const size_t value = liveness.value_of_step[i][b];
        if (value != Liveness::kPersistent && writes(step, b))
          value_roots[value].insert(roots[i].begin(), roots[i].end());
      }
    }
    bool conflict = false;
    for (size_t w = cut; w < steps.size() && !conflict; ++w) {
      if (!split.weight[w]) continue;
      for (size_t i = w + 1; i < steps.size(); ++i) {
        if (split.weight[i] || !persistent_conflict(plan, liveness, w, i, steps)) continue;
        for (size_t root : roots[w]) demoted[root] = true;
        conflict = true;
        break;
      }
    }
    if (conflict) continue;
    // A value a weight op reads and a later input op adds into (a residual stream's gradient): the weight op
    // reads a copy taken where it stood.
    for (size_t w = cut; w < steps.size(); ++w) {
      if (!split.weight[w]) continue;
      for (size_t b = 0; b < steps[w].buffers.size(); ++b) {
        const size_t value = liveness.value_of_step[w][b];
        if (value == Liveness::kPersistent || writes(steps[w], b)) continue;
        bool changed_later = false;
        for (size_t i = w + 1; i < steps.size() && !changed_later; ++i) {
          if (split.weight[i]) continue;
          for (size_t c = 0; c < steps[i].buffers.size(); ++c)
            changed_later = changed_later || (liveness.value_of_step[i][c] == value && writes(steps[i], c));
        }
        if (changed_later) split.captures.push_back({w, b});
      }
    }
    return split;
  }
}

}  // namespace meshtrain
