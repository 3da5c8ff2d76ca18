#include "meshtrain/kernels/cpu/rope.h"

#include <algorithm>
#include <cmath>

#include "meshtrain/core/error.h"

namespace meshtrain::kernels {
namespace {

// Pairs whose cos/sin are computed once per token and reused by every head; a fixed stack block avoids
// both heap scratch and a limit on d.
constexpr int64_t kPairBlock = 32;

// Rotates every pair by sign * angle: +1 is the forward pass, -1 its transpose (the backward pass).
void rotate(float* out, const float* x, const int32_t* positions, int64_t N, int64_t H, int64_t d,
            float theta, float sign) {
  MT_CHECK(d % 2 == 0, "rope head width " + to_text(d) + " is odd");
  const int64_t half = d / 2;
  const double theta_d = static_cast<double>(theta);
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t begin = 0; begin < half; begin += kPairBlock) {
      const int64_t width = std::min(kPairBlock, half - begin);
      float c[kPairBlock], s[kPairBlock];
      for (int64_t j = 0; j < width; ++j) {
        const double angle = rope_angle(positions[n], begin + j, d, theta_d);
        c[j] = static_cast<float>(std::cos(angle));
        s[j] = sign * static_cast<float>(std::sin(angle));
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
