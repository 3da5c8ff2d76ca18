#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "gradcheck.h"
#include "meshtrain/kernels/cpu/rope.h"

namespace {

using meshtrain::kernels::rope_backward;
using meshtrain::kernels::rope_forward;
using meshtrain::kernels::rope_reference_backward;
using meshtrain::kernels::rope_reference_forward;
using meshtrain::testing::expect_close;
using meshtrain::testing::numeric_gradient;
using meshtrain::testing::random_values;
using meshtrain::testing::relative_error;
using meshtrain::testing::report_error;
using meshtrain::testing::to_double;
using meshtrain::testing::to_float;
using meshtrain::testing::weighted_sum;

// Compares the fast forward and backward with the double reference on float-representable inputs.
void check_fast_against_reference(const std::string& what, const std::vector<int32_t>& positions, int64_t H,
                                  int64_t d, float theta, double bound) {
  const int64_t N = static_cast<int64_t>(positions.size());
  const std::vector<float> x = to_float(random_values(N * H * d, 51)),
                           dout = to_float(random_values(N * H * d, 52));
  const std::vector<double> xd = to_double(x), doutd = to_double(dout);
  const double theta_d = static_cast<double>(theta);

  std::vector<double> out_ref(N * H * d), dx_ref(N * H * d);
  rope_reference_forward(out_ref.data(), xd.data(), positions.data(), N, H, d, theta_d);
  rope_reference_backward(dx_ref.data(), doutd.data(), positions.data(), N, H, d, theta_d);
  // NaN-filled outputs prove both passes write.
  std::vector<float> out(N * H * d, std::numeric_limits<float>::quiet_NaN()), dx = out;
  rope_forward(out.data(), x.data(), positions.data(), N, H, d, theta);
  rope_backward(dx.data(), dout.data(), positions.data(), N, H, d, theta);
  expect_close(what + " forward", out, out_ref, bound);
  expect_close(what + " backward", dx, dx_ref, bound);
}

TEST(Rope, BackwardMatchesFiniteDifferences) {
  const int64_t N = 4, H = 2, d = 8;
  const std::vector<int32_t> positions = {3, 0, 7, 1};
  const double theta = 10000.0;
  std::vector<double> x = random_values(N * H * d, 61);
  const std::vector<double> weights = random_values(N * H * d, 62);
  auto loss = [&] {
    std::vector<double> out(N * H * d);
    rope_reference_forward(out.data(), x.data(), positions.data(), N, H, d, theta);
    return weighted_sum(out, weights);
  };
  std::vector<double> dx(N * H * d);
  rope_reference_backward(dx.data(), weights.data(), positions.data(), N, H, d, theta);
  // Linear in x: central differences only carry rounding of order 1e-16 * |loss| / 1e-6.
  const double bound = 1e-7;
  const double error = relative_error(dx, numeric_gradient(loss, x));
  report_error("rope reference dx vs finite differences", error, bound);
  EXPECT_LT(error, bound);
}

TEST(Rope, FastMatchesReference) {
  // d = 80 gives 40 pairs: one full 32-pair block and a tail. Only cos/sin and two products per output are
  // rounded to float (~2e-7), so 1e-5 is loose; a wrong angle or sign gives O(1).
  check_fast_against_reference("rope theta=1e4 d=80", {0, 17, 5, 1023, 2, 64}, 3, 80, 10000.0f, 1e-5);
}

TEST(Rope, LargeThetaAndPositionMatchDoubleReference) {
  // At position 40000 an angle rounded to float would be off by up to 40000 * 6e-8 ~ 2e-3 rad, which
  // breaks the 1e-5 bound; angles computed in double leave only the float rounding of cos/sin.
  check_fast_against_reference("rope theta=1e6 position 40000", {40000, 39999, 12345, 0}, 2, 128, 1e6f, 1e-5);
}

TEST(Rope, PermutedPositionsMatchPerTokenApplication) {
  const int64_t H = 2, d = 6;
  for (const std::vector<int32_t>& positions :
       {std::vector<int32_t>{5, 0, 3, 11, 7, 2}, std::vector<int32_t>{5, 4, 3, 2, 1, 0}}) {
    const int64_t N = static_cast<int64_t>(positions.size());
    const std::vector<float> x = to_float(random_values(N * H * d, 71));
    std::vector<float> together(N * H * d), alone(N * H * d), dx_together(N * H * d), dx_alone(N * H * d);
    rope_forward(together.data(), x.data(), positions.data(), N, H, d, 10000.0f);
    rope_backward(dx_together.data(), x.data(), positions.data(), N, H, d, 10000.0f);
    for (int64_t n = 0; n < N; ++n) {
      rope_forward(alone.data() + n * H * d, x.data() + n * H * d, &positions[n], 1, H, d, 10000.0f);
      rope_backward(dx_alone.data() + n * H * d, x.data() + n * H * d, &positions[n], 1, H, d, 10000.0f);
    }
    // Same arithmetic on the same values, so the results must be identical, not merely close.
    EXPECT_EQ(together, alone);
    EXPECT_EQ(dx_together, dx_alone);
    // Guard against a vacuous pass: the rotation must actually depend on the position.
    EXPECT_NE(together, x);
  }
}

TEST(Rope, InPlaceMatchesOutOfPlace) {
  const int64_t N = 3, H = 2, d = 80;
  const std::vector<int32_t> positions = {9, 2, 31};
  const std::vector<float> x = to_float(random_values(N * H * d, 81));
  std::vector<float> out(N * H * d), dx(N * H * d);
  rope_forward(out.data(), x.data(), positions.data(), N, H, d, 10000.0f);
  rope_backward(dx.data(), x.data(), positions.data(), N, H, d, 10000.0f);
  std::vector<float> in_place = x;
  rope_forward(in_place.data(), in_place.data(), positions.data(), N, H, d, 10000.0f);
  EXPECT_EQ(in_place, out);
  in_place = x;
  rope_backward(in_place.data(), in_place.data(), positions.data(), N, H, d, 10000.0f);
  EXPECT_EQ(in_place, dx);
}

TEST(Rope, OddHeadWidthIsAnInternalError) {
  const std::vector<int32_t> positions = {0};
  std::vector<float> x(3, 1.0f);
  EXPECT_THROW(rope_forward(x.data(), x.data(), positions.data(), 1, 1, 3, 10000.0f), std::logic_error);
}

}  // namespace
