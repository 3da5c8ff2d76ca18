#include "meshtrain/kernels/cpu/layernorm.h"

#include <algorithm>
#include <cmath>

#include "meshtrain/kernels/cpu/store.h"

namespace meshtrain::kernels {
namespace {

// Columns per OpenMP task in the dw/db reduction: each column is owned by one thread and summed in token
// order, which keeps the result deterministic without per-thread scratch.
constexpr int64_t kColumnBlock = 32;

// layernorm_forward into float32 or bfloat16 rows (store.h): the same arithmetic for both.
template <class Out>
void layernorm_rows(Out* out, float* mean, float* rstd, const float* x, const float* w, const float* b,
                    int64_t N, int64_t D, float eps) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* row = x + n * D;
    Out* target = out + n * D;
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < D; ++j) sum += row[j];
    const float m = sum / static_cast<float>(D);
    // Two passes: E[x^2] - mean^2 cancels catastrophically when |mean| >> std.
    float sum_squares = 0.0f;
#pragma omp simd reduction(+ : sum_squares)
    for (int64_t j = 0; j < D; ++j) sum_squares += (row[j] - m) * (row[j] - m);
    const float r = 1.0f / std::sqrt(sum_squares / static_cast<float>(D) + eps);
    mean[n] = m;
    rstd[n] = r;
    for (int64_t j = 0; j < D; ++j) store(target + j, (row[j] - m) * r * w[j] + b[j]);
  }
}

}  // namespace

void layernorm_forward(float* out, float* mean, float* rstd, const float* x, const float* w, const float* b,
                       int64_t N, int64_t D, float eps) {
  layernorm_rows(out, mean, rstd, x, w, b, N, D, eps);
}

void layernorm_forward_bf16(uint16_t* out, float* mean, float* rstd, const float* x, const float* w,
                            const float* b, int64_t N, int64_t D, float eps) {
  layernorm_rows(out, mean, rstd, x, w, b, N, D, eps);
}

void layernorm_backward(float* dx, float* dw, float* db, const float* dout, const float* x, const float* w,
                        const float* mean, const float* rstd, int64_t N, int64_t D, bool accumulate_dx) {
  const float inv_d = 1.0f / static_cast<float>(D);
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* row = x + n * D;
    const float* grad = dout + n * D;
    float* target = dx + n * D;
    const float m = mean[n], r = rstd[n];
    float sum_g = 0.0f, sum_g_xhat = 0.0f;
#pragma omp simd reduction(+ : sum_g, sum_g_xhat)
    for (int64_t j = 0; j < D; ++j) {
      const float g = w[j] * grad[j];
      sum_g += g;
      sum_g_xhat += g * (row[j] - m) * r;
    }
    const float mean_g = sum_g * inv_d, mean_g_xhat = sum_g_xhat * inv_d;
    if (accumulate_dx) {
      for (int64_t j = 0; j < D; ++j) {
        target[j] += r * (w[j] * grad[j] - mean_g - (row[j] - m) * r * mean_g_xhat);
      }
    } else {
      for (int64_t j = 0; j < D; ++j) {
        target[j] = r * (w[j] * grad[j] - mean_g - (row[j] - m) * r * mean_g_xhat);
      }
    }
  }

  const int64_t blocks = (D + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static)
  for (int64_t block = 0; block < blocks; ++block) {
    const int64_t begin = block * kColumnBlock;
    const int64_t width = std::min(kColumnBlock, D - begin);
    float sum_w[kColumnBlock] = {}, sum_b[kColumnBlock] = {};
    for (int64_t n = 0; n < N; ++n) {
      const float* row = x + n * D + begin;
      const float* grad = dout + n * D + begin;
      const float m = mean[n], r = rstd[n];
      for (int64_t j = 0; j < width; ++j) {
        sum_w[j] += grad[j] * (row[j] - m) * r;
        sum_b[j] += grad[j];
      }
    }
    for (int64_t j = 0; j < width; ++j) {
      dw[begin + j] += sum_w[j];
      db[begin + j] += sum_b[j];
    }
  }
}

}  // namespace meshtrain::kernels
