// The arena allocator of the plan, standing alone like ggml-alloc's: values with live ranges and sizes in,
// offsets and the extent of the region out. It knows nothing of buffers, ops or kernels.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "meshtrain/core/arena.h"

namespace meshtrain {

// One value to place: `bytes` live over the ops [first_use, last_use] (inclusive).
struct AllocatorValue {
  size_t bytes = 0;
  int32_t first_use = 0, last_use = 0;
};

struct Allocation {
  std::vector<size_t> offsets;  // parallel to the values, from the region's start; multiples of alignment
  size_t extent = 0;            // bytes the region needs: the largest offset + aligned size
};

// Largest values first (ties: the earlier first use), each at the lowest offset free over its whole live
// range; values whose ranges do not overlap may share memory. Sizes are rounded up to `alignment`.
Allocation allocate(const std::vector<AllocatorValue>& values, size_t alignment = kArenaAlignment);

}  // namespace meshtrain
