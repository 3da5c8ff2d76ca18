// The planner as a pipeline of passes: the optimizer's over a training spec (optim/optimizer.h), then
// (passes.h) storage, per kernel its op order (remat, FSDP, reductions and update), liveness, the allocator
// and cost; then the overlap schedule and the step's program (program.h).
#include "meshtrain/plan/plan.h"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <optional>

#include "meshtrain/core/error.h"
#include "meshtrain/data/context_reorder.h"
#include "meshtrain/model/pipeline_placement.h"
#include "meshtrain/plan/allocator.h"
#include "meshtrain/plan/passes.h"
#include "meshtrain/plan/pipeline_program.h"
#include "meshtrain/plan/pipeline_schedule.h"

namespace meshtrain {
namespace {

// The op order of one kernel, before liveness, and where its second phase (the backward, or eval's loss)
// begins.
struct KernelSteps {
  std::vector<PlanStep> steps;
  size_t backward_begin = 0;
};

KernelSteps kernel_steps(TrainingPlan& plan, KernelName kernel, int64_t chunk = 0) {
  if (kernel == KernelName::update) return {update_steps(plan), 0};
  if (kernel == KernelName::zero_gradients) return {{step_of(add_zero_gradients_op(plan))}, 0};
  const ModelSpec& spec = plan.spec;
  const ChunkSection& section = spec.chunks.at(static_cast<size_t>(chunk));
  const PipelineStage::ChunkTransfers* transfers = plan.pipeline.transfers(chunk);
  std::vector<std::vector<const OpDecl*>> phases(2);
  std::vector<std::vector<bool>> recompute(2);
  const auto add = [&](size_t phase, const OpDecl* op, bool recomputed = false) {
    if (op == nullptr) return;  // a boundary copy the chunk has no neighbour for
    phases[phase].push_back(op);
    recompute[phase].push_back(recomputed);
  };
  for (size_t i = section.forward_begin; i < section.forward_end; ++i) add(0, &spec.forward[i]);
  if (transfers) add(0, transfers->output_copy);
  // A decode spec's forward ends with its logits: decode is its forward alone (no loss ops exist).
  if (kernel == KernelName::eval || kernel == KernelName::decode) {
    if (section.layers.with_head)
      for (const OpDecl& op : spec.loss_forward) add(1, &op);
  } else {
    if (transfers) add(1, transfers->output_gradient_copy);
    for (const PlanStep& step : backward_with_recompute(spec, section.backward_begin, section.backward_end))
      add(1, step.op, step.recompute);
    if (transfers) add(1, transfers->input_gradient_copy);
  }
  KernelSteps result;
  if (kernel == KernelName::fwd_bwd) result.steps.push_back(step_of(add_zero_gradients_op(plan)));
  std::vector<std::vector<PlanStep>> phase_steps = insert_fsdp(
      plan, phases, recompute, kernel == KernelName::fwd_bwd || kernel == KernelName::fwd_bwd_accum);
  for (size_t p = 0; p < phase_steps.size(); ++p) {
    if (p == 1) result.backward_begin = result.steps.size();
    for (PlanStep& step : phase_steps[p]) result.steps.push_back(std::move(step));
  }
  return result;
}

// An op of a stage plan copying one activation-sized buffer into another (PipelineStage's boundary copies).
// The copy runs in host memory: meshes of more than one rank run on the cpu backend only
// (check_plan_runs_here).
const OpDecl* add_copy_op(TrainingPlan& plan, const std::string& name, BufferId from, BufferId to) {
  OpDecl copy{name,
              {from},
              {to},
              0.0,
              [from, to](const OpContext& context) {
                const TensorView source = context.view(from), target = context.view(to);
                MT_CHECK(source.bytes() == target.bytes() && context.kernels->memory_on_host(),
                         "a boundary copy between host buffers of one size");
                std::memcpy(target.data, source.data, source.bytes());
              },
              OpKind::memory};
  return add_plan_op(plan, std::move(copy));
}

// A stage plan's boundary buffers in the activation slots and the copies that fill and empty them, per chunk
// of its spec: the global first chunk has no input, the global last no output.
void plan_pipeline_boundary(TrainingPlan& plan) {
  PipelineStage& stage = plan.pipeline;
  for (size_t k = 0; k < plan.spec.chunks.size(); ++k) {
    const ChunkSection& section = plan.spec.chunks[k];
    const ChunkBoundary& boundary = section.boundary;
    const std::string suffix = k == 0 ? "" : "_" + std::to_string(k);
    const auto stashed_like = [&](const std::string& name, BufferKind kind, BufferId like) {
      const PlanBuffer& model = plan.buffers[static_cast<size_t>(like)];
      PlanBuffer buffer{name + suffix, kind, model.dtype, model.shape, model.sharding};
      buffer.stashed = true;
      return add_plan_buffer(plan, std::move(buffer));
    };
    PipelineStage::ChunkTransfers transfers;
    if (!section.layers.with_embedding) {
      transfers.input = boundary.input;
      transfers.input_gradient =
          stashed_like("pipeline/input_gradient", BufferKind::activation, boundary.input);
      transfers.input_gradient_copy = add_copy_op(plan, "pipeline/input_gradient" + suffix,
                                                  boundary.input_gradient, transfers.input_gradient);
    }
    if (!section.layers.with_head) {
      transfers.output = stashed_like("pipeline/output", BufferKind::activation, boundary.output);
      transfers.output_gradient =
          stashed_like("pipeline/output_gradient", BufferKind::input, boundary.output);
      transfers.output_copy =
          add_copy_op(plan, "pipeline/output" + suffix, boundary.output, transfers.output);
      transfers.output_gradient_copy = add_copy_op(plan, "pipeline/output_gradient" + suffix,
                                                   transfers.output_gradient, boundary.output_gradient);
    }
    stage.chunks.push_back(transfers);
  }
}

constexpr size_t kNotStashed = SIZE_MAX;

// The plan of the kernel made of steps [begin, end) of `steps`, whose live ranges `liveness` gives: every
// binding's arena offset, and the temporaries placed from `temporaries_begin` up. `stash_of_value` (the split
// kernels, and a stage plan's eval; null otherwise): per value of `liveness`, its arena offset in the
// stash's slot 0, or kNotStashed; a stashed value is no temporary of the kernel, nor is a batch input or
// boundary buffer the stash holds (bound in slot 0 too).
KernelPlan place_kernel(TrainingPlan& plan, KernelName kernel, const std::vector<PlanStep>& steps,
                        size_t begin, size_t end, const Liveness& liveness, size_t temporaries_begin,
                        const std::vector<size_t>* stash_of_value = nullptr, int64_t chunk = 0) {
  KernelPlan result;
  result.kernel = kernel;
  result.chunk = chunk;
  const auto stashed = [&](size_t value) {
    return stash_of_value && (*stash_of_value)[value] != kNotStashed;
  };
  std::vector<size_t> kernel_value(liveness.values.size(), kNotStashed);  // liveness value -> result.values
  std::vector<AllocatorValue> live_ranges;
  for (size_t v = 0; v < liveness.values.size(); ++v) {
    PlanValue value = liveness.values[v];
    if (stashed(v) || value.first_op < static_cast<int32_t>(begin) ||
        value.last_op >= static_cast<int32_t>(end))
      continue;
    value.first_op -= static_cast<int32_t>(begin);
    value.last_op -= static_cast<int32_t>(begin);
    kernel_value[v] = result.values.size();
    result.values.push_back(value);
    live_ranges.push_back(
        {plan.buffers[static_cast<size_t>(value.buffer)].bytes, value.first_op, value.last_op});
  }
  const Allocation temporaries = allocate(live_ranges);
  for (size_t v = 0; v < result.values.size(); ++v)
    result.values[v].offset = temporaries_begin + temporaries.offsets[v];
  // Each op with the arena offset behind every binding.
  for (size_t i = begin; i < end; ++i) {
    const PlanStep& step = steps[i];
    PlanOp op{step.op, step.recompute, 0.0, 0.0, 0.0, 0.0, step_share(plan, step), step.buffers, {}};
    for (size_t b = 0; b < step.buffers.size(); ++b) {
      const size_t value = liveness.value_of_step[i][b];
      const PlanBufferId id = step.buffers[b].second;
      if (value == Liveness::kPersistent) {
        const ActivationStash::Entry* input = stash_of_value ? plan.stash.find(id, chunk) : nullptr;
        op.offsets.push_back(input ? plan.stash.offset + input->offset
                                   : plan.buffers[static_cast<size_t>(id)].offset);
      } else {
        op.offsets.push_back(stashed(value) ? (*stash_of_value)[value]
                                            : result.values[kernel_value[value]].offset);
      }
    }
    result.ops.push_back(std::move(op));
  }
  cost_kernel(plan, result);
  result.memory =
      memory_figures(plan, result, temporaries_begin - plan.persistent_bytes + temporaries.extent);
  return result;
}

KernelPlan plan_kernel(TrainingPlan& plan, KernelName kernel) {
  const std::vector<PlanStep> steps = kernel_steps(plan, kernel).steps;
  return place_kernel(plan, kernel, steps, 0, steps.size(), plan_liveness(plan, steps, kernel),
                      plan.persistent_bytes);
}

// zero_bubble's backward_input and backward_weight in one step list: the forward's steps, then the backward
// steps of `steps` (fused order, from `cut`) split by split_backward, each part in its fused relative order,
// with the fused order's values (a shared scratch buffer written by several layers is several values,
// whichever part reads each) and their live ranges over this list. A weight step reading a value a later
// input step adds into reads a copy, taken in the input part where the weight step stood.
struct BackwardParts {
  std::vector<PlanStep> steps;
  Liveness liveness;     // the fused values, with ranges over `steps` (-1: no step here touches one)
  size_t input_end = 0;  // steps [cut, input_end) are backward_input's, the rest backward_weight's
  std::map<PlanBufferId, int32_t> copies;  // each copy's buffer and the step that takes it
  std::vector<bool> in_input, in_weight;   // per value: whether a step of each part touches it
};

BackwardParts order_backward_parts(TrainingPlan& plan, const std::vector<PlanStep>& steps, size_t cut,
                                   const Liveness& liveness) {
  const BackwardSplit split = split_backward(plan, steps, cut, liveness);
  BackwardParts parts;
  parts.steps.assign(steps.begin(), steps.begin() + static_cast<std::ptrdiff_t>(cut));
  std::vector<std::vector<size_t>>& part_values = parts.liveness.value_of_step;
  part_values.assign(liveness.value_of_step.begin(),
                     liveness.value_of_step.begin() + static_cast<std::ptrdiff_t>(cut));
  std::vector<PlanStep> weight_steps;
  std::vector<std::vector<size_t>> weight_values;
  for (size_t i = cut; i < steps.size(); ++i) {
    if (!split.weight[i]) {
      parts.steps.push_back(steps[i]);
      part_values.push_back(liveness.value_of_step[i]);
      continue;
    }
    PlanStep step = steps[i];
    std::vector<size_t> values = liveness.value_of_step[i];
    for (const auto& [captured_step, binding] : split.captures) {
      if (captured_step != i) continue;
      const auto [spec_id, plan_id] = step.buffers[binding];
      const PlanBuffer& source = plan.buffers[static_cast<size_t>(plan_id)];
      PlanBuffer copy{"zero_bubble/" + step.op->name + "/" + source.name, source.kind, source.dtype,
                      source.shape, source.sharding};
      copy.stashed = true;
      const PlanBufferId copy_id = add_plan_buffer(plan, std::move(copy));
      parts.copies[copy_id] = static_cast<int32_t>(parts.steps.size());
      const OpDecl* copy_op = add_copy_op(
          plan, "zero_bubble/copy/" + step.op->name + "/" + plan.buffers[static_cast<size_t>(plan_id)].name,
          spec_id, copy_id);
      parts.steps.push_back(bind_step(step_of(copy_op), spec_id, plan_id));
      part_values.push_back({values[binding], Liveness::kPersistent});
      step.buffers[binding].second = copy_id;
      values[binding] = Liveness::kPersistent;
    }
    weight_steps.push_back(std::move(step));
    weight_values.push_back(std::move(values));
  }
  parts.input_end = parts.steps.size();
  parts.steps.insert(parts.steps.end(), weight_steps.begin(), weight_steps.end());
  part_values.insert(part_values.end(), weight_values.begin(), weight_values.end());
  parts.liveness.values = liveness.values;
  parts.in_input.assign(liveness.values.size(), false);
  parts.in_weight.assign(liveness.values.size(), false);
  for (PlanValue& value : parts.liveness.values) value.first_op = value.last_op = -1;
  for (size_t i = 0; i < parts.steps.size(); ++i) {
    for (size_t value : part_values[i]) {
      if (value == Liveness::kPersistent) continue;
      PlanValue& range = parts.liveness.values[value];
      if (range.first_op < 0) range.first_op = static_cast<int32_t>(i);
      range.last_op = static_cast<int32_t>(i);
      if (i >= cut) (i < parts.input_end ? parts.in_input : parts.in_weight)[value] = true;
    }
  }
  return parts;
}

// The split kernels over `slots` activation slots (ActivationStash): zero_gradients, then fwd_bwd_accum's
// steps cut where its backward begins, so forward then backward run exactly fwd_bwd_accum's ops in its order
// (and zero_gradients then both, fwd_bwd's). Their live ranges are fwd_bwd_accum's: a value written before
// the cut and read after it is one the backward needs from the forward, whatever the remat policy kept.
// `whole_backward`: plan backward; `backward_parts`: backward_input and backward_weight (BackwardParts),
// whose slot also holds each value both parts touch and each copy a weight step reads, until W; there a value
// of the forward's stash that W does not read ends with its last input step, and what B_input leaves for W
// may take its place.
void plan_split_kernels(TrainingPlan& plan, int64_t slots, bool whole_backward, bool backward_parts) {
  plan.kernels.push_back(plan_kernel(plan, KernelName::zero_gradients));
  ActivationStash& stash = plan.stash;
  // Per chunk: its fused steps cut where its backward begins, their live ranges, which stash entry each
  // value in the slot is, and (zero_bubble) the backward's parts; a slot is as large as the largest chunk's.
  struct Cut {
    KernelSteps fused;
    Liveness liveness;
    std::vector<size_t> entry_of_value;
    std::optional<BackwardParts> parts;
  };
  std::vector<Cut> cuts;
  for (size_t k = 0; k < plan.spec.chunks.size(); ++k) {
    const auto chunk = static_cast<int64_t>(k);
    Cut of_chunk;
    of_chunk.fused = kernel_steps(plan, KernelName::fwd_bwd_accum, chunk);
    const std::vector<PlanStep>& steps = of_chunk.fused.steps;
    const auto cut = static_cast<int32_t>(of_chunk.fused.backward_begin);
    of_chunk.liveness = plan_liveness(plan, steps, KernelName::fwd_bwd_accum);
    const Liveness& liveness = of_chunk.liveness;
    std::vector<size_t>& entry_of_value = of_chunk.entry_of_value;
    entry_of_value.assign(liveness.values.size(), kNotStashed);
    const size_t first_entry = stash.entries.size();
    // Per entry of this chunk: its value, or kNotStashed for a buffer's entry (a batch input, a boundary, a
    // copy).
    std::vector<size_t> value_of_entry;
    const auto add_entry = [&](PlanBufferId buffer, size_t value) {
      value_of_entry.push_back(value);
      stash.entries.push_back({buffer, 0, chunk});
    };
    for (size_t v = 0; v < liveness.values.size(); ++v) {
      const PlanValue& value = liveness.values[v];
      if (value.first_op < cut && value.last_op >= cut) {
        entry_of_value[v] = stash.entries.size();
        add_entry(value.buffer, v);
      }
    }
    // The batch is loaded once, before its forward: the backward reads the slot's copy of what it reads.
    // The forward writes no other persistent buffer but gradients (added into, never read back by a
    // backward) and its slot's boundary buffers, so nothing else a backward reads can have changed since
    // its own forward.
    for (size_t i = 0; i < steps.size(); ++i) {
      for (size_t b = 0; b < steps[i].buffers.size(); ++b) {
        const PlanBufferId id = steps[i].buffers[b].second;
        const PlanBuffer& buffer = plan.buffers[static_cast<size_t>(id)];
        if (liveness.value_of_step[i][b] != Liveness::kPersistent) continue;
        MT_CHECK(static_cast<int32_t>(i) >= cut || buffer.kind == BufferKind::input ||
                     buffer.kind == BufferKind::gradient || buffer.stashed ||
                     !contains(steps[i].op->writes, steps[i].buffers[b].first),
                 "forward op '" + steps[i].op->name + "' writes persistent '" + buffer.name +
                     "', which a micro-batch's backward would read after another's forward");
        if ((buffer.stashed || (static_cast<int32_t>(i) >= cut && buffer.kind == BufferKind::input)) &&
            !stash.find(id, chunk))
          add_entry(id, kNotStashed);
      }
    }
    // A stage plan's boundary buffers: what the transfers between stage ranks read and write.
    if (const PipelineStage::ChunkTransfers* transfers = plan.pipeline.transfers(chunk)) {
      for (PlanBufferId id :
           {transfers->input, transfers->output, transfers->output_gradient, transfers->input_gradient}) {
        if (id >= 0 && !stash.find(id, chunk)) add_entry(id, kNotStashed);
      }
    }
    // The entries of the forward's stash are all live at the cut: the allocator packs them into one slot.
    std::vector<AllocatorValue> at_cut;
    for (size_t e = first_entry; e < stash.entries.size(); ++e)
      at_cut.push_back({plan.buffers[static_cast<size_t>(stash.entries[e].buffer)].bytes, cut, cut});
    Allocation slot = allocate(at_cut);
    if (backward_parts) {
      of_chunk.parts = order_backward_parts(plan, steps, of_chunk.fused.backward_begin, liveness);
      const BackwardParts& parts = *of_chunk.parts;
      // Over the parts' order: the batch inputs and boundary buffers live throughout, the forward's values
      // until their last use (at least the cut), the copies from where they are taken, and the values both
      // parts touch from their first use; all until W's end at most.
      const auto end = static_cast<int32_t>(parts.steps.size());
      std::vector<AllocatorValue> ranges;
      for (size_t e = 0; e < at_cut.size(); ++e) {
        const size_t v = value_of_entry[e];
        const int32_t last = v == kNotStashed ? end : std::max(cut, parts.liveness.values[v].last_op);
        ranges.push_back({at_cut[e].bytes, 0, last});
      }
      for (const auto& [copy, taken] : parts.copies) {
        add_entry(copy, kNotStashed);
        ranges.push_back({plan.buffers[static_cast<size_t>(copy)].bytes, taken, end});
      }
      for (size_t v = 0; v < liveness.values.size(); ++v) {
        if (entry_of_value[v] != kNotStashed || !parts.in_input[v] || !parts.in_weight[v]) continue;
        entry_of_value[v] = stash.entries.size();
        add_entry(liveness.values[v].buffer, v);
        const PlanValue& range = parts.liveness.values[v];
        ranges.push_back(
            {plan.buffers[static_cast<size_t>(range.buffer)].bytes, range.first_op, range.last_op});
      }
      const size_t forward_bytes = slot.extent;
      slot = allocate(ranges);
      stash.weight_bytes = std::max(stash.weight_bytes, slot.extent - forward_bytes);
    }
    for (size_t e = first_entry; e < stash.entries.size(); ++e)
      stash.entries[e].offset = slot.offsets[e - first_entry];
    stash.slot_bytes = std::max(stash.slot_bytes, slot.extent);
    cuts.push_back(std::move(of_chunk));
  }
  stash.slots = slots;
  stash.offset = plan.persistent_bytes;
  for (size_t k = 0; k < cuts.size(); ++k) {
    const Cut& of_chunk = cuts[k];
    const auto chunk = static_cast<int64_t>(k);
    const Liveness& liveness = of_chunk.liveness;
    const std::vector<PlanStep>& steps = of_chunk.fused.steps;
    const size_t backward_begin = of_chunk.fused.backward_begin;
    const auto cut = static_cast<int32_t>(backward_begin);
    // The forward and the whole backward read the forward's stash (what crosses the cut), the backward's
    // parts also what crosses from one to the other.
    std::vector<size_t> stash_of_value(liveness.values.size(), kNotStashed);
    for (size_t v = 0; v < liveness.values.size(); ++v) {
      if (of_chunk.entry_of_value[v] != kNotStashed)
        stash_of_value[v] = stash.offset + stash.entries[of_chunk.entry_of_value[v]].offset;
    }
    std::vector<size_t> forward_stash_of_value = stash_of_value;
    for (size_t v = 0; v < liveness.values.size(); ++v) {
      const PlanValue& value = liveness.values[v];
      if (value.first_op >= cut || value.last_op < cut) forward_stash_of_value[v] = kNotStashed;
    }
    plan.kernels.push_back(place_kernel(plan, KernelName::forward, steps, 0, backward_begin, liveness,
                                        stash.end(), &forward_stash_of_value, chunk));
    if (whole_backward) {
      plan.kernels.push_back(place_kernel(plan, KernelName::backward, steps, backward_begin, steps.size(),
                                          liveness, stash.end(), &forward_stash_of_value, chunk));
    }
    if (const std::optional<BackwardParts>& parts = of_chunk.parts) {
      for (size_t v = 0; v < liveness.values.size(); ++v) {
        MT_CHECK(stash_of_value[v] != kNotStashed || !(parts->in_input[v] && parts->in_weight[v]),
                 "a value both backward parts touch, in the activation slot");
      }
      plan.kernels.push_back(place_kernel(plan, KernelName::backward_input, parts->steps, backward_begin,
                                          parts->input_end, parts->liveness, stash.end(), &stash_of_value,
                                          chunk));
      plan.kernels.push_back(place_kernel(plan, KernelName::backward_weight, parts->steps, parts->input_end,
                                          parts->steps.size(), parts->liveness, stash.end(), &stash_of_value,
                                          chunk));
    }
  }
}

// A stage plan's eval, per chunk: its forward (and on the head's chunk the loss) on one micro-batch whose
// boundary buffers are in activation slot 0, its temporaries above the slots (it runs between steps, when
// no micro-batch is in flight).
void plan_stage_eval(TrainingPlan& plan) {
  for (size_t k = 0; k < plan.spec.chunks.size(); ++k) {
    const auto chunk = static_cast<int64_t>(k);
    const std::vector<PlanStep> steps = kernel_steps(plan, KernelName::eval, chunk).steps;
    const Liveness liveness = plan_liveness(plan, steps, KernelName::eval);
    const std::vector<size_t> none(liveness.values.size(), kNotStashed);
    plan.kernels.push_back(place_kernel(plan, KernelName::eval, steps, 0, steps.size(), liveness,
                                        plan.stash.end(), &none, chunk));
  }
}

}  // namespace

const char* kernel_name(KernelName kernel) {
  switch (kernel) {
    case KernelName::fwd_bwd:
      return "fwd_bwd";
    case KernelName::fwd_bwd_accum:
      return "fwd_bwd_accum";
    case KernelName::update:
      return "update";
    case KernelName::eval:
      return "eval";
    case KernelName::decode:
      return "decode";
    case KernelName::zero_gradients:
      return "zero_gradients";
    case KernelName::forward:
      return "forward";
    case KernelName::backward:
      return "backward";
    case KernelName::backward_input:
      return "backward_input";
    case KernelName::backward_weight:
      return "backward_weight";
  }
  return "?";
}

bool runs_over_a_slot(KernelName kernel) {
  return kernel == KernelName::forward || kernel == KernelName::backward ||
         kernel == KernelName::backward_input || kernel == KernelName::backward_weight;
}

KernelName parse_kernel_name(const std::string& name, const std::string& where) {
  for (KernelName kernel : kKernelNames) {
    if (name == kernel_name(kernel)) return kernel;
  }
  fail(where, "kernel names among fwd_bwd, fwd_bwd_accum, update, eval", "'" + name + "'",
       "did you mean '" + closest_name(name, {"fwd_bwd", "fwd_bwd_accum", "update", "eval"}) + "'?");
}

PlanBufferId PipelineStage::buffer_of(ProgramEntry::Transfer transfer, int64_t chunk) const {
  using Transfer = ProgramEntry::Transfer;
  const ChunkTransfers& buffers = chunks.at(static_cast<size_t>(chunk));
  switch (transfer) {
    case Transfer::send_activation:
      return buffers.output;
    case Transfer::receive_activation:
      return buffers.input;
    case Transfer::send_gradient:
      return buffers.input_gradient;
    case Transfer::receive_gradient:
      return buffers.output_gradient;
    case Transfer::none:
      break;
  }
  return -1;
}

double step_transfer_bytes(const TrainingPlan& plan) {
  double bytes = 0.0;
  for (const std::vector<ProgramEntry>* phase : {&plan.program.gradients, &plan.program.update}) {
    for (const ProgramEntry& entry : *phase) {
      if (entry.transfer == ProgramEntry::Transfer::send_activation ||
          entry.transfer == ProgramEntry::Transfer::send_gradient) {
        const PlanBufferId buffer = plan.pipeline.buffer_of(entry.transfer, entry.chunk);
        bytes += static_cast<double>(plan.buffers[static_cast<size_t>(buffer)].bytes);
      }
    }
  }
  return bytes;
}

std::map<std::string, double> step_collective_bytes(const TrainingPlan& plan) {
  std::map<std::pair<KernelName, int64_t>, double> entries;  // (kernel, chunk): a chunk's kernels are its own
  for (const std::vector<ProgramEntry>* phase : {&plan.program.gradients, &plan.program.update}) {
    for (const ProgramEntry& entry : *phase) {
      if (entry.transfer == ProgramEntry::Transfer::none) entries[{entry.kernel, entry.chunk}] += 1.0;
    }
  }
  const double transfer_bytes = step_transfer_bytes(plan);
  std::map<std::string, double> bytes;
  for (const KernelPlan& kernel : plan.kernels) {
    const double repeats = entries[{kernel.kernel, kernel.chunk}];
    for (const auto& [axis, axis_bytes] : kernel.collective_bytes) {
      if (repeats > 0.0) bytes[axis] += repeats * axis_bytes;
    }
  }
  if (transfer_bytes > 0.0) bytes["stage"] += transfer_bytes;
  return bytes;
}

const KernelPlan* TrainingPlan::find(KernelName name, int64_t chunk) const {
  for (const KernelPlan& plan : kernels) {
    if (plan.kernel == name && plan.chunk == chunk) return &plan;
  }
  return nullptr;
}

const KernelPlan& TrainingPlan::kernel(KernelName name, int64_t chunk) const {
  const KernelPlan* found = find(name, chunk);
  if (!found)
    fail("config key 'kernels'", std::string("a plan that includes ") + kernel_name(name), "not planned");
  return *found;
}

int64_t kv_replicas(const TrainingPlan& plan, BufferId id) {
  const Shape& shape = plan.spec.buffer(id).shape;
  const int64_t kv_heads = plan.spec.config.base_num_kv_heads;
  for (const std::string& axis : shape.axes) {
    if (axis == "kv_heads" && plan.mesh.size(MeshAxis::tensor) > kv_heads)
      return plan.mesh.size(MeshAxis::tensor) / kv_heads;
  }
  return 1;
}

std::vector<int64_t> global_dims(const TrainingPlan& plan, const Shape& local) {
  std::vector<int64_t> dims;
  for (size_t i = 0; i < local.dims.size(); ++i) {
    const std::string& axis = local.axes[i];
    if (axis == "kv_heads") {
      dims.push_back(plan.spec.config.base_num_kv_heads);
    } else if (axis == "vocab") {
      dims.push_back(plan.spec.dims.V_padded);
    } else {
      dims.push_back(local.dims[i] * plan.spec.sharding.compute(axis).degree);
    }
  }
  return dims;
}

DeviceCount resolve_devices(const Config& config, const Topology& topology, int64_t live_ranks,
                            const std::string& launcher) {
  if (live_ranks > 0) {
    return {live_ranks, std::to_string(live_ranks) + " process" + (live_ranks > 1 ? "es" : "") +
                            (launcher.empty() ? "" : " started by " + launcher)};
  }
  if (topology.num_devices > 0) return {topology.num_devices, "topology " + topology.name};
  DeviceCount devices{1, "topology " + topology.name + " with as many ranks as the mesh asks for"};
  for (MeshAxis axis : kMeshAxes) {
    const int64_t size = config.mesh[axis];
    if (size < 1) {
      fail("config key 'mesh." + std::string(mesh_axis_name(axis)) + "'",
           "fixed axis sizes on topology '" + topology.name + "' (they give its rank count)",
           std::to_string(size),
           "give every mesh.* axis, or choose a topology with a device count such as h100x8");
    }
    devices.count *= size;
  }
  return devices;
}

int64_t resolve_threads(const Config& config, const Topology& topology, int64_t devices, int64_t given) {
  if (config.num_threads > 0) return config.num_threads;
  if (topology.device_kind != "cpu") return 1;
  if (given > 0) return given;
  const int64_t ranks_on_host = topology.host_memory_shared ? std::max<int64_t>(devices, 1) : 1;
  return std::max<int64_t>(1, omp_get_num_procs() / ranks_on_host);
}

PlanTarget resolve_plan_target(const PlanRequest& request) {
  const Config& config = request.config;
  PlanTarget target;
  const std::string topology_name = request.topology.empty() ? config.topology : request.topology;
  target.topology = load_topology(topology_name, config.topologies_path);
  const DeviceCount devices =
      resolve_devices(config, target.topology, request.devices, request.devices_launcher);
  target.mesh = resolve_mesh(config.mesh, devices.count, devices.source);
  return target;
}

TrainingPlan plan_training(const PlanRequest& request) {
  TrainingPlan plan;
  Config config = request.config;
  PlanTarget target = resolve_plan_target(request);
  plan.topology = std::move(target.topology);
  plan.mesh = target.mesh;
  const int64_t devices = plan.mesh.devices();
  plan.threads = resolve_threads(config, plan.topology, devices, request.threads);
  config.num_threads = plan.threads;  // the attention backward's scratch is per thread
  plan.identity = plan_identity(config, plan.mesh, plan.topology, plan.threads);
  plan.device_memory_bytes = plan.topology.device_memory_bytes(devices);
  const bool decoding = request.decode_cache_length > 0;
  const kernels::KernelBackend& backend = request.backend != nullptr
                                              ? *request.backend
                                              : kernels::kernel_backend_for_device(plan.topology.device_kind);
  if (!decoding && plan.mesh.size(MeshAxis::context) > 1) {
    // The run cuts every row over context with this layout: a length it cannot split is refused here,
    // on every rank alike and before anything is allocated (throws MeshError naming the keys).
    [[maybe_unused]] const ContextLayout layout(effective_context_reorder(config), config.max_target_length,
                                                plan.mesh.size(MeshAxis::context));
  }
  // The config's rules that depend on the mesh, now that it is resolved (load_config checked the requested).
  validate_attention_and_moe_keys(config, plan.mesh.size(MeshAxis::expert));
  // Newton-Schulz orthogonalises whole matrices: the plan gathers a sharded one's tensor parts, which
  // repeat where several tensor ranks hold the same kv heads.
  if (config.opt_type == OptimizerType::muon && plan.mesh.size(MeshAxis::tensor) > config.base_num_kv_heads) {
    fail("config key 'opt_type'",
         "adamw when mesh.tensor exceeds base_num_kv_heads (Muon gathers each key / value matrix from the "
         "tensor ranks, and replicated kv heads would repeat in it)",
         "muon on mesh " + plan.mesh.to_string() +
             " with base_num_kv_heads=" + std::to_string(config.base_num_kv_heads),
         "set mesh.tensor to at most base_num_kv_heads, or set opt_type=adamw");
  }
  // The placement's rules hold for every mesh (a one-stage mesh: one rank holds every chunk), checked on
  // every rank alike before anything is allocated, as are the schedule's.
  const PipelinePlacement placement = pipeline_placement(config, plan.mesh.size(MeshAxis::stage));
  std::vector<LayerChunk> chunks = {LayerChunk{}};
  if (placement.stages > 1) {
    chunks.clear();
    PipelineStage& stage = plan.pipeline;
    stage.stages = placement.stages;
    stage.stage = request.stage;
    MT_CHECK(stage.stage >= 0 && stage.stage < stage.stages, "a stage rank of the mesh");
    stage.schedule = build_pipeline_schedule(config.pipeline_schedule, placement.stages,
                                             config.gradient_accumulation_steps, placement.repeats);
    if (decoding) {
      fail("config key 'mesh.stage'", "1 for sampling (generate runs the whole model on one process)",
           std::to_string(stage.stages), "set mesh.stage=1");
    }
    for (int64_t c : placement.chunks_of(stage.stage))
      chunks.push_back(placement.chunks[static_cast<size_t>(c)]);
    if (chunks.size() > 1 && config.scan_layers) {
      fail("config key 'scan_layers'",
           "false with num_pipeline_repeats > 1 (a stage rank's chunks are not contiguous layers, so they "
           "cannot be one stack of a scan group)",
           "true (num_pipeline_repeats " + std::to_string(placement.repeats) + ")",
           "set scan_layers=false, or num_pipeline_repeats=1 (a checkpoint of either layout loads in the "
           "other)");
    }
    plan.identity.keys.emplace_back("pipeline_stage", std::to_string(stage.stage));
    plan.identity.hash = plan_identity_hash(plan.identity.keys);
  }
  plan.spec = decoding ? build_decode_spec(config, plan.mesh, request.decode_cache_length, backend)
                       : build_model_spec(config, plan.mesh, backend, chunks);
  if (!decoding) plan.optimizer = apply_optimizer(plan.spec, config);
  plan_storage(plan);
  const bool requested_update =
      std::find(request.kernels.begin(), request.kernels.end(), KernelName::update) != request.kernels.end();
  const bool requested_eval =
      std::find(request.kernels.begin(), request.kernels.end(), KernelName::eval) != request.kernels.end();
  if (decoding) {
    plan.kernels.push_back(plan_kernel(plan, KernelName::decode));
  } else if (plan.pipeline.stages > 1) {
    // A stage runs its schedule's split kernels only; their slots are as many as its program holds at once.
    const StageProgram stage_program = plan_stage_program(plan.pipeline.schedule, plan.pipeline.stage);
    plan_pipeline_boundary(plan);
    // zero_bubble runs each backward as its two parts (B_input, W), the other schedules whole.
    const bool zero_bubble = plan.pipeline.schedule.kind == PipelineScheduleKind::zero_bubble;
    plan_split_kernels(plan, stage_program.slots, !zero_bubble, zero_bubble);
    if (requested_update) plan.kernels.push_back(plan_kernel(plan, KernelName::update));
    if (requested_eval) plan_stage_eval(plan);
    plan.program = stage_program.program;
  } else {
    for (KernelName kernel : kKernelNames) {
      if (std::find(request.kernels.begin(), request.kernels.end(), kernel) != request.kernels.end()) {
        plan.kernels.push_back(plan_kernel(plan, kernel));
      }
    }
    // After the requested kernels, so their plans (buffer ids included) are the same with or without.
    if (request.activation_slots > 0)
      plan_split_kernels(plan, request.activation_slots, true, request.split_backward);
  }
  size_t largest_temps = 0;
  for (const KernelPlan& kernel : plan.kernels) largest_temps = std::max(largest_temps, kernel.memory.temps);
  plan.arena_bytes = plan.persistent_bytes + largest_temps;
  plan.overlap = plan_overlap(plan);
  if (!decoding && plan.pipeline.stages == 1)
    plan.program = plan_step_program(config.gradient_accumulation_steps);
  return plan;
}

}  // namespace meshtrain
