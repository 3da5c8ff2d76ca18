#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "gradcheck.h"
#include "meshtrain/kernels/cpu/rmsnorm.h"

namespace {

using meshtrain::kernels::rmsnorm_backward;
using meshtrain::kernels::rmsnorm_forward;
using meshtrain::kernels::rmsnorm_reference_backward;
using meshtrain::kernels::rmsnorm_reference_forward;
using meshtrain::testing::expect_close;
using meshtrain::testing::expect_gradient;
using meshtrain::testing::numeric_gradient;
using meshtrain::testing::random_values;
using meshtrain::testing::relative_error;
using meshtrain::testing::report_error;
using meshtrain::testing::scaled;
using meshtrain::testing::to_double;
using meshtrain::testing::to_float;
using meshtrain::testing::weighted_sum;

TEST(RmsNorm, BackwardMatchesFiniteDifferences) {
  const int64_t N = 5, D = 12;
  const double eps = 1e-5;
  std::vector<double> x = random_values(N * D, 1), w = random_values(D, 2, 0.5, 1.5);
  const std::vector<double> weights = random_values(N * D, 3);
  auto loss = [&] {
    std::vector<double> out(N * D), rstd(N);
    rmsnorm_reference_forward(out.data(), rstd.data(), x.data(), w.data(), N, D, eps);
    return weighted_sum(out, weights);
  };
  std::vector<double> out(N * D), rstd(N), dx(N * D), dw(D, 0.0);
  rmsnorm_reference_forward(out.data(), rstd.data(), x.data(), w.data(), N, D, eps);
  rmsnorm_reference_backward(dx.data(), dw.data(), weights.data(), x.data(), w.data(), rstd.data(), N, D,
                             false);
  expect_gradient("rmsnorm reference dx vs finite differences", dx, numeric_gradient(loss, x));
  expect_gradient("rmsnorm reference dw vs finite differences", dw, numeric_gradient(loss, w));
}

TEST(RmsNorm, FastMatchesReference) {
  // D = 70 is not a multiple of the 32-column dw block, so the tail block is exercised.
  const int64_t N = 9, D = 70;
  const float eps = 1e-5f;
  // Float kernels reduce over D = 70 values per row and N = 9 per column: rounding ~ sqrt(70) * 6e-8 ~ 5e-7.
  const double bound = 1e-5;
  const std::vector<float> x = to_float(random_values(N * D, 4)), w = to_float(random_values(D, 5, 0.5, 1.5)),
                           dout = to_float(random_values(N * D, 6));
  const std::vector<double> xd = to_double(x), wd = to_double(w), doutd = to_double(dout);

  std::vector<double> out_ref(N * D), rstd_ref(N);
  rmsnorm_reference_forward(out_ref.data(), rstd_ref.data(), xd.data(), wd.data(), N, D,
                            static_cast<double>(eps));
  std::vector<float> out(N * D, std::numeric_limits<float>::quiet_NaN()), rstd(N);
  rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, D, eps);
  expect_close("rmsnorm forward out", out, out_ref, bound);
  expect_close("rmsnorm forward rstd", rstd, rstd_ref, bound);

  std::vector<double> dx_ref(N * D), dw_ref(D, 0.0);
  rmsnorm_reference_backward(dx_ref.data(), dw_ref.data(), doutd.data(), xd.data(), wd.data(),
                             rstd_ref.data(), N, D, false);
  // NaN-filled dx proves the first call writes; the second call must add the same gradient again.
  std::vector<float> dx(N * D, std::numeric_limits<float>::quiet_NaN()), dw(D, 0.0f);
  rmsnorm_backward(dx.data(), dw.data(), dout.data(), x.data(), w.data(), rstd.data(), N, D, false);
  expect_close("rmsnorm dx (written)", dx, dx_ref, bound);
  expect_close("rmsnorm dw", dw, dw_ref, bound);
  rmsnorm_backward(dx.data(), dw.data(), dout.data(), x.data(), w.data(), rstd.data(), N, D, true);
  expect_close("rmsnorm dx (accumulated twice)", dx, scaled(dx_ref, 2.0), bound);
  expect_close("rmsnorm dw (accumulated twice)", dw, scaled(dw_ref, 2.0), bound);
}

// dtype=bfloat16: the bf16-output forward writes the float32 forward's values rounded, and the same rstd.
TEST(RmsNorm, Bf16OutputIsTheFloat32OutputRounded) {
  const int64_t N = 33, D = 70;
  const std::vector<float> x = to_float(random_values(N * D, 14, -3.0, 3.0)),
                           w = to_float(random_values(D, 15, 0.5, 1.5));
  std::vector<float> out(N * D), rstd(N), rstd_bf16(N, std::numeric_limits<float>::quiet_NaN());
  std::vector<uint16_t> out_bf16(N * D);
  rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, D, 1e-6f);
  meshtrain::kernels::rmsnorm_forward_bf16(out_bf16.data(), rstd_bf16.data(), x.data(), w.data(), N, D,
                                           1e-6f);
  meshtrain::testing::expect_bf16_of("rmsnorm bf16 out", out_bf16, out);
  EXPECT_EQ(rstd_bf16, rstd);
}

}  // namespace
