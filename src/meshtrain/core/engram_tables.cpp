#include "meshtrain/core/engram_tables.h"

#include <set>

#include "meshtrain/core/error.h"

namespace meshtrain {

bool is_prime(int64_t n) {
  if (n < 2) return false;
  if (n % 2 == 0) return n == 2;
  if (n % 3 == 0) return n == 3;
  // Trial division by 6k +- 1: table sizes are at most a few billion, so at most ~10^4 divisions.
  for (int64_t d = 5; d <= n / d; d += 6) {
    if (n % d == 0 || n % (d + 2) == 0) return false;
  }
  return true;
}

std::vector<std::vector<std::vector<int64_t>>> engram_table_sizes(int64_t layers, int64_t max_ngram,
                                                                  int64_t heads,
                                                                  const std::vector<int64_t>& vocab_bases) {
  MT_CHECK(max_ngram >= 2 && heads >= 1 && layers >= 0, "Engram table sizes: N >= 2, H >= 1");
  MT_CHECK(static_cast<int64_t>(vocab_bases.size()) == max_ngram - 1, "one vocab base per order 2..N");
  std::set<int64_t> seen;
  std::vector<std::vector<std::vector<int64_t>>> sizes(static_cast<size_t>(layers));
  for (auto& layer : sizes) {
    for (int64_t n = 2; n <= max_ngram; ++n) {
      int64_t start = vocab_bases[static_cast<size_t>(n - 2)] - 1;
      std::vector<int64_t>& order = layer.emplace_back();
      for (int64_t head = 0; head < heads; ++head) {
        int64_t candidate = start + 1;
        while (!is_prime(candidate) || seen.count(candidate)) ++candidate;
        seen.insert(candidate);
        order.push_back(candidate);
        start = candidate;
      }
    }
  }
  return sizes;
}

}  // namespace meshtrain
