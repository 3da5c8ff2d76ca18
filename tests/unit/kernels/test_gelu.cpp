#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "gradcheck.h"
#include "meshtrain/kernels/cpu/gelu.h"

namespace {

using meshtrain::kernels::gelu_backward;
using meshtrain::kernels::gelu_forward;
using meshtrain::kernels::gelu_reference_backward;
using meshtrain::kernels::gelu_reference_forward;
using meshtrain::testing::expect_close;
using meshtrain::testing::numeric_gradient;
using meshtrain::testing::random_values;
using meshtrain::testing::relative_error;
using meshtrain::testing::report_error;
using meshtrain::testing::to_double;
using meshtrain::testing::to_float;
using meshtrain::testing::weighted_sum;

TEST(Gelu, BackwardMatchesFiniteDifferences) {
  const int64_t count = 40;
  std::vector<double> x = random_values(count, 101, -4.0, 4.0);
  const std::vector<double> weights = random_values(count, 102);
  auto loss = [&] {
    std::vector<double> out(count);
    gelu_reference_forward(out.data(), x.data(), count);
    return weighted_sum(out, weights);
  };
  std::vector<double> dx(count);
  gelu_reference_backward(dx.data(), weights.data(), x.data(), count);
  // Smooth op in double with step 1e-6: truncation ~ step^2 * |f'''| ~ 1e-12 and rounding
  // ~ 1e-16 * |loss| / step ~ 1e-9, both far below 1e-7.
  const double bound = 1e-7;
  const double error = relative_error(dx, numeric_gradient(loss, x));
  report_error("gelu reference dx vs finite differences", error, bound);
  EXPECT_LT(error, bound);
}

void check_fast_against_reference(const std::string& what, const std::vector<float>& x,
                                  const std::vector<float>& dout) {
  // A few float roundings per value (tanh, cubic, products): ~5e-7 relative at worst.
  const double bound = 1e-5;
  const int64_t count = static_cast<int64_t>(x.size());
  const std::vector<double> xd = to_double(x), doutd = to_double(dout);
  std::vector<double> out_ref(count), dx_ref(count);
  gelu_reference_forward(out_ref.data(), xd.data(), count);
  gelu_reference_backward(dx_ref.data(), doutd.data(), xd.data(), count);
  // NaN-filled outputs prove every output is written.
  std::vector<float> out(count, std::numeric_limits<float>::quiet_NaN()), dx = out;
  gelu_forward(out.data(), x.data(), count);
  gelu_backward(dx.data(), dout.data(), x.data(), count);
  expect_close(what + " forward", out, out_ref, bound);
  expect_close(what + " dx", dx, dx_ref, bound);
}

TEST(Gelu, FastMatchesReference) {
  // 20000 values is above the parallel threshold, so the OpenMP path runs.
  const int64_t count = 20000;
  check_fast_against_reference("gelu", to_float(random_values(count, 103, -6.0, 6.0)),
                               to_float(random_values(count, 104)));
}

TEST(Gelu, LargeInputsSaturate) {
  // tanh saturates to +-1: gelu(x) -> x or -0, gelu'(x) -> 1 or 0, with no overflow in x^3 for these values.
  check_fast_against_reference("gelu large inputs", {-1e4f, -50.0f, -10.0f, 0.0f, 10.0f, 50.0f, 1e4f},
                               {1.0f, -1.0f, 0.5f, 2.0f, 1.0f, -0.5f, 1.0f});
}

// dtype=bfloat16: the bf16-output forward writes the float32 forward's values rounded (above the parallel
// threshold, and the saturated ends).
TEST(Gelu, Bf16OutputIsTheFloat32OutputRounded) {
  std::vector<float> x = to_float(random_values(20000, 105, -6.0, 6.0));
  for (float extreme : {-1e4f, -50.0f, 0.0f, 50.0f, 1e4f}) x.push_back(extreme);
  const int64_t count = static_cast<int64_t>(x.size());
  std::vector<float> out(count);
  std::vector<uint16_t> out_bf16(count);
  gelu_forward(out.data(), x.data(), count);
  meshtrain::kernels::gelu_forward_bf16(out_bf16.data(), x.data(), count);
  meshtrain::testing::expect_bf16_of("gelu bf16 out", out_bf16, out);
}

}  // namespace
