#include "meshtrain/data/engram_hash.h"

#include <algorithm>
#include <limits>
#include <set>

#include "meshtrain/core/error.h"
#include "meshtrain/core/rng.h"

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

std::vector<int64_t> engram_multipliers(uint64_t seed, int64_t layer_id, int64_t max_ngram,
                                        int64_t compressed_vocab) {
  MT_CHECK(compressed_vocab >= 1, "Engram multipliers: a compressed vocabulary of at least one id");
  const int64_t bound = std::numeric_limits<int64_t>::max() / compressed_vocab;  // every m below it
  const auto half = static_cast<uint64_t>(std::max<int64_t>(1, bound / 2));
  const PhiloxKey key = philox_key(seed + 10007ull * static_cast<uint64_t>(layer_id), "engram/multipliers");
  std::vector<int64_t> multipliers;
  for (int64_t j = 0; j < max_ngram; ++j) {
    const uint64_t draw = (static_cast<uint64_t>(uint32_at(key, 2 * static_cast<uint64_t>(j))) << 32) |
                          uint32_at(key, 2 * static_cast<uint64_t>(j) + 1);
    multipliers.push_back(static_cast<int64_t>(2 * (draw % half) + 1));
  }
  return multipliers;
}

void engram_hash_ids(int32_t* out, const int32_t* compressed, int64_t B, int64_t S,
                     const std::vector<int64_t>& multipliers,
                     const std::vector<std::vector<int64_t>>& table_sizes, int32_t pad_id) {
  const auto N = static_cast<int64_t>(multipliers.size());
  MT_CHECK(N >= 2 && static_cast<int64_t>(table_sizes.size()) == N - 1, "one table-size row per order 2..N");
  const auto H = static_cast<int64_t>(table_sizes.front().size());
  for (const std::vector<int64_t>& order : table_sizes) {
    MT_CHECK(static_cast<int64_t>(order.size()) == H, "the same heads for every order");
    for (int64_t p : order)
      MT_CHECK(p >= 1 && p <= std::numeric_limits<int32_t>::max(), "table size fits int32");
  }
  // Products wrap as two's complement would in the references (numpy int64): an id that is out of range
  // cannot overflow UB here.
  const auto product = [&](int32_t x, int64_t j) {
    return static_cast<int64_t>(static_cast<uint64_t>(static_cast<int64_t>(x)) *
                                static_cast<uint64_t>(multipliers[static_cast<size_t>(j)]));
  };
  for (int64_t b = 0; b < B; ++b) {
    const int32_t* row = compressed + b * S;
    for (int64_t s = 0; s < S; ++s) {
      const auto token = [&](int64_t back) { return s - back >= 0 ? row[s - back] : pad_id; };
      int32_t* ids = out + (b * S + s) * H * (N - 1);
      int64_t hash = product(token(0), 0);
      for (int64_t n = 2; n <= N; ++n) {
        hash ^= product(token(n - 1), n - 1);
        for (int64_t head = 0; head < H; ++head) {
          const int64_t p = table_sizes[static_cast<size_t>(n - 2)][static_cast<size_t>(head)];
          const int64_t remainder = ((hash % p) + p) % p;
          ids[(n - 2) * H + head] = static_cast<int32_t>(remainder);
        }
      }
    }
  }
}

}  // namespace meshtrain
