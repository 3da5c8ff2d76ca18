// The grouped matmul of the routed experts (kernels/cpu/grouped_matmul.h): the reference against finite
// differences, and the GEMM-seam kernel against the reference on uneven segments including empty ones.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "gradcheck.h"
#include "meshtrain/kernels/cpu/grouped_matmul.h"

namespace {

using meshtrain::kernels::grouped_matmul_backward;
using meshtrain::kernels::grouped_matmul_forward;
using meshtrain::kernels::grouped_matmul_reference_backward;
using meshtrain::kernels::grouped_matmul_reference_forward;
using meshtrain::testing::expect_close;
using meshtrain::testing::expect_gradient;
using meshtrain::testing::numeric_gradient;
using meshtrain::testing::random_values;
using meshtrain::testing::to_double;
using meshtrain::testing::to_float;
using meshtrain::testing::weighted_sum;

std::vector<int32_t> offsets_of(const std::vector<int32_t>& rows) {
  std::vector<int32_t> offsets = {0};
  for (int32_t count : rows) offsets.push_back(offsets.back() + count);
  return offsets;
}

TEST(GroupedMatmul, ReferenceBackwardMatchesFiniteDifferences) {
  // Uneven segments with an empty one (expert 1).
  const std::vector<int32_t> offsets = offsets_of({3, 0, 5, 1});
  const int64_t E = 4, I = 5, O = 4, R = offsets.back();
  std::vector<double> x = random_values(R * I, 61), w = random_values(E * I * O, 62);
  const std::vector<double> probe = random_values(R * O, 63);
  auto loss = [&] {
    std::vector<double> out(R * O);
    grouped_matmul_reference_forward(out.data(), x.data(), w.data(), offsets.data(), E, I, O);
    return weighted_sum(out, probe);
  };
  // d_w accumulates: start from values and subtract them.
  const std::vector<double> start = random_values(E * I * O, 64);
  std::vector<double> d_x(R * I), d_w = start;
  grouped_matmul_reference_backward(d_x.data(), d_w.data(), probe.data(), x.data(), w.data(), offsets.data(),
                                    E, I, O);
  for (size_t i = 0; i < d_w.size(); ++i) d_w[i] -= start[i];
  expect_gradient("grouped matmul reference d_x", d_x, numeric_gradient(loss, x));
  expect_gradient("grouped matmul reference d_w", d_w, numeric_gradient(loss, w));
}

void check_fast_against_reference(const std::string& what, const std::vector<int32_t>& rows, int64_t I,
                                  int64_t O) {
  // Float GEMM against the double reference on the same inputs: bound 1e-5 as the dense matmul's test.
  const double bound = 1e-5;
  const std::vector<int32_t> offsets = offsets_of(rows);
  const int64_t E = static_cast<int64_t>(rows.size()), R = offsets.back();
  const std::vector<float> x = to_float(random_values(R * I, 71)), w = to_float(random_values(E * I * O, 72)),
                           d_out = to_float(random_values(R * O, 73)),
                           start = to_float(random_values(E * I * O, 74));
  const std::vector<double> xd = to_double(x), wd = to_double(w), d_out_d = to_double(d_out);
  const float nan = std::numeric_limits<float>::quiet_NaN();

  std::vector<float> out(R * O, nan), d_x(R * I, nan), d_w = start;
  std::vector<double> out_ref(R * O), d_x_ref(R * I), d_w_ref = to_double(start);
  grouped_matmul_forward(out.data(), x.data(), w.data(), offsets.data(), E, I, O);
  grouped_matmul_reference_forward(out_ref.data(), xd.data(), wd.data(), offsets.data(), E, I, O);
  expect_close(what + " forward", out, out_ref, bound);
  grouped_matmul_backward(d_x.data(), d_w.data(), d_out.data(), x.data(), w.data(), offsets.data(), E, I, O);
  grouped_matmul_reference_backward(d_x_ref.data(), d_w_ref.data(), d_out_d.data(), xd.data(), wd.data(),
                                    offsets.data(), E, I, O);
  expect_close(what + " d_x (written)", d_x, d_x_ref, bound);
  expect_close(what + " d_w (accumulated)", d_w, d_w_ref, bound);
  // Experts without rows keep their d_w bit for bit.
  for (int64_t e = 0; e < E; ++e) {
    if (rows[e] != 0) continue;
    for (int64_t i = e * I * O; i < (e + 1) * I * O; ++i)
      ASSERT_EQ(d_w[i], start[i]) << what << " expert " << e;
  }
  // Each gradient alone equals the pair's.
  std::vector<float> d_x_alone(R * I, nan), d_w_alone = start;
  grouped_matmul_backward(d_x_alone.data(), nullptr, d_out.data(), x.data(), w.data(), offsets.data(), E, I,
                          O);
  grouped_matmul_backward(nullptr, d_w_alone.data(), d_out.data(), x.data(), w.data(), offsets.data(), E, I,
                          O);
  EXPECT_EQ(d_x_alone, d_x) << what;
  EXPECT_EQ(d_w_alone, d_w) << what;
}

TEST(GroupedMatmul, FastMatchesReference) {
  // Empty first, middle and last segments, a one-row segment and segments large enough for the GEMM's
  // blocked paths.
  check_fast_against_reference("grouped matmul uneven", {0, 40, 0, 1, 130, 17, 0}, 48, 40);
  check_fast_against_reference("grouped matmul one expert", {64}, 32, 24);
}

TEST(GroupedMatmul, AllSegmentsEmptyTouchesNothing) {
  const std::vector<int32_t> offsets = {0, 0, 0};
  const std::vector<float> w(2 * 3 * 4, 1.0f), start(2 * 3 * 4, 0.5f);
  std::vector<float> d_w = start;
  float sentinel = 7.0f;
  grouped_matmul_forward(&sentinel, &sentinel, w.data(), offsets.data(), 2, 3, 4);
  grouped_matmul_backward(&sentinel, d_w.data(), &sentinel, &sentinel, w.data(), offsets.data(), 2, 3, 4);
  EXPECT_EQ(sentinel, 7.0f);
  EXPECT_EQ(d_w, start);
}

}  // namespace
