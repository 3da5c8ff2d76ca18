// The mesh (stages and context included) / schedule / micro-batch / remat search over plan_training and
// plan_pipeline_step (see search.h).
#include "meshtrain/plan/search.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>

#include "meshtrain/core/error.h"
#include "meshtrain/data/context_reorder.h"
#include "meshtrain/plan/pipeline_step.h"
#include "meshtrain/plan/plan.h"
#include "meshtrain/plan/topology.h"

namespace meshtrain {
namespace {

using Clock = std::chrono::steady_clock;

std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> result;
  for (int64_t d = 1; d <= n; ++d) {
    if (n % d == 0) result.push_back(d);
  }
  return result;
}

void set_resolved_text(Config& config, const std::string& key, const std::string& text) {
  for (auto& [name, value] : config.resolved) {
    if (name == key) value = text;
  }
}

// The expert degree every candidate keeps: the config's (mesh.expert; 1 when unset or -1). The other axes are
// searched around it.
int64_t searched_expert_degree(const Config& base) {
  return std::max<int64_t>(1, base.mesh[MeshAxis::expert]);
}

// "11.77 GiB", for errors.
std::string gib_text(double bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f GiB", bytes / (1024.0 * 1024.0 * 1024.0));
  return text;
}

}  // namespace

void SearchCandidate::apply_to(Config& config) const {
  for (MeshAxis axis : kMeshAxes) {
    config.mesh[axis] = mesh.size(axis);
    set_resolved_text(config, std::string("mesh.") + mesh_axis_name(axis), std::to_string(mesh.size(axis)));
  }
  config.per_device_batch_size = per_device_batch_size;
  set_resolved_text(config, "per_device_batch_size", std::to_string(per_device_batch_size));
  config.gradient_accumulation_steps = gradient_accumulation_steps;
  set_resolved_text(config, "gradient_accumulation_steps", std::to_string(gradient_accumulation_steps));
  config.remat_policy = remat_policy;
  set_resolved_text(config, "remat_policy", remat_policy_name(remat_policy));
  if (pipelined()) {
    config.pipeline_schedule = pipeline_schedule;
    set_resolved_text(config, "pipeline_schedule", pipeline_schedule_name(pipeline_schedule));
    config.num_pipeline_repeats = pipeline_repeats;
    set_resolved_text(config, "num_pipeline_repeats", std::to_string(pipeline_repeats));
  }
}

std::string SearchCandidate::overrides() const {
  std::string text;
  for (MeshAxis axis : listed_mesh_axes(mesh)) {
    text += std::string("mesh.") + mesh_axis_name(axis) + "=" + std::to_string(mesh.size(axis)) + " ";
  }
  return text + "per_device_batch_size=" + std::to_string(per_device_batch_size) +
         " gradient_accumulation_steps=" + std::to_string(gradient_accumulation_steps) +
         " remat_policy=" + remat_policy_name(remat_policy) +
         (pipelined() ? std::string(" pipeline_schedule=") + pipeline_schedule_name(pipeline_schedule) : "") +
         (pipelined() && pipeline_repeats > 1 ? " num_pipeline_repeats=" + std::to_string(pipeline_repeats) : "");
}

std::vector<int64_t> search_stage_degrees(const Config& base, int64_t devices) {
  std::vector<int64_t> degrees;
  for (int64_t stage : divisors(devices)) {
    if (stage == 1 || stage <= base.base_num_decoder_layers) degrees.push_back(stage);
  }
  return degrees;
}

ContextDegrees search_context_degrees(const Config& base, int64_t devices) {
  ContextDegrees degrees;
  degrees.sequence_length = base.max_target_length;
  degrees.reorder_setting =
      base.context_parallel_load_balance
          ? std::string("context_parallel_reorder=") + context_reorder_name(base.context_parallel_reorder)
          : "context_parallel_load_balance=false";
  for (int64_t context : divisors(devices)) {
    try {
      [[maybe_unused]] const ContextLayout layout(effective_context_reorder(base), base.max_target_length,
                                                  context);
    } catch (const MeshError& error) {
      if (degrees.skipped.empty()) degrees.first_skip_reason = error.what();
      degrees.skipped.push_back(context);
      continue;
    }
    degrees.searched.push_back(context);
  }
  return degrees;
}

