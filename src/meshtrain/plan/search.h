// The ahead-of-time search of `meshtrain compile --search`: every mesh (context included), micro-batch split
// and remat policy for the config's topology and global batch, each planned, the ones that fit ranked by
// predicted step time.
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

  // Sets these values in `config` (the typed fields and their resolved text, as overrides would).
  void apply_to(Config& config) const;
  // The overrides that reproduce it: "mesh.data=2 mesh.fsdp=4 ... remat_policy=full".
  std::string overrides() const;
};

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
  // fwd_bwd + (gradient_accumulation_steps - 1) x fwd_bwd_accum + update, predicted.
  double step_seconds = 0.0;
};

struct SearchResult {
  std::string topology;
  int64_t devices = 0, global_batch = 0;  // global batch in sequences per optimizer step
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
// does not divide the devices), context each of search_context_degrees (outermost, 1 first), tensor <=
// tensor_limit and dividing the query heads, data x fsdp the rest, every
// per_device_batch_size x gradient_accumulation_steps split of the config's sequences per device,
// remat_policy none, minimal, full; in enumeration order.
std::vector<SearchCandidate> search_candidates(const Config& base, int64_t devices, int64_t tensor_limit);

// Plans every candidate (fwd_bwd, fwd_bwd_accum, update) applied to `base`, in parallel, and ranks those
// that fit its topology: whose arena is within the device's memory, or within `memory_budget_bytes` per
// device when that is > 0 (a budget above the device's memory is an error naming both).
SearchResult search_training_configurations(const Config& base, double memory_budget_bytes = 0.0);

}  // namespace meshtrain
