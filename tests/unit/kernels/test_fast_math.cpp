#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "gradcheck.h"
#include "meshtrain/kernels/cpu/fast_math.h"

namespace {

using meshtrain::kernels::exp_approx;
using meshtrain::kernels::sigmoid_approx;
using meshtrain::kernels::sincos_approx;
using meshtrain::testing::report_error;

// Error of a float result in units of the last place of the exact (double) value rounded to float.
double ulp_error(float approx, double exact) {
  const float rounded = static_cast<float>(exact);
  const double ulp =
      static_cast<double>(std::nextafter(std::fabs(rounded), std::numeric_limits<float>::infinity())) -
      static_cast<double>(std::fabs(rounded));
  return std::fabs(static_cast<double>(approx) - exact) / ulp;
}

// Evaluated one call at a time through a pointer the optimiser cannot see through: the scalar code path.
float (*volatile scalar_exp)(float) = [](float x) { return exp_approx(x); };
float (*volatile scalar_sigmoid)(float) = [](float x) { return sigmoid_approx(x); };

// The float grid [low, high) in steps of `step`.
std::vector<float> grid(double low, double high, double step) {
  std::vector<float> values;
  for (double x = low; x < high; x += step) values.push_back(static_cast<float>(x));
  return values;
}

TEST(FastMath, ExpWithinAboutOneUlpOfLibm) {
  // 1.75 million points over the whole normal range (every 2^-13).
  const std::vector<float> x = grid(-87.0, 88.0, 1.0 / 8192.0);
  double worst = 0.0;
  for (float value : x)
    worst = std::max(worst, ulp_error(exp_approx(value), std::exp(static_cast<double>(value))));
  // Measured against the exact value (not its float rounding): a faithful result can be up to 1 ulp plus the
  // rounding distance away; 1.02 is measured.
  report_error("exp_approx vs exp, ulp over [-87, 88)", worst, 1.1);
  EXPECT_LE(worst, 1.1);
}

TEST(FastMath, ExpSpecialValues) {
  EXPECT_EQ(exp_approx(0.0f), 1.0f);
  EXPECT_EQ(exp_approx(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_EQ(exp_approx(-87.5f), 0.0f);
  EXPECT_EQ(exp_approx(-1e30f), 0.0f);
  // Clamped above 88: finite, never inf.
  EXPECT_TRUE(std::isfinite(exp_approx(1000.0f)));
  EXPECT_EQ(exp_approx(1000.0f), exp_approx(88.0f));
  EXPECT_GT(exp_approx(88.0f), 1e38f);
}

TEST(FastMath, VectorisedLoopsEqualScalarCalls) {
  // The kernels' determinism rests on each result depending only on its argument: a vectorised loop must give
  // the bits a scalar call gives, whatever the lane and the tail.
  const std::vector<float> x = grid(-100.0, 100.0, 0.0123);
  const int64_t count = static_cast<int64_t>(x.size());
  std::vector<float> vector_exp(x.size()), vector_sigmoid(x.size());
#pragma omp simd
  for (int64_t i = 0; i < count; ++i) {
    vector_exp[i] = exp_approx(x[i]);
    vector_sigmoid[i] = sigmoid_approx(x[i]);
  }
  for (int64_t i = 0; i < count; ++i) {
    ASSERT_EQ(vector_exp[i], scalar_exp(x[i])) << x[i];
    ASSERT_EQ(vector_sigmoid[i], scalar_sigmoid(x[i])) << x[i];
  }
}

TEST(FastMath, SigmoidCloseToLibmAndSaturates) {
  const std::vector<float> x = grid(-30.0, 30.0, 1.0 / 4096.0);
  double worst = 0.0;
  for (float value : x) {
    const double exact = 1.0 / (1.0 + std::exp(-static_cast<double>(value)));
    worst = std::max(worst, ulp_error(sigmoid_approx(value), exact));
  }
  report_error("sigmoid_approx vs 1/(1+exp(-x)), ulp over [-30, 30)", worst, 3.0);
  EXPECT_LE(worst, 3.0);
  EXPECT_EQ(sigmoid_approx(100.0f), 1.0f);
  EXPECT_EQ(sigmoid_approx(std::numeric_limits<float>::infinity()), 1.0f);
  const float tiny = sigmoid_approx(-1000.0f);
  EXPECT_TRUE(std::isfinite(tiny) && tiny >= 0.0f && tiny < 1e-37f);
}

TEST(FastMath, SinCosMatchLibmForRopeAngles) {
  // The angles RoPE forms: position * theta^(-2i/d) in double, positions up to the int32 limit.
  double worst = 0.0;
  int64_t float_mismatches = 0, count = 0;
  const std::vector<int32_t> positions = {0,      1,       2,        3,         7,         100,
                                          1023,   4095,    12345,    39999,     40000,     65535,
                                          131071, 1000000, 16777215, 123456789, 2147483647};
  for (double theta : {1e4, 1e6}) {
    for (int32_t position : positions) {
      for (int64_t i = 0; i < 64; ++i) {
        const double angle =
            static_cast<double>(position) * std::pow(theta, -2.0 * static_cast<double>(i) / 128.0);
        double sine = 0.0, cosine = 0.0;
        sincos_approx(angle, sine, cosine);
        worst = std::max({worst, std::fabs(sine - std::sin(angle)), std::fabs(cosine - std::cos(angle))});
        float_mismatches += (static_cast<float>(sine) != static_cast<float>(std::sin(angle))) +
                            (static_cast<float>(cosine) != static_cast<float>(std::cos(angle)));
        count += 2;
      }
    }
  }
  // Negative angles and a dense sweep of small ones (every quadrant and the reduction boundaries).
  for (double angle = -20.0; angle < 20.0; angle += 1.0 / 1024.0) {
    double sine = 0.0, cosine = 0.0;
    sincos_approx(angle, sine, cosine);
    worst = std::max({worst, std::fabs(sine - std::sin(angle)), std::fabs(cosine - std::cos(angle))});
  }
  report_error("sincos_approx vs sin/cos, absolute", worst, 1e-14);
  EXPECT_LE(worst, 1e-14);
  // Rounded to float they agree with libm almost everywhere (a double error of 1e-15 flips a float rounding
  // only when the exact value sits within 1e-15 of a float tie).
  std::printf("[ info  ] sincos_approx: %lld of %lld float roundings differ from libm's\n",
              static_cast<long long>(float_mismatches), static_cast<long long>(count));
  EXPECT_LE(float_mismatches, count / 1000);
  double sine = 1.0, cosine = 0.0;
  sincos_approx(0.0, sine, cosine);
  EXPECT_EQ(sine, 0.0);
  EXPECT_EQ(cosine, 1.0);
}

}  // namespace
