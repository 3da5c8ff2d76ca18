// Arena offsets for every buffer of a spec. The minimal planner: each buffer gets its own aligned range
// (no liveness reuse yet); the plan issue extends this with lifetimes, sharding and cost.
#pragma once

#include <cstddef>
#include <vector>

#include "meshtrain/model/spec.h"

namespace meshtrain {

struct ArenaPlan {
  std::vector<size_t> offsets;  // one per buffer, in spec.buffers order
  size_t total_bytes = 0;
  size_t bytes_by_kind(const ModelSpec& spec, BufferKind kind) const;
};

ArenaPlan plan_arena(const ModelSpec& spec);

}  // namespace meshtrain
