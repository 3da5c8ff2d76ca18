#include "meshtrain/kernels/cpu/matmul.h"

#include <algorithm>
#include <cstring>

#include "meshtrain/kernels/cpu/gemm.h"

namespace meshtrain::kernels {
namespace {

// Columns per OpenMP task in the bias reduction: each column is summed by one thread in token order.
constexpr int64_t kColumnBlock = 32;

}  // namespace

void matmul_forward(float* out, const float* x, const float* w, const float* bias, int64_t N, int64_t I,
                    int64_t O) {
  if (N == 0 || O == 0) return;
  if (bias != nullptr) {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; ++n) std::memcpy(out + n * O, bias, static_cast<size_t>(O) * sizeof(float));
  } else if (I == 0) {
    std::fill(out, out + N * O, 0.0f);
  }
  if (I == 0) return;
  gemm(false, false, N, O, I, x, I, w, O, bias != nullptr, out, O);
}

void matmul_backward(float* dx, float* dw, float* dbias, const float* dout, const float* x, const float* w,
                     int64_t N, int64_t I, int64_t O, bool accumulate_dx) {
  if (dbias != nullptr && O > 0) {
    const int64_t blocks = (O + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static)
    for (int64_t block = 0; block < blocks; ++block) {
      const int64_t begin = block * kColumnBlock;
      const int64_t width = std::min(kColumnBlock, O - begin);
      float sum[kColumnBlock] = {};
      for (int64_t n = 0; n < N; ++n) {
        const float* row = dout + n * O + begin;
        for (int64_t j = 0; j < width; ++j) sum[j] += row[j];
      }
      for (int64_t j = 0; j < width; ++j) dbias[begin + j] += sum[j];
    }
  }
  if (N == 0 || I == 0) return;
  if (O == 0) {
    if (dx != nullptr && !accumulate_dx) std::fill(dx, dx + N * I, 0.0f);
    return;
  }
  if (dx != nullptr) {
    gemm(false, true, N, I, O, dout, O, w, O, accumulate_dx, dx, I);
  }
  if (dw != nullptr) {
    gemm(true, false, I, O, N, x, I, dout, O, true, dw, O);
  }
}

}  // namespace meshtrain::kernels
