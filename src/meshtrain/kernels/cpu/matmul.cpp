#include "meshtrain/kernels/cpu/matmul.h"

#include <cblas.h>

#include <algorithm>
#include <climits>
#include <cstring>

#include "meshtrain/core/error.h"

namespace meshtrain::kernels {
namespace {

// Columns per OpenMP task in the bias reduction: each column is summed by one thread in token order.
constexpr int64_t kColumnBlock = 32;

blasint to_blas(int64_t size) {
  MT_CHECK(size >= 0 && size <= INT_MAX, "matmul dimension " + to_text(size) + " does not fit a BLAS int");
  return static_cast<blasint>(size);
}

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
  // BLAS rejects a zero leading dimension, so an empty reduction is handled above.
  if (I == 0) return;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, to_blas(N), to_blas(O), to_blas(I), 1.0f, x,
              to_blas(I), w, to_blas(O), bias != nullptr ? 1.0f : 0.0f, out, to_blas(O));
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
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, to_blas(N), to_blas(I), to_blas(O), 1.0f, dout,
                to_blas(O), w, to_blas(O), accumulate_dx ? 1.0f : 0.0f, dx, to_blas(I));
  }
  if (dw != nullptr) {
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, to_blas(I), to_blas(O), to_blas(N), 1.0f, x,
                to_blas(I), dout, to_blas(O), 1.0f, dw, to_blas(O));
  }
}

}  // namespace meshtrain::kernels
