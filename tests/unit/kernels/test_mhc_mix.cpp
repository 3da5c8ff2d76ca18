// mHC's stream mixes (kernels/cpu/mhc_mix.h): the double references' backwards against finite differences of
// one site (collapse -> a stand-in sublayer o = tanh(xin) -> expand), a hand value, and the float kernels
// against the references.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "gradcheck.h"
#include "meshtrain/kernels/cpu/mhc_mix.h"

namespace {

using meshtrain::kernels::mhc_collapse_backward;
using meshtrain::kernels::mhc_collapse_forward;
using meshtrain::kernels::mhc_collapse_reference_backward;
using meshtrain::kernels::mhc_collapse_reference_forward;
using meshtrain::kernels::mhc_expand_backward;
using meshtrain::kernels::mhc_expand_forward;
using meshtrain::kernels::mhc_expand_reference_backward;
using meshtrain::kernels::mhc_expand_reference_forward;
using meshtrain::testing::numeric_gradient;
using meshtrain::testing::random_values;
using meshtrain::testing::relative_error;
using meshtrain::testing::to_float;
using meshtrain::testing::weighted_sum;

constexpr int64_t N = 3, G = 4, D = 5;

TEST(MhcMix, HandValue) {
  // G = 2, D = 1: x = [1, 2], pre = [0.5, 0.25] -> xin = 1; M = [[0, 1], [1, 0]] swaps, post = [1, 2], o = 3.
  const std::vector<double> x = {1, 2}, pre = {0.5, 0.25}, mixing = {0, 1, 1, 0}, post = {1, 2}, o = {3};
  std::vector<double> xin(1), out(2);
  mhc_collapse_reference_forward(xin.data(), x.data(), pre.data(), 1, 2, 1);
  mhc_expand_reference_forward(out.data(), x.data(), mixing.data(), post.data(), o.data(), 1, 2, 1);
  EXPECT_EQ(xin[0], 1.0);
  EXPECT_EQ(out, (std::vector<double>{2 + 3, 1 + 6}));
}

// One site with o = tanh(xin): L = sum(probe * out).
TEST(MhcMix, ReferenceBackwardsMatchFiniteDifferencesThroughASite) {
  std::vector<double> x = random_values(N * G * D, 1), pre = random_values(N * G, 2),
                      mixing = random_values(N * G * G, 3), post = random_values(N * G, 4);
  const std::vector<double> probe = random_values(N * G * D, 5);
  std::vector<double> xin(N * D), o(N * D), out(N * G * D);
  const auto loss = [&] {
    mhc_collapse_reference_forward(xin.data(), x.data(), pre.data(), N, G, D);
    for (size_t i = 0; i < o.size(); ++i) o[i] = std::tanh(xin[i]);
    mhc_expand_reference_forward(out.data(), x.data(), mixing.data(), post.data(), o.data(), N, G, D);
    return weighted_sum(out, probe);
  };
  loss();
  std::vector<double> d_x(x.size()), d_mixing(mixing.size()), d_post(post.size()), d_o(o.size()),
      d_pre(pre.size());
  mhc_expand_reference_backward(d_x.data(), d_mixing.data(), d_post.data(), d_o.data(), probe.data(),
                                x.data(), mixing.data(), post.data(), o.data(), N, G, D);
  std::vector<double> d_xin(xin.size());
  for (size_t i = 0; i < d_xin.size(); ++i) d_xin[i] = d_o[i] * (1.0 - o[i] * o[i]);
  mhc_collapse_reference_backward(d_x.data(), d_pre.data(), d_xin.data(), x.data(), pre.data(), N, G, D);
  EXPECT_LT(relative_error(d_x, numeric_gradient(loss, x)), 1e-8);
  EXPECT_LT(relative_error(d_pre, numeric_gradient(loss, pre)), 1e-8);
  EXPECT_LT(relative_error(d_mixing, numeric_gradient(loss, mixing)), 1e-8);
  EXPECT_LT(relative_error(d_post, numeric_gradient(loss, post)), 1e-8);
}

TEST(MhcMix, KernelsMatchTheReferences) {
  constexpr int64_t n = 41, d = 32;
  const std::vector<double> x = random_values(n * G * d, 6), pre = random_values(n * G, 7),
                            mixing = random_values(n * G * G, 8), post = random_values(n * G, 9),
                            o = random_values(n * d, 10), d_out = random_values(n * G * d, 11),
                            d_xin = random_values(n * d, 12);
  std::vector<double> xin(n * d), out(n * G * d), d_x(x.size()), d_mixing(mixing.size()), d_post(post.size()),
      d_o(o.size()), d_pre(pre.size());
  mhc_collapse_reference_forward(xin.data(), x.data(), pre.data(), n, G, d);
  mhc_expand_reference_forward(out.data(), x.data(), mixing.data(), post.data(), o.data(), n, G, d);
  mhc_expand_reference_backward(d_x.data(), d_mixing.data(), d_post.data(), d_o.data(), d_out.data(),
                                x.data(), mixing.data(), post.data(), o.data(), n, G, d);
  mhc_collapse_reference_backward(d_x.data(), d_pre.data(), d_xin.data(), x.data(), pre.data(), n, G, d);
  const std::vector<float> x_f = to_float(x), pre_f = to_float(pre), mixing_f = to_float(mixing),
                           post_f = to_float(post), o_f = to_float(o), d_out_f = to_float(d_out),
                           d_xin_f = to_float(d_xin);
  std::vector<float> xin_f(xin.size()), out_f(out.size()), d_x_f(x.size(), -1.0f), d_mixing_f(mixing.size()),
      d_post_f(post.size()), d_o_f(o.size()), d_pre_f(pre.size());
  mhc_collapse_forward(xin_f.data(), x_f.data(), pre_f.data(), n, G, d);
  mhc_expand_forward(out_f.data(), x_f.data(), mixing_f.data(), post_f.data(), o_f.data(), n, G, d);
  mhc_expand_backward(d_x_f.data(), d_mixing_f.data(), d_post_f.data(), d_o_f.data(), d_out_f.data(),
                      x_f.data(), mixing_f.data(), post_f.data(), o_f.data(), n, G, d);
  mhc_collapse_backward(d_x_f.data(), d_pre_f.data(), d_xin_f.data(), x_f.data(), pre_f.data(), n, G, d);
  EXPECT_LT(relative_error(xin_f, xin), 1e-6);
  EXPECT_LT(relative_error(out_f, out), 1e-6);
  EXPECT_LT(relative_error(d_x_f, d_x), 1e-6);
  EXPECT_LT(relative_error(d_mixing_f, d_mixing), 1e-6);
  EXPECT_LT(relative_error(d_post_f, d_post), 1e-6);
  EXPECT_LT(relative_error(d_o_f, d_o), 1e-6);
  EXPECT_LT(relative_error(d_pre_f, d_pre), 1e-6);
}

}  // namespace
