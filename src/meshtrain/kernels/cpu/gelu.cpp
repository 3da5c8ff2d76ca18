#include "meshtrain/kernels/cpu/gelu.h"

#include <cmath>
#include <numbers>

#include "meshtrain/kernels/cpu/fast_math.h"

namespace meshtrain::kernels {
namespace {

// Below this many values a parallel region costs more than it saves.
constexpr int64_t kParallelMinimum = 1 << 14;

// sqrt(2 / pi), rounded once to float.
const float kScale = static_cast<float>(std::sqrt(2.0 / std::numbers::pi));
constexpr float kCubic = 0.044715f;

}  // namespace

void gelu_forward(float* out, const float* x, int64_t count) {
#pragma omp parallel for simd schedule(static) if (count >= kParallelMinimum)
  for (int64_t i = 0; i < count; ++i) {
    const float v = x[i];
    out[i] = 0.5f * v * (1.0f + tanh_approx(kScale * (v + kCubic * v * v * v)));
  }
}

void gelu_backward(float* dx, const float* dout, const float* x, int64_t count) {
#pragma omp parallel for simd schedule(static) if (count >= kParallelMinimum)
  for (int64_t i = 0; i < count; ++i) {
    const float v = x[i];
    const float t = tanh_approx(kScale * (v + kCubic * v * v * v));
    const float slope =
        0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * kScale * (1.0f + 3.0f * kCubic * v * v);
    dx[i] = dout[i] * slope;
  }
}

}  // namespace meshtrain::kernels
