// `meshtrain compile <config> [topology=NAME] [mesh.*=N] [kernels=...] [plan_out=STEM] [key=value ...]
// [--explain | --search]`: the ahead-of-time plan (shared/specs/aot-plan.md) on this machine, with no
// accelerator and nothing allocated. Prints per kernel the cost and memory figures and the fit verdict of the
// process arena; --explain breaks memory down by layer and buffer kind; --search ranks the meshes,
// micro-batches and remat policies that fit the topology at the config's global batch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "meshtrain/mesh/sharding.h"

namespace meshtrain {

int run_compile(const std::vector<std::string>& arguments, std::ostream& out);

// One configuration --search planned that fits.
struct SearchCandidate {
  Mesh mesh;
  int64_t per_device_batch_size = 0, gradient_accumulation_steps = 0;
  std::string remat_policy;
  size_t arena_bytes = 0;
  // fwd_bwd + (gradient_accumulation_steps - 1) x fwd_bwd_accum + update, predicted.
  double step_seconds = 0.0;
  // The overrides that reproduce it: "mesh.data=2 mesh.fsdp=4 ... remat_policy=full".
  std::string overrides() const;
};

struct SearchResult {
  std::string topology;
  int64_t devices = 0, global_batch = 0;  // global batch in sequences per optimizer step
  int64_t context = 1;                    // mesh.context, fixed (not searched)
  int64_t tensor_limit = 1;  // tensor degrees searched: <= devices per host, dividing query heads
  int64_t query_heads = 0;
  double device_memory_bytes = 0.0;
  int64_t planned = 0;                   // candidates handed to plan_training
  int64_t invalid = 0;                   // rejected by it (mesh, sharding or model checks)
  std::string first_invalid_reason;      // the first rejection's message
  std::vector<SearchCandidate> fitting;  // fastest first; ties: smaller arena, then enumeration order
  size_t smallest_arena_bytes = 0;       // over the valid candidates, fitting or not (0 when none)
  double wall_seconds = 0.0;
};

// Plans every candidate for the config's topology and global batch (see compile.cpp for the enumeration).
SearchResult search_training_configurations(const std::string& config_argument,
                                            const std::vector<std::string>& overrides);

}  // namespace meshtrain
