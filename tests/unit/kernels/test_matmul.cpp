#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "gradcheck.h"
#include "meshtrain/core/dtype.h"
#include "meshtrain/kernels/cpu/matmul.h"

namespace {

using meshtrain::kernels::matmul_backward;
using meshtrain::kernels::matmul_forward;
using meshtrain::kernels::matmul_reference_backward;
using meshtrain::kernels::matmul_reference_forward;
using meshtrain::testing::expect_close;
using meshtrain::testing::numeric_gradient;
using meshtrain::testing::random_values;
using meshtrain::testing::relative_error;
using meshtrain::testing::report_error;
using meshtrain::testing::scaled;
using meshtrain::testing::to_double;
using meshtrain::testing::to_float;
using meshtrain::testing::weighted_sum;

void expect_gradient(const std::string& what, const std::vector<double>& analytic,
                     const std::vector<double>& numeric) {
  // Central differences with step 1e-6 on a bilinear loss: no truncation error, only rounding of order
  // 1e-16 * |loss| / 1e-6 ~ 1e-10 relative to the gradient.
  const double bound = 1e-7;
  const double error = relative_error(analytic, numeric);
  report_error(what, error, bound);
  EXPECT_LT(error, bound) << what;
}

TEST(Matmul, BackwardMatchesFiniteDifferences) {
  const int64_t N = 4, I = 5, O = 3;
  std::vector<double> x = random_values(N * I, 11), w = random_values(I * O, 12), bias = random_values(O, 13);
  const std::vector<double> weights = random_values(N * O, 14);
  auto loss = [&] {
    std::vector<double> out(N * O);
    matmul_reference_forward(out.data(), x.data(), w.data(), bias.data(), N, I, O);
    return weighted_sum(out, weights);
  };
  std::vector<double> dx(N * I), dw(I * O, 0.0), dbias(O, 0.0);
  matmul_reference_backward(dx.data(), dw.data(), dbias.data(), weights.data(), x.data(), w.data(), N, I, O,
                            false);
  expect_gradient("matmul reference dx vs finite differences", dx, numeric_gradient(loss, x));
  expect_gradient("matmul reference dw vs finite differences", dw, numeric_gradient(loss, w));
  expect_gradient("matmul reference dbias vs finite differences", dbias, numeric_gradient(loss, bias));
}

// Float kernel against the double reference on identical (float-representable) inputs. Error bound: each
// output is a float dot product of length up to 512, whose rounding error grows like sqrt(length) * 6e-8;
// 1e-5 of the largest magnitude leaves a wide margin while a wrong index or transpose gives O(1).
void check_fast_against_reference(int64_t N, int64_t I, int64_t O, uint64_t seed) {
  const double bound = 1e-5;
  const std::string size = std::to_string(N) + "x" + std::to_string(I) + "x" + std::to_string(O);
  const std::vector<float> x = to_float(random_values(N * I, seed)),
                           w = to_float(random_values(I * O, seed + 1)),
                           bias = to_float(random_values(O, seed + 2)),
                           dout = to_float(random_values(N * O, seed + 3));
  const std::vector<double> xd = to_double(x), wd = to_double(w), biasd = to_double(bias),
                            doutd = to_double(dout);

  std::vector<double> out_ref(N * O), out_nobias_ref(N * O);
  matmul_reference_forward(out_ref.data(), xd.data(), wd.data(), biasd.data(), N, I, O);
  matmul_reference_forward(out_nobias_ref.data(), xd.data(), wd.data(), static_cast<const double*>(nullptr),
                           N, I, O);
  // NaN-filled outputs prove the forward writes rather than accumulates.
  std::vector<float> out(N * O, std::numeric_limits<float>::quiet_NaN());
  matmul_forward(out.data(), x.data(), w.data(), bias.data(), N, I, O, nullptr);
  expect_close("matmul " + size + " forward with bias", out, out_ref, bound);
  std::fill(out.begin(), out.end(), std::numeric_limits<float>::quiet_NaN());
  matmul_forward(out.data(), x.data(), w.data(), nullptr, N, I, O, nullptr);
  expect_close("matmul " + size + " forward without bias", out, out_nobias_ref, bound);

  std::vector<double> dx_ref(N * I), dw_ref(I * O, 0.0), dbias_ref(O, 0.0);
  matmul_reference_backward(dx_ref.data(), dw_ref.data(), dbias_ref.data(), doutd.data(), xd.data(),
                            wd.data(), N, I, O, false);
  std::vector<float> dx(N * I, std::numeric_limits<float>::quiet_NaN()), dw(I * O, 0.0f), dbias(O, 0.0f);
  matmul_backward(dx.data(), dw.data(), dbias.data(), dout.data(), x.data(), w.data(), N, I, O, false,
                  nullptr);
  expect_close("matmul " + size + " dx (written)", dx, dx_ref, bound);
  expect_close("matmul " + size + " dw", dw, dw_ref, bound);
  expect_close("matmul " + size + " dbias", dbias, dbias_ref, bound);

  // A second call accumulates into every gradient, so each must be exactly twice the reference.
  matmul_backward(dx.data(), dw.data(), dbias.data(), dout.data(), x.data(), w.data(), N, I, O, true,
                  nullptr);
  expect_close("matmul " + size + " dx (accumulated twice)", dx, scaled(dx_ref, 2.0), bound);
  expect_close("matmul " + size + " dw (accumulated twice)", dw, scaled(dw_ref, 2.0), bound);
  expect_close("matmul " + size + " dbias (accumulated twice)", dbias, scaled(dbias_ref, 2.0), bound);
}

TEST(Matmul, FastMatchesReferenceOddSizes) {
  check_fast_against_reference(37, 53, 29, 100);
}

TEST(Matmul, FastMatchesReferenceLarge) {
  check_fast_against_reference(256, 512, 384, 200);
}

// bf16 inputs (dtype=bfloat16): the kernel equals the double reference on x, w and dout rounded to bf16
// (float32 sums: the float32 bound), writes and accumulates like the float32 kernel, and differs from it.
TEST(Matmul, Bf16InputsMatchTheReferenceOnRoundedInputs) {
  const int64_t N = 37, I = 53, O = 29;
  const double bound = 1e-5;
  const auto rounded = [](const std::vector<float>& values) {
    std::vector<double> result(values.size());
    for (size_t i = 0; i < values.size(); ++i)
      result[i] = meshtrain::float_from_bfloat16(meshtrain::bfloat16_from_float(values[i]));
    return result;
  };
  const std::vector<float> x = to_float(random_values(N * I, 41)), w = to_float(random_values(I * O, 42)),
                           bias = to_float(random_values(O, 43)), dout = to_float(random_values(N * O, 44));
  const std::vector<double> xr = rounded(x), wr = rounded(w), doutr = rounded(dout), biasd = to_double(bias);
  std::vector<uint16_t> scratch(
      static_cast<size_t>(meshtrain::kernels::matmul_bf16_scratch_elements(N, I, O, false)));

  std::vector<double> out_ref(N * O);
  matmul_reference_forward(out_ref.data(), xr.data(), wr.data(), biasd.data(), N, I, O);
  std::vector<float> out(N * O, std::numeric_limits<float>::quiet_NaN()), out_float32(N * O);
  matmul_forward(out.data(), x.data(), w.data(), bias.data(), N, I, O, scratch.data());
  expect_close("bf16 matmul forward", out, out_ref, bound);
  matmul_forward(out_float32.data(), x.data(), w.data(), bias.data(), N, I, O, nullptr);
  EXPECT_NE(out, out_float32);
  std::vector<double> out_nobias_ref(N * O);
  matmul_reference_forward(out_nobias_ref.data(), xr.data(), wr.data(), static_cast<const double*>(nullptr),
                           N, I, O);
  std::fill(out.begin(), out.end(), std::numeric_limits<float>::quiet_NaN());
  matmul_forward(out.data(), x.data(), w.data(), nullptr, N, I, O, scratch.data());
  expect_close("bf16 matmul forward without bias", out, out_nobias_ref, bound);

  std::vector<double> dx_ref(N * I), dw_ref(I * O, 0.0), dbias_ref(O, 0.0);
  matmul_reference_backward(dx_ref.data(), dw_ref.data(), dbias_ref.data(), doutr.data(), xr.data(),
                            wr.data(), N, I, O, false);
  std::vector<float> dx(N * I, std::numeric_limits<float>::quiet_NaN()), dw(I * O, 0.0f), dbias(O, 0.0f);
  matmul_backward(dx.data(), dw.data(), dbias.data(), dout.data(), x.data(), w.data(), N, I, O, false,
                  scratch.data());
  expect_close("bf16 matmul dx (written)", dx, dx_ref, bound);
  expect_close("bf16 matmul dw", dw, dw_ref, bound);
  // The bias gradient is a float32 column sum of the unrounded dout.
  std::vector<double> dbias_float32(O, 0.0);
  matmul_reference_backward(static_cast<double*>(nullptr), static_cast<double*>(nullptr),
                            dbias_float32.data(), to_double(dout).data(), xr.data(), wr.data(), N, I, O,
                            false);
  expect_close("bf16 matmul dbias", dbias, dbias_float32, bound);
  matmul_backward(dx.data(), dw.data(), nullptr, dout.data(), x.data(), w.data(), N, I, O, true,
                  scratch.data());
  expect_close("bf16 matmul dx (accumulated twice)", dx, scaled(dx_ref, 2.0), bound);
  expect_close("bf16 matmul dw (accumulated twice)", dw, scaled(dw_ref, 2.0), bound);
}

// x rounded by its producer (matmul_input_dtype): the _bf16_x kernels give bitwise what the float32-x kernels
// give after rounding x themselves, forward and backward, written and accumulated, with and without dx.
TEST(Matmul, Bf16InputFromItsProducerGivesTheSameBits) {
  const int64_t N = 37, I = 53, O = 29;
  const std::vector<float> x = to_float(random_values(N * I, 51)), w = to_float(random_values(I * O, 52)),
                           bias = to_float(random_values(O, 53)), dout = to_float(random_values(N * O, 54));
  std::vector<uint16_t> x_bf16(N * I);
  for (size_t i = 0; i < x.size(); ++i) x_bf16[i] = meshtrain::bfloat16_from_float(x[i]);
  using meshtrain::kernels::matmul_bf16_scratch_elements;
  EXPECT_EQ(matmul_bf16_scratch_elements(N, I, O, true), I * O + N * O);
  std::vector<uint16_t> scratch(static_cast<size_t>(matmul_bf16_scratch_elements(N, I, O, false)));
  std::vector<uint16_t> scratch_x(static_cast<size_t>(matmul_bf16_scratch_elements(N, I, O, true)));

  std::vector<float> out(N * O), out_x(N * O, std::numeric_limits<float>::quiet_NaN());
  matmul_forward(out.data(), x.data(), w.data(), bias.data(), N, I, O, scratch.data());
  meshtrain::kernels::matmul_forward_bf16_x(out_x.data(), x_bf16.data(), w.data(), bias.data(), N, I, O,
                                            scratch_x.data());
  EXPECT_EQ(out_x, out);

  for (bool with_dx : {true, false}) {
    std::vector<float> dx(N * I, 0.5f), dw(I * O, 0.25f), dbias(O, 0.0f);
    std::vector<float> dx_x = dx, dw_x = dw, dbias_x = dbias;
    for (bool accumulate : {false, true}) {
      matmul_backward(with_dx ? dx.data() : nullptr, dw.data(), dbias.data(), dout.data(), x.data(), w.data(),
                      N, I, O, accumulate, scratch.data());
      meshtrain::kernels::matmul_backward_bf16_x(with_dx ? dx_x.data() : nullptr, dw_x.data(), dbias_x.data(),
                                                 dout.data(), x_bf16.data(), w.data(), N, I, O, accumulate,
                                                 scratch_x.data());
      EXPECT_EQ(dx_x, dx) << "with dx " << with_dx << ", accumulate " << accumulate;
      EXPECT_EQ(dw_x, dw) << "with dx " << with_dx << ", accumulate " << accumulate;
      EXPECT_EQ(dbias_x, dbias) << "with dx " << with_dx << ", accumulate " << accumulate;
    }
  }
}

TEST(Matmul, NullGradientsAreSkipped) {
  const int64_t N = 6, I = 4, O = 5;
  const std::vector<float> x = to_float(random_values(N * I, 31)), w = to_float(random_values(I * O, 32)),
                           dout = to_float(random_values(N * O, 33));
  std::vector<double> dw_ref(I * O, 0.0);
  const std::vector<double> xd = to_double(x), wd = to_double(w), doutd = to_double(dout);
  matmul_reference_backward(static_cast<double*>(nullptr), dw_ref.data(), static_cast<double*>(nullptr),
                            doutd.data(), xd.data(), wd.data(), N, I, O, false);
  std::vector<float> dw(I * O, 0.0f);
  matmul_backward(nullptr, dw.data(), nullptr, dout.data(), x.data(), w.data(), N, I, O, false, nullptr);
  expect_close("matmul dw with dx and dbias skipped", dw, dw_ref, 1e-5);
}

TEST(Matmul, EmptyReductionGivesBias) {
  // I = 0: every output row is the bias (or zero without one), and BLAS must not be called with lda = 0.
  const int64_t N = 3, O = 4;
  const std::vector<float> bias = {1.0f, -2.0f, 0.5f, 3.0f};
  std::vector<float> out(N * O, std::numeric_limits<float>::quiet_NaN());
  matmul_forward(out.data(), nullptr, nullptr, bias.data(), N, 0, O, nullptr);
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t o = 0; o < O; ++o) EXPECT_EQ(out[n * O + o], bias[o]);
  }
  matmul_forward(out.data(), nullptr, nullptr, nullptr, N, 0, O, nullptr);
  for (float value : out) EXPECT_EQ(value, 0.0f);
}

}  // namespace
