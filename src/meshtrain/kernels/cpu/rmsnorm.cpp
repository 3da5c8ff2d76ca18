#include "meshtrain/kernels/cpu/rmsnorm.h"

#include <algorithm>
#include <cmath>

namespace meshtrain::kernels {
namespace {

// Columns per OpenMP task in the dw reduction: each column is owned by one thread and summed in token order,
// which keeps dw deterministic without per-thread scratch.
constexpr int64_t kColumnBlock = 32;

}  // namespace

void rmsnorm_forward(float* out, float* rstd, const float* x, const float* w, int64_t N, int64_t D,
                     float eps) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* row = x + n * D;
    float* target = out + n * D;
    float sum_squares = 0.0f;
#pragma omp simd reduction(+ : sum_squares)
    for (int64_t j = 0; j < D; ++j) sum_squares += row[j] * row[j];
    const float r = 1.0f / std::sqrt(sum_squares / static_cast<float>(D) + eps);
    rstd[n] = r;
    for (int64_t j = 0; j < D; ++j) target[j] = w[j] * (row[j] * r);
  }
}

void rmsnorm_backward(float* dx, float* dw, const float* dout, const float* x, const float* w,
                      const float* rstd, int64_t N, int64_t D, bool accumulate_dx) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* row = x + n * D;
    const float* grad = dout + n * D;
    float* target = dx + n * D;
    const float r = rstd[n];
    float projection = 0.0f;
#pragma omp simd reduction(+ : projection)
    for (int64_t j = 0; j < D; ++j) projection += w[j] * grad[j] * row[j];
    // dx = r * w * dout - x * r^3 * mean(w * dout * x)
    const float x_scale = r * r * r * projection / static_cast<float>(D);
    if (accumulate_dx) {
      for (int64_t j = 0; j < D; ++j) target[j] += r * w[j] * grad[j] - row[j] * x_scale;
    } else {
      for (int64_t j = 0; j < D; ++j) target[j] = r * w[j] * grad[j] - row[j] * x_scale;
    }
  }

  const int64_t blocks = (D + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static)
  for (int64_t block = 0; block < blocks; ++block) {
    const int64_t begin = block * kColumnBlock;
    const int64_t width = std::min(kColumnBlock, D - begin);
    float sum[kColumnBlock] = {};
    for (int64_t n = 0; n < N; ++n) {
      const float* row = x + n * D + begin;
      const float* grad = dout + n * D + begin;
      const float r = rstd[n];
      for (int64_t j = 0; j < width; ++j) sum[j] += grad[j] * row[j] * r;
    }
    for (int64_t j = 0; j < width; ++j) dw[begin + j] += sum[j];
  }
}

}  // namespace meshtrain::kernels
