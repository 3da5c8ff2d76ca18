// Engram's ShortConv core (kernels/cpu/short_conv.h): the double reference's backward against finite
// differences (with and without a halo, K = 1 too), the float kernels against the reference, and the
// context-parallel property: a row convolved whole equals its two chunks convolved apart, the second reading
// the first's last H inputs as its halo, and the halo's gradient is what the first chunk's inputs miss.
#include <gtest/gtest.h>

#include <vector>

#include "gradcheck.h"
#include "meshtrain/kernels/cpu/short_conv.h"

namespace {

using meshtrain::kernels::short_conv_backward;
using meshtrain::kernels::short_conv_forward;
using meshtrain::kernels::short_conv_reference_backward;
using meshtrain::kernels::short_conv_reference_forward;
using meshtrain::testing::numeric_gradient;
using meshtrain::testing::random_values;
using meshtrain::testing::relative_error;
using meshtrain::testing::to_float;
using meshtrain::testing::weighted_sum;

struct Shape {
  int64_t B, T, C, K, dilation;
  bool with_halo;
  int64_t H() const { return (K - 1) * dilation; }
};

TEST(ShortConv, ReferenceBackwardMatchesFiniteDifferences) {
  for (const Shape s : {Shape{2, 9, 3, 4, 2, true}, Shape{2, 9, 3, 4, 2, false}, Shape{1, 5, 2, 1, 3, false},
                        Shape{1, 6, 2, 3, 3, true}}) {
    SCOPED_TRACE("K " + std::to_string(s.K) + " dilation " + std::to_string(s.dilation) +
                 (s.with_halo ? " halo" : ""));
    std::vector<double> u = random_values(static_cast<size_t>(s.B * s.T * s.C), 1);
    std::vector<double> halo = random_values(static_cast<size_t>(s.B * s.H() * s.C), 2);
    std::vector<double> w = random_values(static_cast<size_t>(s.K * s.C), 3);
    const std::vector<double> probe = random_values(static_cast<size_t>(s.B * s.T * s.C), 4);
    std::vector<double> y(probe.size());
    const double* halo_or_none = s.with_halo ? halo.data() : nullptr;
    const auto loss = [&] {
      short_conv_reference_forward(y.data(), u.data(), s.with_halo ? halo.data() : nullptr, w.data(), s.B,
                                   s.T, s.C, s.K, s.dilation);
      return weighted_sum(y, probe);
    };
    std::vector<double> d_u(u.size()), d_halo(halo.size()), d_w(w.size(), 0.0);
    short_conv_reference_backward(d_u.data(), s.with_halo ? d_halo.data() : nullptr, d_w.data(), probe.data(),
                                  u.data(), halo_or_none, w.data(), s.B, s.T, s.C, s.K, s.dilation);
    EXPECT_LT(relative_error(d_u, numeric_gradient(loss, u)), 1e-8);
    EXPECT_LT(relative_error(d_w, numeric_gradient(loss, w)), 1e-8);
    if (s.with_halo) {
      EXPECT_LT(relative_error(d_halo, numeric_gradient(loss, halo)), 1e-8);
    }
  }
}

TEST(ShortConv, KernelsMatchTheReference) {
  for (const Shape s :
       {Shape{3, 40, 24, 4, 3, true}, Shape{3, 40, 24, 4, 3, false}, Shape{2, 17, 8, 1, 3, true}}) {
    const auto count = [](int64_t n) { return static_cast<size_t>(n); };
    const std::vector<double> u = random_values(count(s.B * s.T * s.C), 5);
    const std::vector<double> halo = random_values(count(s.B * s.H() * s.C), 6);
    const std::vector<double> w = random_values(count(s.K * s.C), 7);
    const std::vector<double> d_y = random_values(count(s.B * s.T * s.C), 8);
    const std::vector<double> d_w_start = random_values(count(s.K * s.C), 9);  // d_w accumulates
    std::vector<double> y(d_y.size()), d_u(u.size()), d_halo(halo.size()), d_w = d_w_start;
    const double* h = s.with_halo ? halo.data() : nullptr;
    short_conv_reference_forward(y.data(), u.data(), h, w.data(), s.B, s.T, s.C, s.K, s.dilation);
    short_conv_reference_backward(d_u.data(), s.with_halo ? d_halo.data() : nullptr, d_w.data(), d_y.data(),
                                  u.data(), h, w.data(), s.B, s.T, s.C, s.K, s.dilation);
    const std::vector<float> u_f = to_float(u), halo_f = to_float(halo), w_f = to_float(w),
                             d_y_f = to_float(d_y);
    std::vector<float> y_f(y.size(), -1.0f), d_u_f(u.size(), -1.0f), d_halo_f(halo.size(), -1.0f),
        d_w_f = to_float(d_w_start);
    const float* h_f = s.with_halo ? halo_f.data() : nullptr;
    short_conv_forward(y_f.data(), u_f.data(), h_f, w_f.data(), s.B, s.T, s.C, s.K, s.dilation);
    short_conv_backward(d_u_f.data(), s.with_halo ? d_halo_f.data() : nullptr, d_w_f.data(), d_y_f.data(),
                        u_f.data(), h_f, w_f.data(), s.B, s.T, s.C, s.K, s.dilation);
    EXPECT_LT(relative_error(y_f, y), 1e-6);
    EXPECT_LT(relative_error(d_u_f, d_u), 1e-6);
    EXPECT_LT(relative_error(d_w_f, d_w), 1e-6);
    if (s.with_halo) {
      EXPECT_LT(relative_error(d_halo_f, d_halo), 1e-6);
    }
  }
}

// Context parallelism's exchange: chunk 2 of a row with the last H inputs of chunk 1 as its halo gives the
// whole row's outputs, and chunk 1's input gradient plus chunk 2's halo gradient gives the whole row's.
TEST(ShortConv, ChunksWithTheirHaloEqualTheWholeRow) {
  constexpr int64_t T = 12, C = 5, K = 4, dilation = 3, H = (K - 1) * dilation;  // chunks of 12 >= H = 9
  const std::vector<double> u = random_values(2 * T * C, 11), w = random_values(K * C, 12);
  const std::vector<double> d_y = random_values(2 * T * C, 13);
  std::vector<double> y(2 * T * C), d_u(2 * T * C), d_w(K * C, 0.0);
  short_conv_reference_forward<double>(y.data(), u.data(), nullptr, w.data(), 1, 2 * T, C, K, dilation);
  short_conv_reference_backward<double>(d_u.data(), nullptr, d_w.data(), d_y.data(), u.data(), nullptr,
                                        w.data(), 1, 2 * T, C, K, dilation);
  const std::vector<float> u_f = to_float(u), w_f = to_float(w), d_y_f = to_float(d_y);
  std::vector<float> y_f(2 * T * C), d_u_f(2 * T * C), d_halo(H * C), d_w_f(K * C, 0.0f);
  const float* second = u_f.data() + T * C;
  const float* halo = second - H * C;  // chunk 1's last H inputs, as the neighbour sends them
  short_conv_forward(y_f.data(), u_f.data(), nullptr, w_f.data(), 1, T, C, K, dilation);
  short_conv_forward(y_f.data() + T * C, second, halo, w_f.data(), 1, T, C, K, dilation);
  short_conv_backward(d_u_f.data(), nullptr, d_w_f.data(), d_y_f.data(), u_f.data(), nullptr, w_f.data(), 1,
                      T, C, K, dilation);
  short_conv_backward(d_u_f.data() + T * C, d_halo.data(), d_w_f.data(), d_y_f.data() + T * C, second, halo,
                      w_f.data(), 1, T, C, K, dilation);
  for (int64_t i = 0; i < H * C; ++i)
    d_u_f[static_cast<size_t>((T - H) * C + i)] += d_halo[static_cast<size_t>(i)];
  EXPECT_LT(relative_error(y_f, y), 1e-6);
  EXPECT_LT(relative_error(d_u_f, d_u), 1e-6);
  EXPECT_LT(relative_error(d_w_f, d_w), 1e-6);
}

}  // namespace