std::vector<SearchCandidate> search_candidates(const Config& base, int64_t devices, int64_t tensor_limit) {
  const int64_t sequences_per_device = base.per_device_batch_size * base.gradient_accumulation_steps;
  std::vector<SearchCandidate> candidates;
  const int64_t expert = searched_expert_degree(base);
  if (devices % expert != 0) return candidates;
  for (int64_t stage : search_stage_degrees(base, devices / expert)) {
    const int64_t left = devices / expert / stage;
    for (int64_t context : search_context_degrees(base, left).searched) {
      for (int64_t tensor : divisors(left / context)) {
        if (tensor > tensor_limit || base.base_num_query_heads % tensor != 0) continue;
        for (int64_t fsdp : divisors(left / context / tensor)) {
          const int64_t data = left / context / tensor / fsdp;
          for (int64_t batch : divisors(sequences_per_device)) {
            const int64_t accumulation = sequences_per_device / batch;
            // Each schedule with its chunks a rank (unused without stages): 1F1B and zero bubble need at
            // least a micro-batch a stage, interleaved (2 chunks a rank) a multiple of the stages and two
            // layers a stage.
            std::vector<std::pair<PipelineScheduleKind, int64_t>> schedules = {{base.pipeline_schedule, 1}};
            if (stage > 1) {
              schedules = {{PipelineScheduleKind::gpipe, 1}};
              if (accumulation >= stage) {
                schedules.push_back({PipelineScheduleKind::one_f_one_b, 1});
                schedules.push_back({PipelineScheduleKind::zero_bubble, 1});
              }
              if (accumulation % stage == 0 && 2 * stage <= base.base_num_decoder_layers)
                schedules.push_back({PipelineScheduleKind::interleaved_one_f_one_b, 2});
            }
            for (RematPolicy remat : kRematPolicies) {
              const Mesh mesh({{MeshAxis::data, data},
                               {MeshAxis::stage, stage},
                               {MeshAxis::fsdp, fsdp},
                               {MeshAxis::context, context},
                               {MeshAxis::expert, expert},
                               {MeshAxis::tensor, tensor}});
              for (const auto& [schedule, repeats] : schedules)
                candidates.push_back({mesh, batch, accumulation, remat, schedule, repeats});
            }
          }
        }
      }
    }
  }
  return candidates;
}

