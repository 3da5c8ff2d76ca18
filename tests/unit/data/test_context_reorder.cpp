// The context-parallel sequence reorder (data/context_reorder.h): the spec's worked example, the striped
// formula, each rank's chunks, inverses, the causal-attention balance the reorders exist for, the errors on
// sequence lengths that do not split, and a batch's shard and its inverse gather.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "error_text.h"
#include "meshtrain/data/context_reorder.h"

namespace meshtrain {
namespace {

using testing::error_of;
using Indices = std::vector<int64_t>;

// (S, C) pairs every reorder accepts: S a multiple of 2C.
const std::vector<std::pair<int64_t, int64_t>> kSplits = {{2, 1},  {8, 2},   {12, 2},   {16, 4},
                                                          {24, 3}, {40, 5},  {48, 8},   {64, 4},
                                                          {96, 6}, {128, 8}, {160, 16}, {4096, 8}};

TEST(ContextReorder, DualChunkSwapMatchesTheSpecExample) {
  // shared/specs/context-parallel.md: C = 2, S = 8: [0 1 2 3 4 5 6 7] -> [0 1 6 7 2 3 4 5].
  const ContextLayout layout(ContextReorder::dual_chunk_swap, 8, 2);
  EXPECT_EQ(layout.sources(), (Indices{0, 1, 6, 7, 2, 3, 4, 5}));
  EXPECT_EQ(layout.rank_sources(0), (Indices{0, 1, 6, 7}));
  EXPECT_EQ(layout.rank_sources(1), (Indices{2, 3, 4, 5}));
  EXPECT_EQ(layout.destinations(), (Indices{0, 1, 4, 5, 6, 7, 2, 3}));
}

TEST(ContextReorder, DualChunkSwapGivesRankRChunksRAndTheirMirror) {
  for (const auto& [S, C] : kSplits) {
    const ContextLayout layout(ContextReorder::dual_chunk_swap, S, C);
    const int64_t g = S / (2 * C);
    for (int64_t r = 0; r < C; ++r) {
      Indices expected;
      for (const int64_t chunk : {r, 2 * C - 1 - r}) {
        for (int64_t w = 0; w < g; ++w) expected.push_back(chunk * g + w);
      }
      EXPECT_EQ(layout.rank_sources(r), expected) << "S=" << S << " C=" << C << " rank " << r;
    }
  }
}

TEST(ContextReorder, DualChunkSwapInverseIsEvenChunksThenOddChunksReversed) {
  // The spec's statement of the inverse: read the reordered row as 2C chunks; the natural row is the chunks
  // at even places in order, then the chunks at odd places from the last back.
  for (const auto& [S, C] : kSplits) {
    const ContextLayout layout(ContextReorder::dual_chunk_swap, S, C);
    const Indices reordered = layout.sources();  // the natural row [0, S) after the permutation
    const int64_t g = S / (2 * C);
    std::vector<int64_t> places;
    for (int64_t place = 0; place < 2 * C; place += 2) places.push_back(place);
    for (int64_t place = 2 * C - 1; place > 0; place -= 2) places.push_back(place);
    Indices natural;
    for (const int64_t place : places) {
      for (int64_t w = 0; w < g; ++w) natural.push_back(reordered[place * g + w]);
    }
    Indices identity(S);
    std::iota(identity.begin(), identity.end(), 0);
    EXPECT_EQ(natural, identity) << "S=" << S << " C=" << C;
  }
}

TEST(ContextReorder, StripedFollowsItsFormula) {
  const ContextLayout example(ContextReorder::striped, 8, 2);
  EXPECT_EQ(example.sources(), (Indices{0, 2, 4, 6, 1, 3, 5, 7}));
  EXPECT_EQ(ContextLayout(ContextReorder::striped, 6, 3).sources(), (Indices{0, 3, 1, 4, 2, 5}));
  for (const auto& [S, C] : kSplits) {
    const ContextLayout layout(ContextReorder::striped, S, C);
    const int64_t L = S / C;
    for (int64_t r = 0; r < C; ++r) {
      for (int64_t i = 0; i < L; ++i) {
        ASSERT_EQ(layout.source(r * L + i), i * C + r) << "S=" << S << " C=" << C;
      }
    }
  }
}

TEST(ContextReorder, NoneAndOneRankAreTheIdentity) {
  Indices identity(12);
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_EQ(ContextLayout(ContextReorder::none, 12, 3).sources(), identity);
  EXPECT_EQ(ContextLayout(ContextReorder::none, 12, 3).rank_sources(1), (Indices{4, 5, 6, 7}));
  for (ContextReorder reorder : kContextReorders) {
    const ContextLayout one_rank(reorder, 12, 1);
    EXPECT_EQ(one_rank.reorder(), ContextReorder::none) << context_reorder_name(reorder);
    EXPECT_EQ(one_rank.sources(), identity) << context_reorder_name(reorder);
    // One rank needs no split, so an odd length is fine even under dual_chunk_swap.
    EXPECT_EQ(ContextLayout(reorder, 7, 1).rank_sources(0), (Indices{0, 1, 2, 3, 4, 5, 6}));
  }
}

TEST(ContextReorder, InverseRoundTripsForEveryReorder) {
  for (ContextReorder reorder : kContextReorders) {
    for (const auto& [S, C] : kSplits) {
      const ContextLayout layout(reorder, S, C);
      const Indices sources = layout.sources(), destinations = layout.destinations();
      Indices sorted = sources;
      std::sort(sorted.begin(), sorted.end());
      Indices identity(S);
      std::iota(identity.begin(), identity.end(), 0);
      ASSERT_EQ(sorted, identity) << "not a permutation: " << context_reorder_name(reorder) << " S=" << S;
      for (int64_t p = 0; p < S; ++p) {
        ASSERT_EQ(destinations[sources[p]], p) << context_reorder_name(reorder) << " S=" << S << " C=" << C;
        ASSERT_EQ(sources[destinations[p]], p) << context_reorder_name(reorder) << " S=" << S << " C=" << C;
      }
      // The ranks' slices, in rank order, are the whole reordered row.
      Indices concatenated;
      for (int64_t r = 0; r < C; ++r) {
        const Indices slice = layout.rank_sources(r);
        ASSERT_EQ(static_cast<int64_t>(slice.size()), S / C);
        concatenated.insert(concatenated.end(), slice.begin(), slice.end());
      }
      EXPECT_EQ(concatenated, sources) << context_reorder_name(reorder) << " S=" << S << " C=" << C;
    }
  }
}

// attention_pairs_per_context_rank by hand, C = 2, S = 8 (natural indices each rank holds, keys 0..i each):
//   none            rank 0 {0 1 2 3}: 1+2+3+4 = 10    rank 1 {4 5 6 7}: 5+6+7+8 = 26
//   dual_chunk_swap rank 0 {0 1 6 7}: 1+2+7+8 = 18    rank 1 {2 3 4 5}: 3+4+5+6 = 18
//   striped         rank 0 {0 2 4 6}: 1+3+5+7 = 16    rank 1 {1 3 5 7}: 2+4+6+8 = 20
TEST(ContextReorder, AttentionPairsMatchHandCounts) {
  EXPECT_EQ(attention_pairs_per_context_rank(ContextLayout(ContextReorder::none, 8, 2)),
            (std::vector<int64_t>{10, 26}));
  EXPECT_EQ(attention_pairs_per_context_rank(ContextLayout(ContextReorder::dual_chunk_swap, 8, 2)),
            (std::vector<int64_t>{18, 18}));
  EXPECT_EQ(attention_pairs_per_context_rank(ContextLayout(ContextReorder::striped, 8, 2)),
            (std::vector<int64_t>{16, 20}));
  // One rank holds the whole row: all S (S + 1) / 2 pairs, whatever the reorder asked.
  EXPECT_EQ(attention_pairs_per_context_rank(ContextLayout(ContextReorder::dual_chunk_swap, 7, 1)),
            (std::vector<int64_t>{28}));
  // C = 4, S = 16, a plain split: rank r holds 4r..4r+3, (4r+1) + ... + (4r+4) = 16 r + 10 pairs, about
  // (2r + 1) / C^2 of the 136.
  EXPECT_EQ(attention_pairs_per_context_rank(ContextLayout(ContextReorder::none, 16, 4)),
            (std::vector<int64_t>{10, 26, 42, 58}));
  // dual_chunk_swap, C = 4, S = 16: rank r holds chunks r and 7 - r of 2, each rank 34 pairs.
  EXPECT_EQ(attention_pairs_per_context_rank(ContextLayout(ContextReorder::dual_chunk_swap, 16, 4)),
            (std::vector<int64_t>{34, 34, 34, 34}));
}

TEST(ContextReorder, BalancedReordersEvenOutCausalAttention) {
  const int64_t S = 4096;
  for (const int64_t C : {2, 4, 8}) {
    for (ContextReorder reorder : kContextReorders) {
      const std::vector<int64_t> pairs = attention_pairs_per_context_rank(ContextLayout(reorder, S, C));
      EXPECT_EQ(std::accumulate(pairs.begin(), pairs.end(), int64_t{0}), S * (S + 1) / 2);  // each pair once
      const double most = static_cast<double>(*std::max_element(pairs.begin(), pairs.end()));
      const double least = static_cast<double>(*std::min_element(pairs.begin(), pairs.end()));
      const std::string label = std::string(context_reorder_name(reorder)) + " C=" + std::to_string(C);
      if (reorder == ContextReorder::none) {
        // A plain split: the last rank has 2C - 1 times the first's work.
        EXPECT_GT(most / least, 2.5) << label;
        EXPECT_NEAR(most / least, 2.0 * static_cast<double>(C) - 1.0, 0.01 * static_cast<double>(C)) << label;
      } else {
        EXPECT_LT((most - least) / most, 0.01) << label;
      }
    }
    // dual_chunk_swap is exact: every rank has 1/C of the pairs.
    const std::vector<int64_t> dual =
        attention_pairs_per_context_rank(ContextLayout(ContextReorder::dual_chunk_swap, S, C));
    EXPECT_EQ(*std::max_element(dual.begin(), dual.end()), *std::min_element(dual.begin(), dual.end()));
  }
}

TEST(ContextReorder, DualChunkSwapNeedsAMultipleOfTwiceTheContextDegree) {
  const std::string message = error_of([] { ContextLayout(ContextReorder::dual_chunk_swap, 100, 4); });
  EXPECT_NE(message.find("'max_target_length'"), std::string::npos) << message;
  EXPECT_NE(message.find("mesh.context=4"), std::string::npos) << message;
  EXPECT_NE(message.find("context_parallel_reorder=dual_chunk_swap"), std::string::npos) << message;
  EXPECT_NE(message.find("found max_target_length=100"), std::string::npos) << message;
  EXPECT_NE(message.find("use a max_target_length that is a multiple of 2 x mesh.context = 8 (96 or 104)"),
            std::string::npos)
      << message;
  // 100 is a multiple of 4, so striped would take it.
  EXPECT_NE(message.find("or context_parallel_reorder=striped"), std::string::npos) << message;

  const std::string odd = error_of([] { ContextLayout(ContextReorder::dual_chunk_swap, 6, 4); });
  EXPECT_NE(odd.find("multiple of 2 x mesh.context = 8 (8)"), std::string::npos) << odd;
  EXPECT_EQ(odd.find("striped"), std::string::npos) << odd;  // 6 is no multiple of 4 either
  EXPECT_EQ(error_of([] { ContextLayout(ContextReorder::dual_chunk_swap, 96, 4); }), "");
}

TEST(ContextReorder, StripedAndNoneNeedAMultipleOfTheContextDegree) {
  const std::string striped = error_of([] { ContextLayout(ContextReorder::striped, 102, 4); });
  EXPECT_NE(striped.find("'max_target_length'"), std::string::npos) << striped;
  EXPECT_NE(striped.find("mesh.context=4 and context_parallel_reorder=striped"), std::string::npos)
      << striped;
  EXPECT_NE(striped.find("a multiple of mesh.context = 4"), std::string::npos) << striped;
  EXPECT_NE(striped.find("found max_target_length=102"), std::string::npos) << striped;
  EXPECT_NE(striped.find("(100 or 104)"), std::string::npos) << striped;
  EXPECT_NE(striped.find("or a mesh.context that divides 102"), std::string::npos) << striped;
  const std::string none = error_of([] { ContextLayout(ContextReorder::none, 10, 3); });
  EXPECT_NE(none.find("context_parallel_load_balance=false"), std::string::npos) << none;
  EXPECT_NE(none.find("(9 or 12)"), std::string::npos) << none;
  // A multiple of C that is no multiple of 2C is fine here.
  EXPECT_EQ(error_of([] { ContextLayout(ContextReorder::striped, 12, 4); }), "");
  EXPECT_EQ(error_of([] { ContextLayout(ContextReorder::none, 12, 4); }), "");
}

TEST(ContextReorder, NonPositiveSizesNameTheirKey) {
  EXPECT_NE(error_of([] { ContextLayout(ContextReorder::striped, 8, 0); }).find("'mesh.context'"),
            std::string::npos);
  EXPECT_NE(error_of([] { ContextLayout(ContextReorder::striped, 0, 2); }).find("'max_target_length'"),
            std::string::npos);
}

// Rows of S tokens in which every field tells which row and natural index it came from, and positions and
// segment ids look like packed documents (positions restart at each document).
Batch numbered_rows(int64_t rows, int64_t S) {
  Batch batch;
  for (int64_t b = 0; b < rows; ++b) {
    int32_t position = 0, segment = 0;
    for (int64_t i = 0; i < S; ++i) {
      if (i > 0 && i % 5 == 0) {  // a new document every 5 tokens
        position = 0;
        ++segment;
      }
      batch.tokens.push_back(static_cast<int32_t>(1000 * b + i));
      batch.targets.push_back(static_cast<int32_t>(1000 * b + i + 1));
      batch.positions.push_back(position++);
      batch.segment_ids.push_back(segment);
      batch.loss_mask.push_back(static_cast<uint8_t>((i + b) % 3 != 0));
    }
  }
  return batch;
}

TEST(ContextReorder, ShardMatchesTheSpecExample) {
  Batch row;
  row.tokens = {10, 11, 12, 13, 14, 15, 16, 17};
  row.targets = {11, 12, 13, 14, 15, 16, 17, 18};
  row.positions = {0, 1, 2, 0, 1, 2, 3, 4};
  row.segment_ids = {0, 0, 0, 1, 1, 1, 1, 1};
  row.loss_mask = {1, 1, 0, 1, 1, 1, 1, 0};
  const ContextLayout layout(ContextReorder::dual_chunk_swap, 8, 2);
  const Batch first = context_shard(row, layout, 0), second = context_shard(row, layout, 1);
  EXPECT_EQ(first.tokens, (std::vector<int32_t>{10, 11, 16, 17}));
  EXPECT_EQ(first.targets, (std::vector<int32_t>{11, 12, 17, 18}));
  EXPECT_EQ(first.positions, (std::vector<int32_t>{0, 1, 3, 4}));  // original positions, not 0..3
  EXPECT_EQ(first.segment_ids, (std::vector<int32_t>{0, 0, 1, 1}));
  EXPECT_EQ(first.loss_mask, (std::vector<uint8_t>{1, 1, 1, 0}));
  EXPECT_EQ(second.tokens, (std::vector<int32_t>{12, 13, 14, 15}));
  EXPECT_EQ(second.positions, (std::vector<int32_t>{2, 0, 1, 2}));
  EXPECT_EQ(second.segment_ids, (std::vector<int32_t>{0, 1, 1, 1}));
  EXPECT_EQ(second.loss_mask, (std::vector<uint8_t>{0, 1, 1, 1}));
}

TEST(ContextReorder, ShardCarriesEveryFieldTogetherAndUnshardRestoresTheRows) {
  const int64_t B = 3, S = 40;
  const Batch rows = numbered_rows(B, S);
  for (ContextReorder reorder : kContextReorders) {
    for (const int64_t C : {1, 2, 4, 5}) {
      const std::string label = std::string(context_reorder_name(reorder)) + " C=" + std::to_string(C);
      const ContextLayout layout(reorder, S, C);
      const int64_t L = S / C;
      std::vector<Batch> shards;
      for (int64_t r = 0; r < C; ++r) {
        const Batch shard = context_shard(rows, layout, r);
        ASSERT_EQ(static_cast<int64_t>(shard.tokens.size()), B * L) << label;
        const Indices sources = layout.rank_sources(r);
        for (int64_t b = 0; b < B; ++b) {
          for (int64_t k = 0; k < L; ++k) {
            const size_t at = static_cast<size_t>(b * L + k);
            // The token says where it came from; every other field must come from the same place.
            const int64_t natural = shard.tokens[at] - 1000 * b;
            ASSERT_EQ(natural, sources[k]) << label;
            const size_t from = static_cast<size_t>(b * S + natural);
            ASSERT_EQ(shard.targets[at], rows.targets[from]) << label;
            ASSERT_EQ(shard.positions[at], rows.positions[from]) << label;
            ASSERT_EQ(shard.segment_ids[at], rows.segment_ids[from]) << label;
            ASSERT_EQ(shard.loss_mask[at], rows.loss_mask[from]) << label;
          }
        }
        shards.push_back(shard);
      }
      const Batch restored = context_unshard(shards, layout);
      EXPECT_EQ(restored.tokens, rows.tokens) << label;
      EXPECT_EQ(restored.targets, rows.targets) << label;
      EXPECT_EQ(restored.positions, rows.positions) << label;
      EXPECT_EQ(restored.segment_ids, rows.segment_ids) << label;
      EXPECT_EQ(restored.loss_mask, rows.loss_mask) << label;
    }
  }
}

TEST(ContextReorder, ShardOfABatchOfAnotherLengthIsAnInternalError) {
  Batch rows = numbered_rows(2, 16);
  const ContextLayout layout(ContextReorder::dual_chunk_swap, 12, 2);  // 32 cells are no whole rows of 12
  EXPECT_THROW(context_shard(rows, layout, 0), std::logic_error);
  rows = numbered_rows(2, 12);
  rows.loss_mask.pop_back();  // one field shorter than the others
  EXPECT_THROW(context_shard(rows, layout, 0), std::logic_error);
}

}  // namespace
}  // namespace meshtrain
