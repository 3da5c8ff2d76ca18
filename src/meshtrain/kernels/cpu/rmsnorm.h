// RMSNorm (Llama-family pre-norm): out = w * x / sqrt(mean(x^2) + eps), one row per token.
// Legend: N tokens, D width.
#pragma once

#include <cmath>
#include <cstdint>

#include "meshtrain/kernels/signatures.h"

namespace meshtrain::kernels {

// Saves rstd[n] = 1 / sqrt(mean(x[n]^2) + eps) for the backward pass.
RmsnormForward rmsnorm_forward;

// The same with out rounded to bfloat16 (nearest even) as it is written: bitwise rmsnorm_forward's out
// rounded, for an output only dense matmuls read (their bf16 input) under dtype=bfloat16.
RmsnormForwardBf16 rmsnorm_forward_bf16;

// dx = (or += when accumulate_dx) dL/dx; dw += dL/dw.
RmsnormBackward rmsnorm_backward;

// Per-stream scales (Engram's and mHC's norms): each of the G streams of a token is a row of width D, stream
// g scaled by w[g]; rstd [N, G]; dw [G, D] accumulated. G = 1 is rmsnorm_forward / rmsnorm_backward.
RmsnormStreamsForward rmsnorm_streams_forward;
RmsnormStreamsBackward rmsnorm_streams_backward;

template <class T>
void rmsnorm_reference_forward(T* out, T* rstd, const T* x, const T* w, int64_t N, int64_t D, T eps) {
  for (int64_t n = 0; n < N; ++n) {
    const T* row = x + n * D;
    T sum_squares = T(0);
    for (int64_t j = 0; j < D; ++j) sum_squares += row[j] * row[j];
    const T r = T(1) / std::sqrt(sum_squares / static_cast<T>(D) + eps);
    rstd[n] = r;
    for (int64_t j = 0; j < D; ++j) out[n * D + j] = w[j] * row[j] * r;
  }
}

// With xhat = x * r: dx = r * (w * dout - xhat * mean(w * dout * xhat)), dw += dout * xhat.
template <class T>
void rmsnorm_reference_backward(T* dx, T* dw, const T* dout, const T* x, const T* w, const T* rstd, int64_t N,
                                int64_t D, bool accumulate_dx) {
  for (int64_t n = 0; n < N; ++n) {
    const T* row = x + n * D;
    const T* grad = dout + n * D;
    const T r = rstd[n];
    T mean_projection = T(0);
    for (int64_t j = 0; j < D; ++j) mean_projection += w[j] * grad[j] * row[j] * r;
    mean_projection /= static_cast<T>(D);
    for (int64_t j = 0; j < D; ++j) {
      const T value = r * (w[j] * grad[j] - row[j] * r * mean_projection);
      dx[n * D + j] = accumulate_dx ? dx[n * D + j] + value : value;
      dw[j] += grad[j] * row[j] * r;
    }
  }
}

}  // namespace meshtrain::kernels