SearchResult search_training_configurations(const Config& base, double memory_budget_bytes) {
  const Clock::time_point start = Clock::now();
  if (!base.plan_out.empty()) {
    fail("config key 'plan_out'", "no plan files with --search (it plans many configurations)",
         "'" + base.plan_out + "'", "run compile again without --search and with the chosen overrides");
  }
  const Topology topology = load_topology(base.topology, base.topologies_path);
  SearchResult result;
  result.topology = topology.name;
  result.devices = resolve_devices(base, topology, 0).count;
  result.device_memory_bytes = topology.device_memory_bytes(result.devices);
  if (memory_budget_bytes > result.device_memory_bytes) {
    fail("meshtrain compile --memory-budget",
         "at most the memory of one device of topology '" + topology.name + "' (" +
             gib_text(result.device_memory_bytes) + " for " + std::to_string(result.devices) + " devices)",
         gib_text(memory_budget_bytes),
         "give a smaller budget, or a topology whose devices have that much memory");
  }
  result.memory_budget_bytes = memory_budget_bytes;
  result.global_batch = base.per_device_batch_size * base.gradient_accumulation_steps * result.devices;
  // Tensor parallelism stays inside a host (its collectives run every layer) and splits the query heads.
  const int64_t tensor_limit = topology.devices_per_host == 0 ? result.devices : topology.devices_per_host;
  result.stages = search_stage_degrees(base, result.devices / searched_expert_degree(base));
  result.layers = base.base_num_decoder_layers;
  result.contexts = search_context_degrees(base, result.devices / searched_expert_degree(base));
  result.tensor_limit = tensor_limit;
  result.query_heads = base.base_num_query_heads;
  const std::vector<SearchCandidate> candidates = search_candidates(base, result.devices, tensor_limit);

  // Candidates are planned in parallel (each plan is independent and deterministic), then gathered in
  // enumeration order so the ranking does not depend on the thread count.
  struct Outcome {
    bool valid = false;
    size_t arena_bytes = 0;
    bool fits = false;
    double step_seconds = 0.0;
    std::string invalid_reason;  // the MeshError's message
    std::exception_ptr error;    // anything but a MeshError: rethrown after the loop
  };
  std::vector<Outcome> outcomes(candidates.size());
  const double memory_limit = result.memory_limit_bytes();
  const auto plan_candidate = [&](const SearchCandidate& candidate, Outcome& outcome) {
    PlanRequest request;
    request.config = base;
    candidate.apply_to(request.config);
    request.kernels = {KernelName::fwd_bwd, KernelName::fwd_bwd_accum, KernelName::update};
    if (candidate.pipelined()) {
      request.kernels = {KernelName::update};  // each stage plans its split kernels and update
      PipelineStepPlan step;
      try {
        step = plan_pipeline_step(request);
      } catch (const MeshError& error) {
        outcome.invalid_reason = error.what();
        return;
      }
      outcome.valid = true;
      outcome.arena_bytes = step.largest_arena_bytes;
      outcome.fits = static_cast<double>(step.largest_arena_bytes) <= memory_limit;
      outcome.step_seconds = step.step_seconds;
      return;
    }
    TrainingPlan plan;
    try {
      plan = plan_training(request);
    } catch (const MeshError& error) {
      outcome.invalid_reason = error.what();  // e.g. kv heads not divisible by the tensor degree
      return;
    }
    outcome.valid = true;
    outcome.arena_bytes = plan.arena_bytes;
    outcome.fits = static_cast<double>(plan.arena_bytes) <= memory_limit;
    outcome.step_seconds = plan.kernel(KernelName::fwd_bwd).seconds +
                           static_cast<double>(candidate.gradient_accumulation_steps - 1) *
                               plan.kernel(KernelName::fwd_bwd_accum).seconds +
                           plan.kernel(KernelName::update).seconds;
  };
  const int64_t candidate_count = static_cast<int64_t>(candidates.size());
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t index = 0; index < candidate_count; ++index) {
    Outcome& outcome = outcomes[static_cast<size_t>(index)];
    try {
      plan_candidate(candidates[static_cast<size_t>(index)], outcome);
    } catch (...) {
      outcome.error = std::current_exception();  // an exception must not leave an OpenMP region
    }
  }
  std::vector<std::pair<FittingCandidate, size_t>> fitting;  // with enumeration index for stable ties
  for (size_t index = 0; index < candidates.size(); ++index) {
    const Outcome& outcome = outcomes[index];
    if (outcome.error) std::rethrow_exception(outcome.error);
    ++result.planned;
    if (!outcome.valid) {
      if (result.invalid++ == 0) result.first_invalid_reason = outcome.invalid_reason;
      continue;
    }
    if (result.smallest_arena_bytes == 0 || outcome.arena_bytes < result.smallest_arena_bytes) {
      result.smallest_arena_bytes = outcome.arena_bytes;
    }
    if (!outcome.fits) continue;
    fitting.emplace_back(FittingCandidate{candidates[index], outcome.arena_bytes, outcome.step_seconds},
                         index);
  }
  std::sort(fitting.begin(), fitting.end(), [](const auto& a, const auto& b) {
    if (a.first.step_seconds != b.first.step_seconds) return a.first.step_seconds < b.first.step_seconds;
    if (a.first.arena_bytes != b.first.arena_bytes) return a.first.arena_bytes < b.first.arena_bytes;
    return a.second < b.second;
  });
  for (const auto& entry : fitting) result.fitting.push_back(entry.first);
  result.wall_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return result;
}

}  // namespace meshtrain
