// Dense projection y = x @ w (+ bias) used by every linear layer; weights are stored [in, out] ("kernel"
// layout of the reference system). Legend: N tokens, I input width, O output width.
//
// With bf16_inputs (dtype=bfloat16): x, w and dout are rounded to bfloat16 into that scratch
// ([matmul_bf16_scratch_elements(N, I, O, false)] bfloat16 bits) and the GEMMs take bf16 inputs with float32
// accumulation (gemm_bf16); every output and gradient stays float32. The reference for that mode is the
// float32 reference on inputs rounded the same way. The *_bf16_x variants take x already in bfloat16 (its
// producer wrote it rounded: a norm's or an MLP gate's output, which only matmuls read) and round only w
// and dout; given the same rounded x they give bitwise the results of the float32-x calls.
#pragma once

#include <cstdint>

#include "meshtrain/kernels/signatures.h"

namespace meshtrain::kernels {

// out = x @ w + bias, through the GEMM seam (gemm.h).
MatmulForward matmul_forward;

// dx = dout @ w^T (+= when accumulate_dx); dw += x^T @ dout; dbias += column sums of dout.
// dx, dw and dbias may each be nullptr to skip that gradient.
MatmulBackward matmul_backward;

// out = x @ w + bias with x in bfloat16; bf16_inputs holds w rounded.
MatmulForwardBf16X matmul_forward_bf16_x;

// matmul_backward with x in bfloat16; bf16_inputs holds dout and w rounded.
MatmulBackwardBf16X matmul_backward_bf16_x;

// bfloat16 elements of scratch a bf16 matmul needs: its x (unless x_is_bf16), w and dout rounded
// ([N, I] + [I, O] + [N, O]).
MatmulBf16ScratchElements matmul_bf16_scratch_elements;

template <class T>
void matmul_reference_forward(T* out, const T* x, const T* w, const T* bias, int64_t N, int64_t I,
                              int64_t O) {
  // Loops ordered so the innermost one walks rows contiguously.
  for (int64_t n = 0; n < N; ++n) {
    T* row = out + n * O;
    for (int64_t o = 0; o < O; ++o) row[o] = bias != nullptr ? bias[o] : T(0);
    for (int64_t i = 0; i < I; ++i) {
      for (int64_t o = 0; o < O; ++o) row[o] += x[n * I + i] * w[i * O + o];
    }
  }
}

template <class T>
void matmul_reference_backward(T* dx, T* dw, T* dbias, const T* dout, const T* x, const T* w, int64_t N,
                               int64_t I, int64_t O, bool accumulate_dx) {
  if (dx != nullptr) {
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t i = 0; i < I; ++i) {
        T sum = T(0);
        for (int64_t o = 0; o < O; ++o) sum += dout[n * O + o] * w[i * O + o];
        dx[n * I + i] = accumulate_dx ? dx[n * I + i] + sum : sum;
      }
    }
  }
  if (dw != nullptr) {
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t i = 0; i < I; ++i) {
        for (int64_t o = 0; o < O; ++o) dw[i * O + o] += x[n * I + i] * dout[n * O + o];
      }
    }
  }
  if (dbias != nullptr) {
    for (int64_t o = 0; o < O; ++o) {
      T sum = T(0);
      for (int64_t n = 0; n < N; ++n) sum += dout[n * O + o];
      dbias[o] += sum;
    }
  }
}

}  // namespace meshtrain::kernels
