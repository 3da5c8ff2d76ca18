// Engram's gate (kernels/cpu/engram_gate.h): the double reference's backward against finite differences
// (scores kept away from the 1e-6 floor and from 0, where the signed square root has no derivative), a hand
// value, the floor's zero gradient, and the float kernels against the reference.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "gradcheck.h"
#include "meshtrain/kernels/cpu/engram_gate.h"

namespace {

using meshtrain::kernels::engram_gate_backward;
using meshtrain::kernels::engram_gate_forward;
using meshtrain::kernels::engram_gate_reference_backward;
using meshtrain::kernels::engram_gate_reference_forward;
using meshtrain::testing::numeric_gradient;
using meshtrain::testing::random_values;
using meshtrain::testing::relative_error;
using meshtrain::testing::to_float;
using meshtrain::testing::weighted_sum;

TEST(EngramGate, HandValue) {
  // D = 4, q . k = 4 - 2 = 2, s = 2 / 2 = 1: gate = sigmoid(1); s = -1: sigmoid(-1).
  const std::vector<double> q = {1, 1, 1, 1, 1, 1, 1, 1}, k = {1, 1, 1, -1, -1, -1, -1, 1}, v = {2, 0, 0, 0};
  std::vector<double> gated(8), gate(2);
  engram_gate_reference_forward(gated.data(), gate.data(), q.data(), k.data(), v.data(), 1, 2, 4);
  EXPECT_NEAR(gate[0], 1.0 / (1.0 + std::exp(-1.0)), 1e-15);
  EXPECT_NEAR(gate[1], 1.0 / (1.0 + std::exp(1.0)), 1e-15);
  EXPECT_NEAR(gated[0], 2.0 * gate[0], 1e-15);
  EXPECT_NEAR(gated[4], 2.0 * gate[1], 1e-15);
}

TEST(EngramGate, ReferenceBackwardMatchesFiniteDifferences) {
  constexpr int64_t N = 3, G = 4, D = 6;
  std::vector<double> q = random_values(N * G * D, 1), k = random_values(N * G * D, 2),
                      v = random_values(N * D, 3);
  const std::vector<double> probe = random_values(N * G * D, 4);
  std::vector<double> gated(N * G * D), gate(N * G);
  // Every score well away from 0 (|s| >= 0.05), so the central differences do not cross the kink.
  for (int64_t row = 0; row < N * G; ++row) {
    double dot = 0.0;
    for (int64_t c = 0; c < D; ++c) dot += q[row * D + c] * k[row * D + c];
    if (std::fabs(dot) / std::sqrt(double(D)) < 0.05) q[row * D] += dot >= 0 ? 1.0 : -1.0;
  }
  const auto loss = [&] {
    engram_gate_reference_forward(gated.data(), gate.data(), q.data(), k.data(), v.data(), N, G, D);
    return weighted_sum(gated, probe);
  };
  loss();
  std::vector<double> d_q(q.size()), d_k(k.size()), d_v(v.size(), -1.0);
  engram_gate_reference_backward(d_q.data(), d_k.data(), d_v.data(), probe.data(), gate.data(), q.data(),
                                 k.data(), v.data(), N, G, D);
  EXPECT_LT(relative_error(d_q, numeric_gradient(loss, q)), 1e-7);
  EXPECT_LT(relative_error(d_k, numeric_gradient(loss, k)), 1e-7);
  EXPECT_LT(relative_error(d_v, numeric_gradient(loss, v)), 1e-7);
}

TEST(EngramGate, ScoresBelowTheFloorPassNoGradientToQueriesAndKeys) {
  const std::vector<double> q = {1e-4, 0, 0, 0}, k = {1e-4, 0, 0, 0}, v = {1, 2, 3, 4},
                            d_gated = {1, 1, 1, 1};
  std::vector<double> gated(4), gate(1), d_q(4), d_k(4), d_v(4);
  engram_gate_reference_forward(gated.data(), gate.data(), q.data(), k.data(), v.data(), 1, 1, 4);
  EXPECT_NEAR(gate[0], 1.0 / (1.0 + std::exp(-1e-3)), 1e-12);  // s = 5e-9: sqrt of the floor, positive sign
  engram_gate_reference_backward(d_q.data(), d_k.data(), d_v.data(), d_gated.data(), gate.data(), q.data(),
                                 k.data(), v.data(), 1, 1, 4);
  for (double g : d_q) EXPECT_EQ(g, 0.0);
  for (double g : d_k) EXPECT_EQ(g, 0.0);
  EXPECT_EQ(d_v, (std::vector<double>(4, gate[0])));
}

TEST(EngramGate, KernelsMatchTheReference) {
  constexpr int64_t N = 33, G = 4, D = 64;
  const std::vector<double> q = random_values(N * G * D, 5), k = random_values(N * G * D, 6),
                            v = random_values(N * D, 7), d_gated = random_values(N * G * D, 8);
  std::vector<double> gated(N * G * D), gate(N * G), d_q(q.size()), d_k(k.size()), d_v(v.size());
  engram_gate_reference_forward(gated.data(), gate.data(), q.data(), k.data(), v.data(), N, G, D);
  engram_gate_reference_backward(d_q.data(), d_k.data(), d_v.data(), d_gated.data(), gate.data(), q.data(),
                                 k.data(), v.data(), N, G, D);
  const std::vector<float> q_f = to_float(q), k_f = to_float(k), v_f = to_float(v),
                           d_gated_f = to_float(d_gated);
  std::vector<float> gated_f(gated.size()), gate_f(gate.size()), d_q_f(q.size()), d_k_f(k.size()),
      d_v_f(v.size(), -1.0f);
  engram_gate_forward(gated_f.data(), gate_f.data(), q_f.data(), k_f.data(), v_f.data(), N, G, D);
  engram_gate_backward(d_q_f.data(), d_k_f.data(), d_v_f.data(), d_gated_f.data(), gate_f.data(), q_f.data(),
                       k_f.data(), v_f.data(), N, G, D);
  EXPECT_LT(relative_error(gated_f, gated), 1e-6);
  EXPECT_LT(relative_error(gate_f, gate), 1e-6);
  EXPECT_LT(relative_error(d_q_f, d_q), 1e-5);
  EXPECT_LT(relative_error(d_k_f, d_k), 1e-5);
  EXPECT_LT(relative_error(d_v_f, d_v), 1e-6);
}

}  // namespace
