// Vectorisable replacements for libm functions in the CPU kernels' inner loops. std::exp, std::tanh and
// std::cos are scalar libm calls at -O2/-O3, so a loop that calls them runs one element at a time; these are
// plain arithmetic (no calls, no branches, no tables) so that `omp simd` loops and GCC's vectoriser turn them
// into 16-float (8-double) AVX-512 code. Accuracy is tested against libm in
// tests/unit/kernels/test_fast_math.cpp.
//
// Every function is evaluated by the same operations in the same order whether the compiler vectorises a loop
// or not: results depend only on the argument, never on the lane or the neighbours.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

namespace meshtrain::kernels {

// exp(x) for float. Cephes expf: x = n ln2 + r with |r| <= ln2/2, degree-6 polynomial for exp(r), 2^n built
// in the exponent bits; within 1.02 ulp of the exact exp over [-87, 88] (a dense grid in the test), exactly
// 1 at 0. Results below the smallest normal float (x < -87, which includes -inf) return exactly 0, so masked
// -inf scores contribute nothing. Above 88 the argument is clamped: exp(88) = 1.65e38 is returned (finite,
// where std::exp gives inf for x > 88.72), so 1 / (1 + exp_approx(x)) is a tiny positive number, not 0.
// Callers never pass NaN.
inline float exp_approx(float x) {
  constexpr float kLowest = -87.0f, kHighest = 88.0f;
  // Branch-free on purpose: written with `x < kLowest ? 0 : ...` GCC turns the function into branches inside
  // some loops (a sum in double next to it was enough) and then cannot vectorise them. The clamp selects
  // values (vmaxps / vminps); std::max / std::min return references to their constant arguments, which GCC 12
  // keeps in memory and then vectorises only with AVX-512's masked moves: on AVX2 every loop calling this
  // ran scalar (GELU at 0.8 GB/s on Zen 3). The underflow case clears the exponent bits with an integer mask.
  const float floored = x > kLowest ? x : kLowest;
  const float clamped = floored < kHighest ? floored : kHighest;
  // Round to nearest integer by adding 1.5 * 2^23 (pushes the fraction bits out of the mantissa).
  constexpr float kRound = 12582912.0f;
  const float n = (clamped * 1.44269504088896341f + kRound) - kRound;
  float r = clamped - n * 0.693359375f;  // ln2 split in a short high part (exact product) ...
  r = r - n * -2.12194440e-4f;           // ... and the remainder
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  // n is in [-126, 127] after the clamp, so the biased exponent is a normal float's. Below the range the
  // mask is 0, 2^n becomes +0 and the result exactly 0.
  const int32_t keep = -static_cast<int32_t>(x >= kLowest);
  const float two_to_n = std::bit_cast<float>(((static_cast<int32_t>(n) + 127) << 23) & keep);
  return p * two_to_n;
}

// 1 / (1 + exp(-x)) within 2.2 ulp (test): in [0, 1], exactly 1 for x > 87 and a tiny positive number (not 0)
// for x < -88.
inline float sigmoid_approx(float x) {
  return 1.0f / (1.0f + exp_approx(-x));
}

// sin(a) and cos(a) for double, |a| < 2^31. Cody-Waite reduction by pi/2 in two parts with fused
// multiply-adds (the first product is exact inside the fma; the second part's own error is ~1e-33 |a|), then
// fdlibm's degree-13 / degree-14 minimax polynomials on [-pi/4, pi/4]. Within about 1e-16 of libm for the
// angles RoPE forms (int32 positions times frequencies <= 1; see the test); rounded to float the results
// equal libm's except where the exact value sits within ~1e-16 of a float rounding tie.
inline void sincos_approx(double a, double& sine, double& cosine) {
  constexpr double kTwoOverPi = 6.36619772367581382433e-01;
  constexpr double kPiOver2High = 1.57079632679489655800e+00;  // double(pi/2)
  constexpr double kPiOver2Low = 6.12323399573676603587e-17;   // pi/2 - kPiOver2High
  constexpr double kRound = 6755399441055744.0;                // 1.5 * 2^52: round to nearest integer
  const double k = (a * kTwoOverPi + kRound) - kRound;
  double r = std::fma(-k, kPiOver2High, a);
  r = std::fma(-k, kPiOver2Low, r);
  const int64_t quadrant = static_cast<int64_t>(k);
  const double z = r * r;
  double s = 1.58969099521155010221e-10;
  s = s * z - 2.50507602534068634195e-08;
  s = s * z + 2.75573137070700676789e-06;
  s = s * z - 1.98412698298579493134e-04;
  s = s * z + 8.33333333332248946124e-03;
  s = s * z - 1.66666666666666324348e-01;
  const double sin_r = r + r * z * s;
  double c = -1.13596475577881948265e-11;
  c = c * z + 2.08757232129817482790e-09;
  c = c * z - 2.75573143513906633035e-07;
  c = c * z + 2.48015872894767294178e-05;
  c = c * z - 1.38888888888741095749e-03;
  c = c * z + 4.16666666666666019037e-02;
  const double cos_r = (1.0 - 0.5 * z) + z * z * c;
  // Quadrant q = k mod 4: (sin, cos) = (s, c), (c, -s), (-s, -c), (-c, s).
  const bool swap = (quadrant & 1) != 0;
  const bool negate_sine = (quadrant & 2) != 0;
  const bool negate_cosine = ((quadrant + 1) & 2) != 0;
  const double sine_abs = swap ? cos_r : sin_r;
  const double cosine_abs = swap ? sin_r : cos_r;
  sine = negate_sine ? -sine_abs : sine_abs;
  cosine = negate_cosine ? -cosine_abs : cosine_abs;
}

}  // namespace meshtrain::kernels
