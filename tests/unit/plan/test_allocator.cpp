// The standalone allocator: hand-made live ranges, their offsets and the extent.
#include <gtest/gtest.h>

#include "meshtrain/plan/allocator.h"

namespace meshtrain {
namespace {

bool overlap(size_t a, size_t a_bytes, size_t b, size_t b_bytes) {
  return a < b + b_bytes && b < a + a_bytes;
}

TEST(Allocator, DisjointRangesShareMemory) {
  const Allocation allocation = allocate({{256, 0, 1}, {256, 2, 3}, {128, 4, 4}});
  EXPECT_EQ(allocation.offsets, (std::vector<size_t>{0, 0, 0}));
  EXPECT_EQ(allocation.extent, 256u);
}

TEST(Allocator, OverlappingRangesDoNot) {
  // [0,2] and [2,3] overlap at op 2 (ranges are inclusive); [4,5] is free to reuse either.
  const std::vector<AllocatorValue> values = {{128, 0, 2}, {256, 2, 3}, {64, 1, 1}, {192, 4, 5}};
  const Allocation allocation = allocate(values);
  for (size_t a = 0; a < values.size(); ++a) {
    for (size_t b = a + 1; b < values.size(); ++b) {
      const bool live_together =
          values[a].first_use <= values[b].last_use && values[b].first_use <= values[a].last_use;
      if (live_together) {
        EXPECT_FALSE(overlap(allocation.offsets[a], values[a].bytes, allocation.offsets[b], values[b].bytes))
            << a << " and " << b;
      }
    }
  }
  // Largest first: the 256 at 0, the 192 reuses it, the 128 goes after the 256, and the 64 (live with the
  // 128 only) takes the lowest free offset again.
  EXPECT_EQ(allocation.offsets, (std::vector<size_t>{256, 0, 0, 0}));
  EXPECT_EQ(allocation.extent, 384u);
}

TEST(Allocator, OffsetsAndSizesAreAligned) {
  const Allocation allocation = allocate({{1, 0, 3}, {65, 0, 3}, {3, 1, 2}}, 64);
  // 65 bytes take two lines; each 1- and 3-byte value takes one.
  EXPECT_EQ(allocation.offsets, (std::vector<size_t>{128, 0, 192}));
  for (size_t offset : allocation.offsets) EXPECT_EQ(offset % 64, 0u);
  EXPECT_EQ(allocation.extent, 256u);
  EXPECT_EQ(allocate({{100, 0, 0}}, 32).extent, 128u);
}

TEST(Allocator, ExtentIsTheLargestEnd) {
  const std::vector<AllocatorValue> values = {{640, 0, 9}, {64, 0, 4}, {320, 5, 9}, {64, 3, 6}};
  const Allocation allocation = allocate(values);
  size_t largest_end = 0;
  for (size_t v = 0; v < values.size(); ++v)
    largest_end = std::max(largest_end, allocation.offsets[v] + align_up(values[v].bytes));
  EXPECT_EQ(allocation.extent, largest_end);
  EXPECT_EQ(allocation.extent, 640u + 320u + 64u);
  EXPECT_EQ(allocate({}).extent, 0u);
}

}  // namespace
}  // namespace meshtrain
