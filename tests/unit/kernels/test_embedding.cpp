#include <gtest/gtest.h>

#include <cmath>
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
  embedding_forward(out.data(), ids.data(), table.data(), N, R, D, false);
  expect_close("embedding forward (written)", out, out_ref, bound);

  std::vector<double> out_acc_ref = to_double(base);
  embedding_reference_forward(out_acc_ref.data(), ids.data(), tabled.data(), N, R, D, true);
  std::vector<float> out_acc = base;
  embedding_forward(out_acc.data(), ids.data(), table.data(), N, R, D, true);
  expect_close("embedding forward (accumulated)", out_acc, out_acc_ref, bound);

  std::vector<double> dtable_ref(R * D, 0.0);
  embedding_reference_backward(dtable_ref.data(), ids.data(), doutd.data(), N, R, D);
  std::vector<float> dtable(R * D, 0.0f);
  embedding_backward(dtable.data(), ids.data(), dout.data(), N, R, D);
  expect_close("embedding dtable", dtable, dtable_ref, bound);
  embedding_backward(dtable.data(), ids.data(), dout.data(), N, R, D);
  for (double& value : dtable_ref) value *= 2.0;
  expect_close("embedding dtable (accumulated twice)", dtable, dtable_ref, bound);
}

TEST(Embedding, RepeatedIdsAccumulate) {
  const int64_t N = 4, R = 3, D = 3;
  const std::vector<int32_t> ids = {2, 0, 2, 2};
  const std::vector<float> dout = {1, 2, 3, 10, 20, 30, 100, 200, 300, 1000, 2000, 3000};
  std::vector<float> dtable(R * D, 0.5f);
  embedding_backward(dtable.data(), ids.data(), dout.data(), N, R, D);
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
    EXPECT_THROW(embedding_forward(out.data(), ids.data(), table.data(), 2, R, D, false), std::logic_error);
    EXPECT_THROW(embedding_backward(dtable.data(), ids.data(), out.data(), 2, R, D), std::logic_error);
  }
}

}  // namespace
