#include "meshtrain/kernels/cpu/rope.h"

#include <algorithm>
#include <cmath>

#include "meshtrain/core/error.h"
#include "meshtrain/kernels/cpu/fast_math.h"

namespace meshtrain::kernels {
namespace {

// Pairs handled together: their frequencies are computed once per thread and call, their cos/sin once per
// token and reused by every head. A fixed stack block avoids both heap scratch and a limit on d.
constexpr int64_t kPairBlock = 32;

// Rotates every pair by sign * angle: +1 is the forward pass, -1 its transpose (the backward pass).
// cos/sin of a token depend only on its position and the pair (angle = position * theta^(-2i/d) in double,
// exactly as the reference forms it, then sincos_approx in double rounded to float), so results do not
// depend on the other tokens, the thread count or the blocking.
void rotate(float* out, const float* x, const int32_t* positions, int64_t N, int64_t H, int64_t d,
            float theta, float sign) {
  MT_CHECK(d % 2 == 0, "rope head width " + to_text(d) + " is odd");
  const int64_t half = d / 2;
  const double theta_d = static_cast<double>(theta);
  // Every thread walks the same pair blocks; a token's pairs of one block belong to one thread, and different
  // blocks touch disjoint elements, so no barrier is needed between blocks (nowait).
#pragma omp parallel if (N * H * d >= (int64_t{1} << 14))
  for (int64_t begin = 0; begin < half; begin += kPairBlock) {
    const int64_t width = std::min(kPairBlock, half - begin);
    double inverse_frequency[kPairBlock];
    for (int64_t j = 0; j < width; ++j) inverse_frequency[j] = rope_inverse_frequency(begin + j, d, theta_d);
#pragma omp for schedule(static) nowait
    for (int64_t n = 0; n < N; ++n) {
      alignas(64) float c[kPairBlock], s[kPairBlock];
      const double position = static_cast<double>(positions[n]);
#pragma omp simd
      for (int64_t j = 0; j < width; ++j) {
        double sine, cosine;
        sincos_approx(position * inverse_frequency[j], sine, cosine);
        c[j] = static_cast<float>(cosine);
        s[j] = sign * static_cast<float>(sine);
      }
      for (int64_t h = 0; h < H; ++h) {
        const float* source = x + (n * H + h) * d + begin;
        float* target = out + (n * H + h) * d + begin;
        // Safe in place: iteration j touches only elements j and j + half, and width <= half.
#pragma omp simd
        for (int64_t j = 0; j < width; ++j) {
          const float first = source[j], second = source[j + half];
          target[j] = first * c[j] - second * s[j];
          target[j + half] = second * c[j] + first * s[j];
        }
      }
    }
  }
}

}  // namespace

void rope_forward(float* out, const float* x, const int32_t* positions, int64_t N, int64_t H, int64_t d,
                  float theta) {
  rotate(out, x, positions, N, H, d, theta, 1.0f);
}

void rope_backward(float* dx, const float* dout, const int32_t* positions, int64_t N, int64_t H, int64_t d,
                   float theta) {
  rotate(dx, dout, positions, N, H, d, theta, -1.0f);
}

}  // namespace meshtrain::kernels
