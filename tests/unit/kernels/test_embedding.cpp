#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "gradcheck.h"
#include "meshtrain/kernels/cpu/embedding.h"

namespace {

using meshtrain::kernels::embedding_backward;
using meshtrain::kernels::embedding_forward;
using meshtrain::kernels::embedding_reference_backward;
using meshtrain::kernels::embedding_reference_forward;
using meshtrain::testing::expect_close;
using meshtrain::testing::numeric_gradient;
using meshtrain::testing::random_values;
using meshtrain::testing::relative_error;
using meshtrain::testing::report_error;
using meshtrain::testing::to_double;
using meshtrain::testing::to_float;
using meshtrain::testing::weighted_sum;

TEST(Embedding, BackwardMatchesFiniteDifferences) {
  const int64_t N = 7, R = 5, D = 4;
  const std::vector<int32_t> ids = {3, 1, 3, 0, 4, 3, 1};  // repeats, and row 2 unused
  std::vector<double> table = random_values(R * D, 21);
  const std::vector<double> weights = random_values(N * D, 22), base = random_values(N * D, 23);
  for (bool accumulate : {false, true}) {
    auto loss = [&] {
      std::vector<double> out = base;
      embedding_reference_forward(out.data(), ids.data(), table.data(), N, R, D, accumulate);
      return weighted_sum(out, weights);
    };
    std::vector<double> dtable(R * D, 0.0);
    embedding_reference_backward(dtable.data(), ids.data(), weights.data(), N, R, D);
    // Linear in the table: central differences only carry rounding of order 1e-16 * |loss| / 1e-6.
    const double bound = 1e-7;
    const double error = relative_error(dtable, numeric_gradient(loss, table));
    report_error(std::string("embedding reference dtable vs FD") + (accumulate ? " (accumulate)" : ""), error,
                 bound);
    EXPECT_LT(error, bound);
  }
}

TEST(Embedding, FastMatchesReference) {
  // D = 70 is not a multiple of the 32-column block, so the tail block is exercised.
  const int64_t N = 19, R = 11, D = 70;
  std::vector<int32_t> ids(N);
  for (int64_t n = 0; n < N; ++n) ids[n] = static_cast<int32_t>((n * 7 + 3) % R);
  const std::vector<float> table = to_float(random_values(R * D, 41)),
                           dout = to_float(random_values(N * D, 42)),
                           base = to_float(random_values(N * D, 43));
  const std::vector<double> tabled = to_double(table), doutd = to_double(dout);
  // Lookups and adds of float values: float and double results agree to float rounding of one add.
  const double bound = 1e-5;

  std::vector<double> out_ref(N * D);
  embedding_reference_forward(out_ref.data(), ids.data(), tabled.data(), N, R, D, false);
  std::vector<float> out(N * D, std::numeric_limits<float>::quiet_NaN());
  embedding_forward(out.data(), ids.data(), table.data(), N, R, D, false, 0, -1);
  expect_close("embedding forward (written)", out, out_ref, bound);

  std::vector<double> out_acc_ref = to_double(base);
  embedding_reference_forward(out_acc_ref.data(), ids.data(), tabled.data(), N, R, D, true);
  std::vector<float> out_acc = base;
  embedding_forward(out_acc.data(), ids.data(), table.data(), N, R, D, true, 0, -1);
  expect_close("embedding forward (accumulated)", out_acc, out_acc_ref, bound);

  std::vector<double> dtable_ref(R * D, 0.0);
  embedding_reference_backward(dtable_ref.data(), ids.data(), doutd.data(), N, R, D);
  std::vector<float> dtable(R * D, 0.0f);
  embedding_backward(dtable.data(), ids.data(), dout.data(), N, R, D, 0, -1);
  expect_close("embedding dtable", dtable, dtable_ref, bound);
  embedding_backward(dtable.data(), ids.data(), dout.data(), N, R, D, 0, -1);
  for (double& value : dtable_ref) value *= 2.0;
  expect_close("embedding dtable (accumulated twice)", dtable, dtable_ref, bound);
}

TEST(Embedding, RepeatedIdsAccumulate) {
  const int64_t N = 4, R = 3, D = 3;
  const std::vector<int32_t> ids = {2, 0, 2, 2};
  const std::vector<float> dout = {1, 2, 3, 10, 20, 30, 100, 200, 300, 1000, 2000, 3000};
  std::vector<float> dtable(R * D, 0.5f);
  embedding_backward(dtable.data(), ids.data(), dout.data(), N, R, D, 0, -1);
  // Row 0 gets token 1; row 1 is untouched; row 2 gets tokens 0, 2 and 3: 1 + 100 + 1000 = 1101, etc.
  // All sums are exact in float.
  const std::vector<float> expected = {10.5f, 20.5f, 30.5f, 0.5f, 0.5f, 0.5f, 1101.5f, 2202.5f, 3303.5f};
  EXPECT_EQ(dtable, expected);
}

TEST(Embedding, OutOfRangeIdIsAnInternalError) {
  const int64_t R = 3, D = 2;
  const std::vector<float> table(R * D, 1.0f);
  std::vector<float> out(2 * D), dtable(R * D, 0.0f);
  for (int32_t bad : {3, -1}) {
    const std::vector<int32_t> ids = {0, bad};
    EXPECT_THROW(embedding_forward(out.data(), ids.data(), table.data(), 2, R, D, false, 0, -1),
                 std::logic_error);
    EXPECT_THROW(embedding_backward(dtable.data(), ids.data(), out.data(), 2, R, D, 0, -1), std::logic_error);
  }
}

// Vocab-parallel: rank r of t holds rows [r * R / t, (r + 1) * R / t) of the padded table. Lookups of ids it
// does not hold are zero rows, so the written outputs of the ranks sum to the full lookup; the backward of a
// rank is exactly its rows of the full backward (same adds in the same token order).
TEST(Embedding, VocabShardsSumToFullLookupAndSplitTheGradient) {
  const int64_t N = 29, R = 12, D = 70;
  std::vector<int32_t> ids(N);
  for (int64_t n = 0; n < N; ++n) ids[n] = static_cast<int32_t>((n * 5 + 2) % R);  // repeats, every row
  const std::vector<float> table = to_float(random_values(R * D, 51)),
                           dout = to_float(random_values(N * D, 52)),
                           base = to_float(random_values(N * D, 53));
  std::vector<float> full(N * D), full_dtable(R * D, 0.0f);
  embedding_forward(full.data(), ids.data(), table.data(), N, R, D, false, 0, -1);
  embedding_backward(full_dtable.data(), ids.data(), dout.data(), N, R, D, 0, -1);
  for (int64_t ranks : {2, 3}) {
    const int64_t rows = R / ranks;
    std::vector<float> summed(N * D, 0.0f);
    for (int64_t rank = 0; rank < ranks; ++rank) {
      const std::string name = "ranks " + std::to_string(ranks) + " rank " + std::to_string(rank);
      const int64_t offset = rank * rows;
      const std::vector<float> shard(table.begin() + offset * D, table.begin() + (offset + rows) * D);
      std::vector<float> out(N * D, std::numeric_limits<float>::quiet_NaN());
      embedding_forward(out.data(), ids.data(), shard.data(), N, rows, D, false, offset, R);
      std::vector<float> reference_out(N * D, std::numeric_limits<float>::quiet_NaN());
      embedding_reference_forward(reference_out.data(), ids.data(), shard.data(), N, rows, D, false, offset);
      EXPECT_EQ(out, reference_out) << name;
      // Accumulate: ids held elsewhere leave the row unchanged, the others add their row.
      std::vector<float> accumulated = base;
      embedding_forward(accumulated.data(), ids.data(), shard.data(), N, rows, D, true, offset, R);
      for (int64_t n = 0; n < N; ++n) {
        const bool here = ids[n] >= offset && ids[n] < offset + rows;
        for (int64_t j = 0; j < D; ++j) {
          if (!here) {
            ASSERT_EQ(out[n * D + j], 0.0f) << name << " token " << n;
          }
          ASSERT_EQ(accumulated[n * D + j], here ? base[n * D + j] + out[n * D + j] : base[n * D + j])
              << name << " token " << n;
          summed[n * D + j] += out[n * D + j];
        }
      }
      // Backward: dout rows of ids held elsewhere are NaN; they must not be read into the shard.
      std::vector<float> shard_dout = dout;
      for (int64_t n = 0; n < N; ++n) {
        if (ids[n] < offset || ids[n] >= offset + rows) {
          std::fill(shard_dout.begin() + n * D, shard_dout.begin() + (n + 1) * D,
                    std::numeric_limits<float>::quiet_NaN());
        }
      }
      std::vector<float> dshard(rows * D, 0.0f);
      embedding_backward(dshard.data(), ids.data(), shard_dout.data(), N, rows, D, offset, R);
      const std::vector<float> expected(full_dtable.begin() + offset * D,
                                        full_dtable.begin() + (offset + rows) * D);
      EXPECT_EQ(dshard, expected) << name;
      std::vector<float> reference_dshard(rows * D, 0.0f);
      embedding_reference_backward(reference_dshard.data(), ids.data(), shard_dout.data(), N, rows, D,
                                   offset);
      EXPECT_EQ(reference_dshard, expected) << name;
    }
    EXPECT_EQ(summed, full) << "ranks " << ranks;
  }
}

TEST(Embedding, VocabShardIdsAreCheckedAgainstTheGlobalTable) {
  const int64_t R = 3, D = 2;
  const std::vector<float> table(R * D, 1.0f);
  std::vector<float> out(2 * D), dtable(R * D, 0.0f);
  // Rank 1 of 2 (rows [3, 6) of 6): ids in [0, 6) are fine, others are errors.
  for (int32_t good : {0, 2, 3, 5}) {
    const std::vector<int32_t> ids = {4, good};
    EXPECT_NO_THROW(embedding_forward(out.data(), ids.data(), table.data(), 2, R, D, false, 3, 6));
    EXPECT_NO_THROW(embedding_backward(dtable.data(), ids.data(), out.data(), 2, R, D, 3, 6));
  }
  for (int32_t bad : {6, -1}) {
    const std::vector<int32_t> ids = {4, bad};
    EXPECT_THROW(embedding_forward(out.data(), ids.data(), table.data(), 2, R, D, false, 3, 6),
                 std::logic_error);
    EXPECT_THROW(embedding_backward(dtable.data(), ids.data(), out.data(), 2, R, D, 3, 6), std::logic_error);
  }
  // global_rows defaults to vocab_offset + R: rank 0 must pass it, or ids of the other ranks are errors.
  const std::vector<int32_t> ids = {0, 4};
  EXPECT_THROW(embedding_forward(out.data(), ids.data(), table.data(), 2, R, D, false, 0, -1),
               std::logic_error);
  EXPECT_NO_THROW(embedding_forward(out.data(), ids.data(), table.data(), 2, R, D, false, 0, 6));
  // The shard must lie inside the global table.
  EXPECT_THROW(embedding_forward(out.data(), ids.data(), table.data(), 2, R, D, false, 4, 6),
               std::logic_error);
}

}  // namespace
