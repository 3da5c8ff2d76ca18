// Grouped matmul of the routed experts: rows sorted by expert (moe_route_plan's offsets), each expert's
// segment multiplied by that expert's weight matrix. Weights are stored [E, I, O] (one [I, O] "kernel"
// matrix per expert, as matmul.h). Legend: E experts, I / O input / output width, R = offsets[E] rows.
#pragma once

#include <cstdint>

#include "meshtrain/kernels/signatures.h"

namespace meshtrain::kernels {

// out rows [offsets[e], offsets[e + 1]) = x rows [offsets[e], offsets[e + 1]) @ w[e], through the GEMM seam
// (gemm.h), one product per non-empty segment. offsets[0] = 0 and offsets ascend.
GroupedMatmulForward grouped_matmul_forward;

// d_x = d_out @ w[e]^T per segment (written); d_w[e] += x^T @ d_out per segment (an expert with no rows
// keeps its d_w). Either may be nullptr to skip it.
GroupedMatmulBackward grouped_matmul_backward;

template <class T>
void grouped_matmul_reference_forward(T* out, const T* x, const T* w, const int32_t* offsets, int64_t E,
                                      int64_t I, int64_t O) {
  for (int64_t e = 0; e < E; ++e) {
    const T* we = w + e * I * O;
    for (int64_t r = offsets[e]; r < offsets[e + 1]; ++r) {
      for (int64_t o = 0; o < O; ++o) {
        T sum = T(0);
        for (int64_t i = 0; i < I; ++i) sum += x[r * I + i] * we[i * O + o];
        out[r * O + o] = sum;
      }
    }
  }
}

template <class T>
void grouped_matmul_reference_backward(T* d_x, T* d_w, const T* d_out, const T* x, const T* w,
                                       const int32_t* offsets, int64_t E, int64_t I, int64_t O) {
  for (int64_t e = 0; e < E; ++e) {
    const T* we = w + e * I * O;
    for (int64_t r = offsets[e]; r < offsets[e + 1]; ++r) {
      for (int64_t i = 0; i < I; ++i) {
        if (d_x != nullptr) {
          T sum = T(0);
          for (int64_t o = 0; o < O; ++o) sum += d_out[r * O + o] * we[i * O + o];
          d_x[r * I + i] = sum;
        }
        if (d_w != nullptr) {
          for (int64_t o = 0; o < O; ++o) d_w[e * I * O + i * O + o] += x[r * I + i] * d_out[r * O + o];
        }
      }
    }
  }
}

}  // namespace meshtrain::kernels
