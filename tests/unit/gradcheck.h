// Shared helpers for kernel tests: central finite differences in double precision and error measures.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "meshtrain/core/dtype.h"

namespace meshtrain::testing {

// Deterministic test data: uniform in [low, high).
inline std::vector<double> random_values(size_t count, uint64_t seed, double low = -1.0, double high = 1.0) {
  std::mt19937_64 generator(seed);
  std::uniform_real_distribution<double> distribution(low, high);
  std::vector<double> values(count);
  for (double& value : values) value = distribution(generator);
  return values;
}

inline std::vector<float> to_float(const std::vector<double>& values) {
  return std::vector<float>(values.begin(), values.end());
}

// max|a - b| / max(max|a|, max|b|, 1e-30): one number per tensor, insensitive to scale.
template <class A, class B>
double relative_error(const std::vector<A>& a, const std::vector<B>& b) {
  double max_difference = 0.0, max_magnitude = 1e-30;
  for (size_t i = 0; i < a.size(); ++i) {
    max_difference = std::max(max_difference, std::fabs(double(a[i]) - double(b[i])));
    max_magnitude = std::max({max_magnitude, std::fabs(double(a[i])), std::fabs(double(b[i]))});
  }
  return max_difference / max_magnitude;
}

// d loss / d x[i] by central differences; `loss` reads x (which is perturbed in place and restored).
inline std::vector<double> numeric_gradient(const std::function<double()>& loss, std::vector<double>& x,
                                            double step = 1e-6) {
  std::vector<double> gradient(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    x[i] = saved + step;
    const double plus = loss();
    x[i] = saved - step;
    const double minus = loss();
    x[i] = saved;
    gradient[i] = (plus - minus) / (2.0 * step);
  }
  return gradient;
}

// Weighted sum used as a scalar loss: L = sum(weights * values), so dL/dvalues = weights.
inline double weighted_sum(const std::vector<double>& values, const std::vector<double>& weights) {
  double total = 0.0;
  for (size_t i = 0; i < values.size(); ++i) total += values[i] * weights[i];
  return total;
}

// Prints the measured error so test logs show how close each check is to its bound.
inline void report_error(const std::string& what, double error, double bound) {
  std::printf("[ error ] %-48s %.3e (bound %.1e)\n", what.c_str(), error, bound);
}

inline std::vector<double> to_double(const std::vector<float>& values) {
  return {values.begin(), values.end()};
}

inline std::vector<double> scaled(std::vector<double> values, double factor) {
  for (double& value : values) value *= factor;
  return values;
}

// relative_error skips NaN, so non-finite outputs are rejected separately.
inline void expect_close(const std::string& what, const std::vector<float>& fast,
                         const std::vector<double>& reference, double bound) {
  ASSERT_EQ(fast.size(), reference.size()) << what;
  for (float value : fast) ASSERT_TRUE(std::isfinite(value)) << what;
  const double error = relative_error(fast, reference);
  report_error(what, error, bound);
  EXPECT_LT(error, bound) << what;
}

// A producer's bf16 output (dtype=bfloat16, an activation only matmuls read) is bitwise its float32 output
// rounded to nearest even: same arithmetic, one rounding as it is written.
inline void expect_bf16_of(const std::string& what, const std::vector<uint16_t>& bits,
                           const std::vector<float>& values) {
  ASSERT_EQ(bits.size(), values.size()) << what;
  size_t mismatches = 0;
  for (size_t i = 0; i < values.size(); ++i) mismatches += bits[i] != bfloat16_from_float(values[i]);
  EXPECT_EQ(mismatches, 0u) << what << ": values that are not the float32 output rounded";
}

inline void expect_gradient(const std::string& what, const std::vector<double>& analytic,
                            const std::vector<double>& numeric) {
  // Smooth op in double with step 1e-6: truncation ~ step^2 * |f'''| ~ 1e-12 and rounding
  // ~ 1e-16 * |loss| / step ~ 1e-9, both far below 1e-7.
  const double bound = 1e-7;
  const double error = relative_error(analytic, numeric);
  report_error(what, error, bound);
  EXPECT_LT(error, bound) << what;
}

}  // namespace meshtrain::testing
