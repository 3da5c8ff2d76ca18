// Column slices of row-major tensors: a block of columns copied from one tensor into another of a different
// row width (each source row to `repeat` consecutive destination rows), and its transpose, which sums those
// rows back. Multi-head latent attention (model/layers/mla.cpp) assembles its heads with it: the RoPE columns
// of q, keys from their non-rotary part and one shared rotary key broadcast over the heads, and values
// zero-padded to the query / key width.
// Legend: R source rows, W columns copied, repeat destination rows per source row; a stride is a row's
// width in floats, and every pointer points at the first copied column of its tensor's first row.
#pragma once

#include <cstdint>

#include "meshtrain/kernels/signatures.h"

namespace meshtrain::kernels {

// For r < R, t < repeat, j < W: out[(r * repeat + t) * out_stride + j] = x[r * x_stride + j];
// x == nullptr writes zeros instead. Other columns of out are left as they are.
ColumnSliceForward column_slice_forward;

// The transpose: dx[r * dx_stride + j] = sum over t < repeat of dout[(r * repeat + t) * dout_stride + j]
// (written, summed in t order). Other columns of dx are left as they are.
ColumnSliceBackward column_slice_backward;

template <class T>
void column_slice_reference_forward(T* out, const T* x, int64_t R, int64_t W, int64_t repeat,
                                    int64_t out_stride, int64_t x_stride) {
  for (int64_t r = 0; r < R; ++r)
    for (int64_t t = 0; t < repeat; ++t)
      for (int64_t j = 0; j < W; ++j)
        out[(r * repeat + t) * out_stride + j] = x == nullptr ? T(0) : x[r * x_stride + j];
}

template <class T>
void column_slice_reference_backward(T* dx, const T* dout, int64_t R, int64_t W, int64_t repeat,
                                     int64_t dx_stride, int64_t dout_stride) {
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t j = 0; j < W; ++j) {
      T sum = T(0);
      for (int64_t t = 0; t < repeat; ++t) sum += dout[(r * repeat + t) * dout_stride + j];
      dx[r * dx_stride + j] = sum;
    }
  }
}

}  // namespace meshtrain::kernels
