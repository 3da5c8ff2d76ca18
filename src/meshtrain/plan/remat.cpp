// Remat pass: the backward op order under the remat policy; before each layer block's backward, the forward
// ops that rewrite what the policy did not keep.
#include <algorithm>
#include <set>

#include "meshtrain/plan/passes.h"

namespace meshtrain {
namespace {

// Under `full`, a block keeps only what other blocks read (its input and output on the residual stream);
// `minimal` also keeps what matmuls and attention wrote. Everything else its backward reads is recomputed.
bool saved(const ModelSpec& spec, BufferId id, const LayerBlock& block, const std::set<BufferId>& outside) {
  const RematPolicy policy = spec.config.remat_policy;
  if (policy == RematPolicy::none || spec.buffer(id).kind != BufferKind::activation || outside.count(id))
    return true;
  if (policy == RematPolicy::minimal) {
    for (size_t i = block.forward_begin; i < block.forward_end; ++i) {
      const OpDecl& op = spec.forward[i];
      if ((op.kind == OpKind::matmul || op.kind == OpKind::attention) && contains(op.writes, id)) return true;
    }
  }
  return false;
}

}  // namespace

std::vector<PlanStep> backward_with_recompute(const ModelSpec& spec, size_t begin, size_t end) {
  std::vector<PlanStep> steps;
  std::vector<const LayerBlock*> starting(spec.loss_backward.size() + 1, nullptr);
  if (spec.config.remat_policy != RematPolicy::none) {
    for (const LayerBlock& block : spec.blocks) starting[block.backward_begin] = &block;
  }
  // How many ops touch each buffer; a block's own ops are subtracted to find what others touch.
  std::vector<int32_t> touches(spec.buffers.size(), 0);
  const auto count = [&](const OpDecl& op, int32_t delta) {
    std::set<BufferId> unique(op.reads.begin(), op.reads.end());
    unique.insert(op.writes.begin(), op.writes.end());
    for (BufferId id : unique) touches[static_cast<size_t>(id)] += delta;
  };
  for (const std::vector<OpDecl>* ops : {&spec.forward, &spec.loss_backward, &spec.loss_forward}) {
    for (const OpDecl& op : *ops) count(op, 1);
  }
  for (size_t i = begin; i < std::min(end, spec.loss_backward.size()); ++i) {
    if (const LayerBlock* block = starting[i]) {
      // Buffers some op outside this block touches.
      for (size_t f = block->forward_begin; f < block->forward_end; ++f) count(spec.forward[f], -1);
      for (size_t b = block->backward_begin; b < block->backward_end; ++b) count(spec.loss_backward[b], -1);
      std::set<BufferId> outside;
      for (size_t id = 0; id < touches.size(); ++id) {
        if (touches[id] > 0) outside.insert(static_cast<BufferId>(id));
      }
      for (size_t f = block->forward_begin; f < block->forward_end; ++f) count(spec.forward[f], 1);
      for (size_t b = block->backward_begin; b < block->backward_end; ++b) count(spec.loss_backward[b], 1);
      // Recompute every forward op of the block that writes a needed buffer, closing over their inputs.
      std::set<BufferId> needed;
      for (size_t b = block->backward_begin; b < block->backward_end; ++b) {
        for (BufferId id : spec.loss_backward[b].reads) {
          if (!saved(spec, id, *block, outside)) needed.insert(id);
        }
      }
      std::vector<bool> chosen(block->forward_end - block->forward_begin, false);
      for (bool grew = true; grew;) {
        grew = false;
        for (size_t f = block->forward_begin; f < block->forward_end; ++f) {
          const OpDecl& op = spec.forward[f];
          if (chosen[f - block->forward_begin]) continue;
          if (std::none_of(op.writes.begin(), op.writes.end(), [&](BufferId id) { return needed.count(id); }))
            continue;
          chosen[f - block->forward_begin] = grew = true;
          for (BufferId id : op.reads) {
            if (!saved(spec, id, *block, outside)) needed.insert(id);
          }
        }
      }
      // The traffic a chosen op moves itself is counted by the collective ops just before it
      // (inside_next_op): they are recomputed with it, so the plan counts what the recompute moves.
      for (size_t f = block->forward_end; f-- > block->forward_begin + 1;) {
        if (chosen[f - block->forward_begin] && spec.forward[f - 1].collective.inside_next_op)
          chosen[f - 1 - block->forward_begin] = true;
      }
      for (size_t f = block->forward_begin; f < block->forward_end; ++f) {
        if (chosen[f - block->forward_begin]) steps.push_back(step_of(&spec.forward[f], true));
      }
    }
    steps.push_back(step_of(&spec.loss_backward[i]));
  }
  return steps;
}

}  // namespace meshtrain
