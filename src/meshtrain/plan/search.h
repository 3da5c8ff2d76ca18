// The ahead-of-time search of `meshtrain compile --search`: every mesh (pipeline stages and context
// included), pipeline schedule, micro-batch split and remat policy for the config's topology and global
// batch, each planned, the ones that fit ranked by predicted step time (with stages: the bubble included).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "meshtrain/config/config.h"
#include "meshtrain/mesh/sharding.h"

namespace meshtrain {

// One point of the search space: the config values a candidate sets.
struct SearchCandidate {
  Mesh mesh;
  int64_t per_device_batch_size = 0, gradient_accumulation_steps = 0;
  RematPolicy remat_policy = RematPolicy::none;
  // Under mesh.stage > 1: the schedule, and its chunks a rank (num_pipeline_repeats: 2 for interleaved_1f1b,
  // else 1); otherwise unused.
  PipelineScheduleKind pipeline_schedule = PipelineScheduleKind::one_f_one_b;
  int64_t pipeline_repeats = 1;

  bool pipelined() const { return mesh.size(MeshAxis::stage) > 1; }
  // Sets these values in `config` (the typed fields and their resolved text, as overrides would).
  void apply_to(Config& config) const;
  // The overrides that reproduce it: "mesh.data=2 mesh.fsdp=4 ... remat_policy=full" (and
  // "pipeline_schedule=gpipe" under stages, with "num_pipeline_repeats=2" for interleaved_1f1b).
  std::string overrides() const;
};

// The stage degrees the search tries: 1, and the divisors of `devices` from 2 up to the layer count (one
// chunk of at least one layer a stage rank).
std::vector<int64_t> search_stage_degrees(const Config& base, int64_t devices);

// The context degrees the search tries: the divisors of the device count over which the config's reorder
// can cut max_target_length (ContextLayout's rule: dual_chunk_swap a multiple of 2C, striped and the plain
// split a multiple of C; C = 1 always). The others are skipped, not planned.
struct ContextDegrees {
  std::vector<int64_t> searched;  // ascending, starting at 1
  std::vector<int64_t> skipped;   // ascending
  std::string first_skip_reason;  // ContextLayout's message for skipped.front() ("" when none)
  int64_t sequence_length = 0;    // max_target_length
  // The keys that chose the reorder: "context_parallel_reorder=striped",
  // "context_parallel_load_balance=false".
  std::string reorder_setting;
};
ContextDegrees search_context_degrees(const Config& base, int64_t devices);

// A candidate that fits, with the figures it is ranked by.
struct FittingCandidate {
  SearchCandidate candidate;
  size_t arena_bytes = 0;
  // fwd_bwd + (gradient_accumulation_steps - 1) x fwd_bwd_accum + update, predicted; with stages the
  // pipeline step's (plan/pipeline_step.h: the schedule's span over the stages' predicted forward and
  // backward times, bubble included, + the slowest update). The arena is then the largest stage's.
  double step_seconds = 0.0;
};

struct SearchResult {
  std::string topology;
  int64_t devices = 0, global_batch = 0;  // global batch in sequences per optimizer step
  std::vector<int64_t> stages;            // mesh.stage values searched
  int64_t layers = 0;                     // base_num_decoder_layers: the most stages
  ContextDegrees contexts;                // mesh.context values searched and skipped
  int64_t tensor_limit = 1;  // tensor degrees searched: <= devices per host, dividing query heads
  int64_t query_heads = 0;
  double device_memory_bytes = 0.0;  // the topology's, per device
  double memory_budget_bytes = 0.0;  // the user's per-device budget (--memory-budget); 0: none
  // What a candidate's arena must not exceed: the budget where one is given, else the device's memory.
  double memory_limit_bytes() const {
    return memory_budget_bytes > 0.0 ? memory_budget_bytes : device_memory_bytes;
  }
  int64_t planned = 0;                    // candidates handed to plan_training
  int64_t invalid = 0;                    // rejected by it (mesh, sharding or model checks)
  std::string first_invalid_reason;       // the first rejection's message
  std::vector<FittingCandidate> fitting;  // fastest first; ties: smaller arena, then enumeration order
  size_t smallest_arena_bytes = 0;        // over the valid candidates, fitting or not (0 when none)
  double wall_seconds = 0.0;
};

// The candidates for `base` on `devices` devices: the config's expert degree (mesh.expert; none when it
// does not divide the devices), stage each of search_stage_degrees (outermost, 1 first), context each of
// search_context_degrees of what is left (1 first), tensor <= tensor_limit and dividing the query heads,
// data x fsdp the rest, every per_device_batch_size x gradient_accumulation_steps split of the config's
// sequences per device, remat_policy none, minimal, full, and under stages pipeline_schedule gpipe, and 1f1b
// where gradient_accumulation_steps >= the stages (its rule); in enumeration order.
std::vector<SearchCandidate> search_candidates(const Config& base, int64_t devices, int64_t tensor_limit);

// Plans every candidate (fwd_bwd, fwd_bwd_accum, update; under stages every stage's split kernels and
// update) applied to `base`, in parallel, and ranks those
// that fit its topology: whose arena is within the device's memory, or within `memory_budget_bytes` per
// device when that is > 0 (a budget above the device's memory is an error naming both).
SearchResult search_training_configurations(const Config& base, double memory_budget_bytes = 0.0);

}  // namespace meshtrain
