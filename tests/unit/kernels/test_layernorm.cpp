#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "gradcheck.h"
#include "meshtrain/kernels/cpu/layernorm.h"

namespace {

using meshtrain::kernels::layernorm_backward;
using meshtrain::kernels::layernorm_forward;
using meshtrain::kernels::layernorm_reference_backward;
using meshtrain::kernels::layernorm_reference_forward;
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

TEST(LayerNorm, BackwardMatchesFiniteDifferences) {
  const int64_t N = 5, D = 12;
  const double eps = 1e-5;
  // Offset inputs so the mean term of the gradient matters.
  std::vector<double> x = random_values(N * D, 1, -0.5, 1.5), w = random_values(D, 2, 0.5, 1.5),
                      b = random_values(D, 3);
  const std::vector<double> weights = random_values(N * D, 4);
  auto loss = [&] {
    std::vector<double> out(N * D), mean(N), rstd(N);
    layernorm_reference_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, D,
                                eps);
    return weighted_sum(out, weights);
  };
  std::vector<double> out(N * D), mean(N), rstd(N), dx(N * D), dw(D, 0.0), db(D, 0.0);
  layernorm_reference_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, D, eps);
  layernorm_reference_backward(dx.data(), dw.data(), db.data(), weights.data(), x.data(), w.data(),
                               mean.data(), rstd.data(), N, D, false);
  expect_gradient("layernorm reference dx vs finite differences", dx, numeric_gradient(loss, x));
  expect_gradient("layernorm reference dw vs finite differences", dw, numeric_gradient(loss, w));
  expect_gradient("layernorm reference db vs finite differences", db, numeric_gradient(loss, b));
}

TEST(LayerNorm, FastMatchesReference) {
  // D = 70 is not a multiple of the 32-column dw/db block, so the tail block is exercised.
  const int64_t N = 9, D = 70;
  const float eps = 1e-5f;
  // Float kernels reduce over D = 70 values per row and N = 9 per column: rounding ~ sqrt(70) * 6e-8 ~ 5e-7.
  const double bound = 1e-5;
  const std::vector<float> x = to_float(random_values(N * D, 5, -0.5, 1.5)),
                           w = to_float(random_values(D, 6, 0.5, 1.5)), b = to_float(random_values(D, 7)),
                           dout = to_float(random_values(N * D, 8));
  const std::vector<double> xd = to_double(x), wd = to_double(w), bd = to_double(b), doutd = to_double(dout);

  std::vector<double> out_ref(N * D), mean_ref(N), rstd_ref(N);
  layernorm_reference_forward(out_ref.data(), mean_ref.data(), rstd_ref.data(), xd.data(), wd.data(),
                              bd.data(), N, D, static_cast<double>(eps));
  std::vector<float> out(N * D, std::numeric_limits<float>::quiet_NaN()), mean(N), rstd(N);
  layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, D, eps);
  expect_close("layernorm forward out", out, out_ref, bound);
  expect_close("layernorm forward mean", mean, mean_ref, bound);
  expect_close("layernorm forward rstd", rstd, rstd_ref, bound);

  std::vector<double> dx_ref(N * D), dw_ref(D, 0.0), db_ref(D, 0.0);
  layernorm_reference_backward(dx_ref.data(), dw_ref.data(), db_ref.data(), doutd.data(), xd.data(),
                               wd.data(), mean_ref.data(), rstd_ref.data(), N, D, false);
  // NaN-filled dx proves the first call writes; the second call must add the same gradient again.
  std::vector<float> dx(N * D, std::numeric_limits<float>::quiet_NaN()), dw(D, 0.0f), db(D, 0.0f);
  layernorm_backward(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), mean.data(),
                     rstd.data(), N, D, false);
  expect_close("layernorm dx (written)", dx, dx_ref, bound);
  expect_close("layernorm dw", dw, dw_ref, bound);
  expect_close("layernorm db", db, db_ref, bound);
  layernorm_backward(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), mean.data(),
                     rstd.data(), N, D, true);
  expect_close("layernorm dx (accumulated twice)", dx, scaled(dx_ref, 2.0), bound);
  expect_close("layernorm dw (accumulated twice)", dw, scaled(dw_ref, 2.0), bound);
  expect_close("layernorm db (accumulated twice)", db, scaled(db_ref, 2.0), bound);
}

// dtype=bfloat16: the bf16-output forward writes the float32 forward's values rounded, and the same
// statistics.
TEST(LayerNorm, Bf16OutputIsTheFloat32OutputRounded) {
  const int64_t N = 33, D = 70;
  const std::vector<float> x = to_float(random_values(N * D, 15, -0.5, 1.5)),
                           w = to_float(random_values(D, 16, 0.5, 1.5)), b = to_float(random_values(D, 17));
  std::vector<float> out(N * D), mean(N), rstd(N);
  std::vector<float> mean_bf16(N, std::numeric_limits<float>::quiet_NaN()), rstd_bf16 = mean_bf16;
  std::vector<uint16_t> out_bf16(N * D);
  layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, D, 1e-5f);
  meshtrain::kernels::layernorm_forward_bf16(out_bf16.data(), mean_bf16.data(), rstd_bf16.data(), x.data(),
                                             w.data(), b.data(), N, D, 1e-5f);
  meshtrain::testing::expect_bf16_of("layernorm bf16 out", out_bf16, out);
  EXPECT_EQ(mean_bf16, mean);
  EXPECT_EQ(rstd_bf16, rstd);
}

}  // namespace
