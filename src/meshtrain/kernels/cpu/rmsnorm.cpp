#include "meshtrain/kernels/cpu/rmsnorm.h"

#include <algorithm>
#include <cmath>

#include "meshtrain/kernels/cpu/store.h"

namespace meshtrain::kernels {
namespace {

// Columns per OpenMP task in the dw reduction: each column is owned by one thread and summed in token order,
// which keeps dw deterministic without per-thread scratch.
constexpr int64_t kColumnBlock = 32;

// rmsnorm_streams_forward into float32 or bfloat16 rows (store.h): the same arithmetic for both.
template <class Out>
void rmsnorm_rows(Out* out, float* rstd, const float* x, const float* w, int64_t N, int64_t G, int64_t D,
                  float eps) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N * G; ++n) {
    const float* row = x + n * D;
    const float* scale = w + (n % G) * D;
    Out* target = out + n * D;
    float sum_squares = 0.0f;
#pragma omp simd reduction(+ : sum_squares)
    for (int64_t j = 0; j < D; ++j) sum_squares += row[j] * row[j];
    const float r = 1.0f / std::sqrt(sum_squares / static_cast<float>(D) + eps);
    rstd[n] = r;
    for (int64_t j = 0; j < D; ++j) store(target + j, scale[j] * (row[j] * r));
  }
}

}  // namespace

void rmsnorm_forward(float* out, float* rstd, const float* x, const float* w, int64_t N, int64_t D,
                     float eps) {
  rmsnorm_rows(out, rstd, x, w, N, 1, D, eps);
}

void rmsnorm_forward_bf16(uint16_t* out, float* rstd, const float* x, const float* w, int64_t N, int64_t D,
                          float eps) {
  rmsnorm_rows(out, rstd, x, w, N, 1, D, eps);
}

void rmsnorm_backward(float* dx, float* dw, const float* dout, const float* x, const float* w,
                      const float* rstd, int64_t N, int64_t D, bool accumulate_dx) {
  rmsnorm_streams_backward(dx, dw, dout, x, w, rstd, N, 1, D, accumulate_dx);
}

void rmsnorm_streams_forward(float* out, float* rstd, const float* x, const float* w, int64_t N, int64_t G,
                             int64_t D, float eps) {
  rmsnorm_rows(out, rstd, x, w, N, G, D, eps);
}

void rmsnorm_streams_backward(float* dx, float* dw, const float* dout, const float* x, const float* w,
                              const float* rstd, int64_t N, int64_t G, int64_t D, bool accumulate_dx) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N * G; ++n) {
    const float* scale = w + (n % G) * D;
    const float* row = x + n * D;
    const float* grad = dout + n * D;
    float* target = dx + n * D;
    const float r = rstd[n];
    float projection = 0.0f;
#pragma omp simd reduction(+ : projection)
    for (int64_t j = 0; j < D; ++j) projection += scale[j] * grad[j] * row[j];
    // dx = r * w * dout - x * r^3 * mean(w * dout * x)
    const float x_scale = r * r * r * projection / static_cast<float>(D);
    if (accumulate_dx) {
      for (int64_t j = 0; j < D; ++j) target[j] += r * scale[j] * grad[j] - row[j] * x_scale;
    } else {
      for (int64_t j = 0; j < D; ++j) target[j] = r * scale[j] * grad[j] - row[j] * x_scale;
    }
  }

  // dw [G, D] as G D columns of the [N, G D] token rows; a block never straddles two streams, so one rstd
  // per token and block.
  const int64_t blocks_per_stream = (D + kColumnBlock - 1) / kColumnBlock;
  const int64_t width_all = G * D;
#pragma omp parallel for schedule(static)
  for (int64_t block = 0; block < G * blocks_per_stream; ++block) {
    const int64_t stream = block / blocks_per_stream;
    const int64_t begin = stream * D + (block % blocks_per_stream) * kColumnBlock;
    const int64_t width = std::min(kColumnBlock, (stream + 1) * D - begin);
    float sum[kColumnBlock] = {};
    for (int64_t n = 0; n < N; ++n) {
      const float* row = x + n * width_all + begin;
      const float* grad = dout + n * width_all + begin;
      const float r = rstd[n * G + stream];
      for (int64_t j = 0; j < width; ++j) sum[j] += grad[j] * row[j] * r;
    }
    for (int64_t j = 0; j < width; ++j) dw[begin + j] += sum[j];
  }
}

}  // namespace meshtrain::kernels
