// The per-epoch order of a shuffled source's rows, shared by every source that shuffles (token windows, a
// mixture's sources): epoch e visits the R rows in a Fisher-Yates permutation drawn with Philox from
// (seed, e), so the order is a pure function of (seed, R, stream position).
#pragma once

#include <cstdint>
#include <vector>

namespace meshtrain {

class EpochShuffle {
 public:
  EpochShuffle() = default;
  EpochShuffle(uint64_t seed, uint64_t rows_per_epoch) : seed_(seed), rows_per_epoch_(rows_per_epoch) {}

  // Epoch `epoch`'s order: entry i is the row visited i-th. The latest epoch's is kept, so a stream read in
  // order draws each permutation once.
  const std::vector<uint64_t>& permutation(uint64_t epoch);
  // The row at stream position `stream_row`: entry stream_row mod R of epoch stream_row / R's order.
  uint64_t row(uint64_t stream_row) {
    return permutation(stream_row / rows_per_epoch_)[stream_row % rows_per_epoch_];
  }

 private:
  uint64_t seed_ = 0, rows_per_epoch_ = 0;
  uint64_t cached_epoch_ = ~uint64_t{0};
  std::vector<uint64_t> cached_permutation_;  // [R]
};

}  // namespace meshtrain
