// data/engram_hash: the table sizes against the spec's test vector (shared/specs/engram.md section 2),
// primality against a sieve, the multipliers' bound and determinism, and hash ids against values computed
// independently (Python integers masked to int64) for a small row with padding before its start.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

#include "meshtrain/data/context_reorder.h"
#include "meshtrain/data/engram_hash.h"

namespace meshtrain {
namespace {

TEST(EngramHash, TableSizesFollowTheSpecsTestVector) {
  // Bases [226240, 226240], engram_layers [1, 4], H = 8, N = 3.
  const auto sizes = engram_table_sizes(2, 3, 8, {226240, 226240});
  ASSERT_EQ(sizes.size(), 2u);
  EXPECT_EQ(sizes[0][0],
            (std::vector<int64_t>{226241, 226267, 226283, 226307, 226313, 226337, 226357, 226367}));
  EXPECT_EQ(sizes[0][1],
            (std::vector<int64_t>{226379, 226381, 226397, 226409, 226427, 226433, 226451, 226453}));
  const auto rows = [](const std::vector<std::vector<int64_t>>& layer) {
    int64_t total = 0;
    for (const auto& order : layer) total = std::accumulate(order.begin(), order.end(), total);
    return total;
  };
  EXPECT_EQ(rows(sizes[0]), 3621802);  // 16 tables
  EXPECT_EQ(sizes[1][0].front(), 226463);
  EXPECT_EQ(sizes[1][1].back(), 226649);
  EXPECT_EQ(rows(sizes[1]), 3625086);
}

TEST(EngramHash, PrimalityAgreesWithASieve) {
  constexpr int64_t kLimit = 100000;
  std::vector<bool> composite(kLimit, false);
  for (int64_t i = 2; i * i < kLimit; ++i) {
    for (int64_t j = i * i; j < kLimit; j += i) composite[static_cast<size_t>(j)] = true;
  }
  for (int64_t n = 0; n < kLimit; ++n) {
    EXPECT_EQ(is_prime(n), n >= 2 && !composite[static_cast<size_t>(n)]) << n;
  }
  EXPECT_TRUE(is_prime(2147483647));  // 2^31 - 1
  EXPECT_FALSE(is_prime(2147483647ll * 3));
}

TEST(EngramHash, MultipliersAreOddBelowTheBoundAndDeterministic) {
  for (int64_t vocab : {2ll, 1000ll, 151669ll, 1ll << 40}) {
    const int64_t bound = std::numeric_limits<int64_t>::max() / vocab;
    const std::vector<int64_t> multipliers = engram_multipliers(7, 1, 4, vocab);
    ASSERT_EQ(multipliers.size(), 4u);
    for (int64_t m : multipliers) {
      EXPECT_EQ(m % 2, 1) << m;
      EXPECT_GT(m, 0);
      EXPECT_LT(m, bound) << "vocab " << vocab;
    }
    EXPECT_EQ(multipliers, engram_multipliers(7, 1, 4, vocab));
    EXPECT_NE(multipliers, engram_multipliers(7, 4, 4, vocab)) << "layers differ";
    EXPECT_NE(multipliers, engram_multipliers(8, 1, 4, vocab)) << "seeds differ";
  }
  // A vocabulary at the int64 limit leaves only m = 1.
  EXPECT_EQ(engram_multipliers(0, 0, 3, std::numeric_limits<int64_t>::max()),
            (std::vector<int64_t>{1, 1, 1}));
}

TEST(EngramHash, HashIdsMatchAnIndependentComputation) {
  // x = [5, 0, 7, 2], pad -1 before the row's start, N = 3, two heads per order.
  const std::vector<int32_t> row = {5, 0, 7, 2};
  std::vector<int32_t> ids(4 * 4, -9);
  engram_hash_ids(ids.data(), row.data(), 1, 4, {1000003, 999983, 1000033}, {{11, 13}, {17, 19}}, -1);
  EXPECT_EQ(ids, (std::vector<int32_t>{9, 10, 16, 11, 8, 11, 6, 4, 6, 2, 14, 1, 2, 8, 7, 18}));
  // Two rows hash independently: the second row's first tokens see padding, not the first row's end.
  const std::vector<int32_t> rows = {5, 0, 7, 2, 5, 0, 7, 2};
  std::vector<int32_t> both(2 * 4 * 4, -9);
  engram_hash_ids(both.data(), rows.data(), 2, 4, {1000003, 999983, 1000033}, {{11, 13}, {17, 19}}, -1);
  EXPECT_EQ(std::vector<int32_t>(both.begin() + 16, both.end()), ids);
}

// The data path hashes natural-order rows before the context cut: every context rank's hash ids are those
// of its tokens' natural positions (under dual_chunk_swap and striped, C 2 and 4), and unsharding gives the
// rows back. Hashing a rank's permuted tokens instead (the reference system's bug) differs at chunk seams.
TEST(EngramHash, HashIdsTravelWithTheirTokensThroughTheContextCut) {
  EngramHashOptions options;
  options.layers = {1, 4};
  options.max_ngram = 3;
  options.heads = 2;
  options.vocab_bases = {31, 37};
  options.vocab_size = 50;
  const EngramHashing hashing = make_engram_hashing(options, nullptr);
  const int64_t B = 2, S = 16, heads = hashing.heads_per_token();
  Batch rows;
  for (int64_t i = 0; i < B * S; ++i) {
    rows.tokens.push_back(static_cast<int32_t>((i * 7 + i / 3) % 50));
    rows.targets.push_back(0);
    rows.positions.push_back(static_cast<int32_t>(i % S));
    rows.segment_ids.push_back(0);
    rows.loss_mask.push_back(1);
  }
  hashing.add_to(rows, S);
  for (ContextReorder reorder : {ContextReorder::dual_chunk_swap, ContextReorder::striped}) {
    for (int64_t C : {2, 4}) {
      const ContextLayout layout(reorder, S, C);
      std::vector<Batch> shards;
      bool permuted_hash_differs = false;
      for (int64_t rank = 0; rank < C; ++rank) {
        shards.push_back(context_shard(rows, layout, rank));
        const std::vector<int64_t> sources = layout.rank_sources(rank);
        for (size_t layer = 0; layer < hashing.layers.size(); ++layer) {
          const std::vector<int32_t>& ids = shards.back().engram_hash_ids[layer];
          for (int64_t b = 0; b < B; ++b)
            for (size_t k = 0; k < sources.size(); ++k)
              for (int64_t h = 0; h < heads; ++h)
                ASSERT_EQ(
                    ids[(b * static_cast<int64_t>(sources.size()) + static_cast<int64_t>(k)) * heads + h],
                    rows.engram_hash_ids[layer][(b * S + sources[k]) * heads + h]);
        }
        Batch permuted = shards.back();  // the rank's tokens hashed as if array neighbours were time ones
        hashing.add_to(permuted, layout.rank_length());
        permuted_hash_differs =
            permuted_hash_differs || permuted.engram_hash_ids != shards.back().engram_hash_ids;
      }
      EXPECT_TRUE(permuted_hash_differs) << "the test would not see hashing after the cut";
      EXPECT_EQ(context_unshard(shards, layout).engram_hash_ids, rows.engram_hash_ids);
    }
  }
}

}  // namespace
}  // namespace meshtrain
