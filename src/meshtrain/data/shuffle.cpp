// EpochShuffle: the Fisher-Yates permutation of one epoch, drawn with Philox (shuffle.h).
#include "meshtrain/data/shuffle.h"

#include <algorithm>
#include <numeric>
#include <string>

#include "meshtrain/core/rng.h"

namespace meshtrain {

const std::vector<uint64_t>& EpochShuffle::permutation(uint64_t epoch) {
  if (epoch != cached_epoch_) {
    cached_permutation_.resize(rows_per_epoch_);
    std::iota(cached_permutation_.begin(), cached_permutation_.end(), uint64_t{0});
    const PhiloxKey key = philox_key(seed_, "meshtrain/data-shuffle/epoch=" + std::to_string(epoch));
    for (uint64_t i = rows_per_epoch_; i-- > 1;) {
      // uniform_at has 53 random bits: the bias for any realistic row count is far below noise.
      const auto j = std::min(i, static_cast<uint64_t>(uniform_at(key, i) * static_cast<double>(i + 1)));
      std::swap(cached_permutation_[i], cached_permutation_[j]);
    }
    cached_epoch_ = epoch;
  }
  return cached_permutation_;
}

}  // namespace meshtrain
