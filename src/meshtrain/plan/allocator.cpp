// Greedy best-fit-by-size placement of live ranges (see allocator.h).
#include "meshtrain/plan/allocator.h"

#include <algorithm>
#include <utility>

namespace meshtrain {

Allocation allocate(const std::vector<AllocatorValue>& values, size_t alignment) {
  Allocation result;
  result.offsets.assign(values.size(), 0);
  std::vector<size_t> order(values.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  const auto bytes_of = [&](size_t v) { return align_up(values[v].bytes, alignment); };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (bytes_of(a) != bytes_of(b)) return bytes_of(a) > bytes_of(b);
    return values[a].first_use < values[b].first_use;
  });
  std::vector<size_t> placed;
  for (size_t v : order) {
    const AllocatorValue& value = values[v];
    std::vector<std::pair<size_t, size_t>> taken;  // [begin, end) of values alive at the same time
    for (size_t other_index : placed) {
      const AllocatorValue& other = values[other_index];
      if (other.last_use < value.first_use || other.first_use > value.last_use) continue;
      taken.emplace_back(result.offsets[other_index], result.offsets[other_index] + bytes_of(other_index));
    }
    std::sort(taken.begin(), taken.end());
    size_t offset = 0;
    for (const auto& [begin, end] : taken) {
      if (begin >= offset + bytes_of(v)) break;
      offset = std::max(offset, end);
    }
    result.offsets[v] = offset;
    result.extent = std::max(result.extent, offset + bytes_of(v));
    placed.push_back(v);
  }
  return result;
}

}  // namespace meshtrain
