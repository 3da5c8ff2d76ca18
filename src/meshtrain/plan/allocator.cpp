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
  // The placed values in ascending (offset, end) order, so the ones alive with a value are met in address
  // order while scanning for its gap: O(n^2) without a sort per value (DeepSeek-V3 plans thousands).
  std::vector<size_t> placed;
  const auto end_of = [&](size_t v) { return result.offsets[v] + bytes_of(v); };
  for (size_t v : order) {
    const AllocatorValue& value = values[v];
    size_t offset = 0;
    for (size_t other_index : placed) {
      const AllocatorValue& other = values[other_index];
      if (other.last_use < value.first_use || other.first_use > value.last_use) continue;
      if (result.offsets[other_index] >= offset + bytes_of(v)) break;
      offset = std::max(offset, end_of(other_index));
    }
    result.offsets[v] = offset;
    result.extent = std::max(result.extent, end_of(v));
    const auto at = std::upper_bound(placed.begin(), placed.end(), v, [&](size_t a, size_t b) {
      return std::pair(result.offsets[a], end_of(a)) < std::pair(result.offsets[b], end_of(b));
    });
    placed.insert(at, v);
  }
  return result;
}

}  // namespace meshtrain
