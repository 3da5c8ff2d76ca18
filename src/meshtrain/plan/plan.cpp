// The planner as a pipeline of passes: the optimizer's over a training spec (optim/optimizer.h), then
// (passes.h) storage, per kernel its op order (remat, FSDP, reductions and update), liveness, the allocator
// and cost; then the overlap schedule and the step's program (program.h).
#include "meshtrain/plan/plan.h"

#include <omp.h>

#include <algorithm>

#include "meshtrain/core/error.h"
#include "meshtrain/data/context_reorder.h"
#include "meshtrain/model/pipeline_placement.h"
#include "meshtrain/plan/allocator.h"
#include "meshtrain/plan/passes.h"
#include "meshtrain/plan/pipeline_schedule.h"

namespace meshtrain {
namespace {

// The op order of one kernel, before liveness, and where its second phase (the backward, or eval's loss)
// begins.
struct KernelSteps {
  std::vector<PlanStep> steps;
  size_t backward_begin = 0;
};

KernelSteps kernel_steps(TrainingPlan& plan, KernelName kernel) {
  if (kernel == KernelName::update) return {update_steps(plan), 0};
  if (kernel == KernelName::zero_gradients) return {{step_of(add_zero_gradients_op(plan))}, 0};
  const ModelSpec& spec = plan.spec;
  std::vector<std::vector<const OpDecl*>> phases(2);
  std::vector<std::vector<bool>> recompute(2);
  for (const OpDecl& op : spec.forward) {
    phases[0].push_back(&op);
    recompute[0].push_back(false);
  }
  // A decode spec's forward ends with its logits: decode is its forward alone (no loss ops exist).
  if (kernel == KernelName::eval || kernel == KernelName::decode) {
    for (const OpDecl& op : spec.loss_forward) {
      phases[1].push_back(&op);
      recompute[1].push_back(false);
    }
  } else {
    for (const PlanStep& step : backward_with_recompute(spec)) {
      phases[1].push_back(step.op);
      recompute[1].push_back(step.recompute);
    }
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

constexpr size_t kNotStashed = SIZE_MAX;

// The plan of the kernel made of steps [begin, end) of `steps`, whose live ranges `liveness` gives: every
// binding's arena offset, and the temporaries placed from `temporaries_begin` up. `stash_of_value` (the split
// kernels; empty otherwise): per value of `liveness`, its arena offset in the stash's slot 0, or
// kNotStashed; a stashed value is no temporary of the kernel, nor is a batch input the stash holds.
KernelPlan place_kernel(TrainingPlan& plan, KernelName kernel, const std::vector<PlanStep>& steps,
                        size_t begin, size_t end, const Liveness& liveness, size_t temporaries_begin,
                        const std::vector<size_t>& stash_of_value = {}) {
  KernelPlan result;
  result.kernel = kernel;
  const auto stashed = [&](size_t value) {
    return !stash_of_value.empty() && stash_of_value[value] != kNotStashed;
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
        const ActivationStash::Entry* input = stash_of_value.empty() ? nullptr : plan.stash.find(id);
        op.offsets.push_back(input ? plan.stash.offset + input->offset
                                   : plan.buffers[static_cast<size_t>(id)].offset);
      } else {
        op.offsets.push_back(stashed(value) ? stash_of_value[value]
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

// The split kernels over `slots` activation slots (ActivationStash): zero_gradients, then fwd_bwd_accum's
// steps cut where its backward begins, so forward then backward run exactly fwd_bwd_accum's ops in its order
// (and zero_gradients then both, fwd_bwd's). Their live ranges are fwd_bwd_accum's: a value written before
// the cut and read after it is one the backward needs from the forward, whatever the remat policy kept.
void plan_split_kernels(TrainingPlan& plan, int64_t slots) {
  plan.kernels.push_back(plan_kernel(plan, KernelName::zero_gradients));
  const KernelSteps fused = kernel_steps(plan, KernelName::fwd_bwd_accum);
  const std::vector<PlanStep>& steps = fused.steps;
  const auto cut = static_cast<int32_t>(fused.backward_begin);
  const Liveness liveness = plan_liveness(plan, steps, KernelName::fwd_bwd_accum);
  ActivationStash& stash = plan.stash;
  std::vector<size_t> entry_of_value(liveness.values.size(), kNotStashed);
  for (size_t v = 0; v < liveness.values.size(); ++v) {
    const PlanValue& value = liveness.values[v];
    if (value.first_op < cut && value.last_op >= cut) {
      entry_of_value[v] = stash.entries.size();
      stash.entries.push_back({value.buffer, 0});
    }
  }
  // The batch is loaded once, before its forward: the backward reads the slot's copy of what it reads. The
  // forward writes no other persistent buffer but gradients (added into, never read back by a backward), so
  // nothing else a backward reads can have changed since its own forward.
  for (size_t i = 0; i < steps.size(); ++i) {
    for (size_t b = 0; b < steps[i].buffers.size(); ++b) {
      const PlanBufferId id = steps[i].buffers[b].second;
      const PlanBuffer& buffer = plan.buffers[static_cast<size_t>(id)];
      if (liveness.value_of_step[i][b] != Liveness::kPersistent) continue;
      MT_CHECK(static_cast<int32_t>(i) >= cut || buffer.kind == BufferKind::input ||
                   buffer.kind == BufferKind::gradient ||
                   !contains(steps[i].op->writes, steps[i].buffers[b].first),
               "forward op '" + steps[i].op->name + "' writes persistent '" + buffer.name +
                   "', which a micro-batch's backward would read after another's forward");
      if (static_cast<int32_t>(i) >= cut && buffer.kind == BufferKind::input && !stash.find(id))
        stash.entries.push_back({id, 0});
    }
  }
  // All of them are live at the cut: the allocator packs them into one slot.
  std::vector<AllocatorValue> at_cut;
  for (const ActivationStash::Entry& entry : stash.entries)
    at_cut.push_back({plan.buffers[static_cast<size_t>(entry.buffer)].bytes, cut, cut});
  const Allocation slot = allocate(at_cut);
  for (size_t e = 0; e < stash.entries.size(); ++e) stash.entries[e].offset = slot.offsets[e];
  stash.slots = slots;
  stash.slot_bytes = slot.extent;
  stash.offset = plan.persistent_bytes;
  std::vector<size_t> stash_of_value(liveness.values.size(), kNotStashed);
  for (size_t v = 0; v < liveness.values.size(); ++v) {
    if (entry_of_value[v] != kNotStashed)
      stash_of_value[v] = stash.offset + stash.entries[entry_of_value[v]].offset;
  }
  plan.kernels.push_back(place_kernel(plan, KernelName::forward, steps, 0, fused.backward_begin, liveness,
                                      stash.end(), stash_of_value));
  plan.kernels.push_back(place_kernel(plan, KernelName::backward, steps, fused.backward_begin, steps.size(),
                                      liveness, stash.end(), stash_of_value));
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
  }
  return "?";
}

KernelName parse_kernel_name(const std::string& name, const std::string& where) {
  for (KernelName kernel : kKernelNames) {
    if (name == kernel_name(kernel)) return kernel;
  }
  fail(where, "kernel names among fwd_bwd, fwd_bwd_accum, update, eval", "'" + name + "'",
       "did you mean '" + closest_name(name, {"fwd_bwd", "fwd_bwd_accum", "update", "eval"}) + "'?");
}

const KernelPlan* TrainingPlan::find(KernelName name) const {
  for (const KernelPlan& plan : kernels) {
    if (plan.kernel == name) return &plan;
  }
  return nullptr;
}

const KernelPlan& TrainingPlan::kernel(KernelName name) const {
  const KernelPlan* found = find(name);
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

DeviceCount resolve_devices(const Config& config, const Topology& topology, int64_t live_ranks) {
  if (live_ranks > 0)
    return {live_ranks, std::to_string(live_ranks) + " process" + (live_ranks > 1 ? "es" : "")};
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

int64_t resolve_threads(const Config& config, const Topology& topology, int64_t devices) {
  if (config.num_threads > 0) return config.num_threads;
  if (topology.device_kind != "cpu") return 1;
  const int64_t ranks_on_host = topology.host_memory_shared ? std::max<int64_t>(devices, 1) : 1;
  return std::max<int64_t>(1, omp_get_num_procs() / ranks_on_host);
}

PlanTarget resolve_plan_target(const PlanRequest& request) {
  const Config& config = request.config;
  PlanTarget target;
  const std::string topology_name = request.topology.empty() ? config.topology : request.topology;
  target.topology = load_topology(topology_name, config.topologies_path);
  const DeviceCount devices = resolve_devices(config, target.topology, request.devices);
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
  plan.threads = resolve_threads(config, plan.topology, devices);
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
  plan.spec = decoding ? build_decode_spec(config, plan.mesh, request.decode_cache_length, backend)
                       : build_model_spec(config, plan.mesh, backend);
  // The placement's rules hold for every mesh (a one-stage mesh: one rank holds every chunk). A mesh with
  // stages is refused once they, the schedule's and the model's own (the spec's) pass: on every rank alike,
  // before anything is allocated.
  const PipelinePlacement placement = pipeline_placement(config, plan.mesh.size(MeshAxis::stage));
  if (placement.stages > 1) {
    // The schedule's own rules (micro-batches against stages, the chunks a rank each schedule takes).
    build_pipeline_schedule(config.pipeline_schedule, placement.stages, config.gradient_accumulation_steps,
                            placement.repeats);
    fail("config key 'mesh.stage'",
         "1: pipeline execution is not built in this version (per-stage plans, the schedule's ops and the "
         "executor come with it; the layer placement is checked, and meshtrain compile prints it)",
         std::to_string(placement.stages), "set mesh.stage=1");
  }
  if (!decoding) plan.optimizer = apply_optimizer(plan.spec, config);
  plan_storage(plan);
  if (decoding) {
    plan.kernels.push_back(plan_kernel(plan, KernelName::decode));
  } else {
    for (KernelName kernel : kKernelNames) {
      if (std::find(request.kernels.begin(), request.kernels.end(), kernel) != request.kernels.end()) {
        plan.kernels.push_back(plan_kernel(plan, kernel));
      }
    }
    // After the requested kernels, so their plans (buffer ids included) are the same with or without.
    if (request.activation_slots > 0) plan_split_kernels(plan, request.activation_slots);
  }
  size_t largest_temps = 0;
  for (const KernelPlan& kernel : plan.kernels) largest_temps = std::max(largest_temps, kernel.memory.temps);
  plan.arena_bytes = plan.persistent_bytes + largest_temps;
  plan.overlap = plan_overlap(plan);
  if (!decoding) plan.program = plan_step_program(config.gradient_accumulation_steps);
  return plan;
}

}  // namespace meshtrain
