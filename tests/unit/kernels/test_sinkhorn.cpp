// mHC's Sinkhorn mixing (kernels/cpu/sinkhorn.h): the double reference's backward through every iteration
// against finite differences, the float kernels against the reference, and the doubly stochastic property
// (positive entries, columns and rows summing to 1, spectral norm at most 1).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "gradcheck.h"
#include "meshtrain/kernels/cpu/sinkhorn.h"

namespace {

using meshtrain::kernels::sinkhorn_backward;
using meshtrain::kernels::sinkhorn_forward;
using meshtrain::kernels::sinkhorn_reference_backward;
using meshtrain::kernels::sinkhorn_reference_forward;
using meshtrain::testing::numeric_gradient;
using meshtrain::testing::random_values;
using meshtrain::testing::relative_error;
using meshtrain::testing::to_float;
using meshtrain::testing::weighted_sum;

TEST(Sinkhorn, ReferenceBackwardMatchesFiniteDifferences) {
  constexpr int64_t N = 3, G = 4;
  for (int64_t iterations : {1, 2, 20}) {
    SCOPED_TRACE("iterations " + std::to_string(iterations));
    std::vector<double> logits = random_values(N * G * G, 11, -2.0, 2.0);
    const std::vector<double> probe = random_values(N * G * G, 12);
    std::vector<double> mixing(N * G * G), d_logits(N * G * G);
    const auto loss = [&] {
      sinkhorn_reference_forward(mixing.data(), logits.data(), N, G, iterations);
      return weighted_sum(mixing, probe);
    };
    const std::vector<double> numeric = numeric_gradient(loss, logits);
    sinkhorn_reference_backward(d_logits.data(), probe.data(), logits.data(), N, G, iterations);
    EXPECT_LT(relative_error(d_logits, numeric), 1e-7);
  }
}

TEST(Sinkhorn, KernelsMatchTheReference) {
  constexpr int64_t N = 37, G = 4, iterations = 20;
  const std::vector<double> logits = random_values(N * G * G, 21, -3.0, 3.0);
  const std::vector<double> d_mixing = random_values(N * G * G, 22);
  std::vector<double> mixing_reference(N * G * G), d_logits_reference(N * G * G);
  sinkhorn_reference_forward(mixing_reference.data(), logits.data(), N, G, iterations);
  sinkhorn_reference_backward(d_logits_reference.data(), d_mixing.data(), logits.data(), N, G, iterations);
  const std::vector<float> logits_f = to_float(logits), d_mixing_f = to_float(d_mixing);
  std::vector<float> mixing(N * G * G), d_logits(N * G * G, -1.0f);
  sinkhorn_forward(mixing.data(), logits_f.data(), N, G, iterations);
  sinkhorn_backward(d_logits.data(), d_mixing_f.data(), logits_f.data(), N, G, iterations);
  EXPECT_LT(relative_error(mixing, mixing_reference), 1e-5);
  EXPECT_LT(relative_error(d_logits, d_logits_reference), 1e-4);
}

// Worst |row sum - 1|, |column sum - 1| and spectral norm over N random tokens with logits in [-scale,
// scale]; every entry must be positive.
struct Stochasticity {
  double row = 0.0, column = 0.0, norm = 0.0;
};
Stochasticity stochasticity(double scale, int64_t iterations) {
  constexpr int64_t N = 50, G = 4;
  const std::vector<double> logits = random_values(N * G * G, 31, -scale, scale);
  std::vector<double> mixing(N * G * G);
  sinkhorn_reference_forward(mixing.data(), logits.data(), N, G, iterations);
  Stochasticity worst;
  for (int64_t n = 0; n < N; ++n) {
    const double* m = mixing.data() + n * G * G;
    for (int64_t a = 0; a < G; ++a) {
      double row = 0.0, column = 0.0;
      for (int64_t b = 0; b < G; ++b) {
        EXPECT_GT(m[a * G + b], 0.0);
        row += m[a * G + b];
        column += m[b * G + a];
      }
      worst.row = std::max(worst.row, std::fabs(row - 1.0));
      worst.column = std::max(worst.column, std::fabs(column - 1.0));
    }
    // Spectral norm: power iteration on M^T M (v of unit length, so ||M^T M v|| tends to sigma^2).
    std::vector<double> v(G, 0.5);
    double sigma = 0.0;
    for (int step = 0; step < 200; ++step) {
      std::vector<double> u(G, 0.0), w(G, 0.0);
      for (int64_t i = 0; i < G; ++i)
        for (int64_t j = 0; j < G; ++j) u[static_cast<size_t>(i)] += m[i * G + j] * v[static_cast<size_t>(j)];
      for (int64_t i = 0; i < G; ++i)
        for (int64_t j = 0; j < G; ++j) w[static_cast<size_t>(j)] += m[i * G + j] * u[static_cast<size_t>(i)];
      double length = 0.0;
      for (double x : w) length += x * x;
      length = std::sqrt(length);
      sigma = std::sqrt(length);
      for (int64_t i = 0; i < G; ++i) v[static_cast<size_t>(i)] = w[static_cast<size_t>(i)] / length;
    }
    worst.norm = std::max(worst.norm, sigma);
  }
  std::printf(
      "[ info ] logits in [-%g, %g], %lld iterations: |column sum - 1| %.2e, |row sum - 1| %.2e, "
      "spectral norm %.7f\n",
      scale, scale, static_cast<long long>(iterations), worst.column, worst.row, worst.norm);
  return worst;
}

// The last step normalises columns, so they sum to 1 but for the 1e-6 denominators; rows drift by what 20
// iterations leave. At mHC's logit scale (a_res = 0.01 at init) that drift is the epsilon alone and the
// spectral norm is 1; wide logits converge slower (an independent numpy Sinkhorn leaves the same
// drift, 1.7e-2 at [-4, 4] and 20 iterations), and more iterations shrink it.
TEST(Sinkhorn, IterationsGiveADoublyStochasticMatrix) {
  const Stochasticity near_init = stochasticity(0.5, 20);
  EXPECT_LT(near_init.column, 2e-6);
  EXPECT_LT(near_init.row, 2e-6);
  EXPECT_LT(near_init.norm, 1.0 + 2e-6);
  const Stochasticity wide = stochasticity(4.0, 20);
  EXPECT_LT(wide.column, 2e-6);
  const Stochasticity wide_longer = stochasticity(4.0, 200);
  EXPECT_LT(wide_longer.row, wide.row / 10.0);
  EXPECT_LT(wide_longer.norm, 1.0 + 1e-4);
}

}  // namespace
