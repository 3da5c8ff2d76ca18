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

// The op order of one kernel, before liveness.
std::vector<PlanStep> kernel_steps(TrainingPlan& plan, KernelName kernel) {
  if (kernel == KernelName::update) return update_steps(plan);
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
  std::vector<PlanStep> steps;
  if (kernel == KernelName::fwd_bwd) steps.push_back(step_of(add_zero_gradients_op(plan)));
  for (PlanStep& step : insert_fsdp(plan, phases, recompute,
                                    kernel == KernelName::fwd_bwd || kernel == KernelName::fwd_bwd_accum))
    steps.push_back(std::move(step));
  return steps;
}

KernelPlan plan_kernel(TrainingPlan& plan, KernelName kernel) {
  const std::vector<PlanStep> steps = kernel_steps(plan, kernel);
  KernelPlan result;
  result.kernel = kernel;
  const Liveness liveness = plan_liveness(plan, steps, kernel);
  result.values = liveness.values;
  std::vector<AllocatorValue> live_ranges;
  for (const PlanValue& value : result.values) {
    live_ranges.push_back(
        {plan.buffers[static_cast<size_t>(value.buffer)].bytes, value.first_op, value.last_op});
  }
  const Allocation temporaries = allocate(live_ranges);
  for (size_t v = 0; v < result.values.size(); ++v)
    result.values[v].offset = plan.persistent_bytes + temporaries.offsets[v];
  // Each op with the arena offset behind every binding.
  for (size_t i = 0; i < steps.size(); ++i) {
    const PlanStep& step = steps[i];
    PlanOp op{step.op, step.recompute, 0.0, 0.0, 0.0, 0.0, step_share(plan, step), step.buffers, {}};
    for (size_t b = 0; b < step.buffers.size(); ++b) {
      const size_t value = liveness.value_of_step[i][b];
      op.offsets.push_back(value == Liveness::kPersistent
                               ? plan.buffers[static_cast<size_t>(step.buffers[b].second)].offset
                               : result.values[value].offset);
    }
    result.ops.push_back(std::move(op));
  }
  cost_kernel(plan, result);
  result.memory = memory_figures(plan, result, temporaries.extent);
  return result;
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
  }
  size_t largest_temps = 0;
  for (const KernelPlan& kernel : plan.kernels) largest_temps = std::max(largest_temps, kernel.memory.temps);
  plan.arena_bytes = plan.persistent_bytes + largest_temps;
  plan.overlap = plan_overlap(plan);
  if (!decoding) plan.program = plan_step_program(config.gradient_accumulation_steps);
  return plan;
}

}  // namespace meshtrain
