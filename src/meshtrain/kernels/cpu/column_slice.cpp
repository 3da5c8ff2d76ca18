// Column slices (column_slice.h): rows split over threads, each row's columns one contiguous simd loop, so
// results do not depend on the thread count (the backward's sum runs in t order within a row).
#include "meshtrain/kernels/cpu/column_slice.h"

namespace meshtrain::kernels {

void column_slice_forward(float* out, const float* x, int64_t R, int64_t W, int64_t repeat,
                          int64_t out_stride, int64_t x_stride) {
#pragma omp parallel for schedule(static) if (R * repeat * W >= (int64_t{1} << 15))
  for (int64_t row = 0; row < R * repeat; ++row) {
    float* target = out + row * out_stride;
    if (x == nullptr) {
#pragma omp simd
      for (int64_t j = 0; j < W; ++j) target[j] = 0.0f;
      continue;
    }
    const float* source = x + (row / repeat) * x_stride;
#pragma omp simd
    for (int64_t j = 0; j < W; ++j) target[j] = source[j];
  }
}

void column_slice_backward(float* dx, const float* dout, int64_t R, int64_t W, int64_t repeat,
                           int64_t dx_stride, int64_t dout_stride) {
#pragma omp parallel for schedule(static) if (R * repeat * W >= (int64_t{1} << 15))
  for (int64_t r = 0; r < R; ++r) {
    float* target = dx + r * dx_stride;
    const float* first = dout + r * repeat * dout_stride;
#pragma omp simd
    for (int64_t j = 0; j < W; ++j) target[j] = first[j];
    for (int64_t t = 1; t < repeat; ++t) {
      const float* source = first + t * dout_stride;
#pragma omp simd
      for (int64_t j = 0; j < W; ++j) target[j] += source[j];
    }
  }
}

}  // namespace meshtrain::kernels
