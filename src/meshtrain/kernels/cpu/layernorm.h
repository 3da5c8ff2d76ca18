// LayerNorm (GPT-2 pre-norm): out = (x - mean) * rstd * w + b, one row per token.
// Legend: N tokens, D width.
#pragma once

#include <cmath>
#include <cstdint>

#include "meshtrain/kernels/signatures.h"

namespace meshtrain::kernels {

// Saves mean[n] and rstd[n] = 1 / sqrt(var(x[n]) + eps) (biased variance) for the backward pass.
LayernormForward layernorm_forward;

// The same with out rounded to bfloat16 (nearest even) as it is written: bitwise layernorm_forward's out
// rounded, for an output only dense matmuls read (their bf16 input) under dtype=bfloat16.
LayernormForwardBf16 layernorm_forward_bf16;

// dx = (or += when accumulate_dx) dL/dx; dw += dL/dw; db += dL/db.
LayernormBackward layernorm_backward;

template <class T>
void layernorm_reference_forward(T* out, T* mean, T* rstd, const T* x, const T* w, const T* b, int64_t N,
                                 int64_t D, T eps) {
  for (int64_t n = 0; n < N; ++n) {
    const T* row = x + n * D;
    T sum = T(0);
    for (int64_t j = 0; j < D; ++j) sum += row[j];
    const T m = sum / static_cast<T>(D);
    T sum_squares = T(0);
    for (int64_t j = 0; j < D; ++j) sum_squares += (row[j] - m) * (row[j] - m);
    const T r = T(1) / std::sqrt(sum_squares / static_cast<T>(D) + eps);
    mean[n] = m;
    rstd[n] = r;
    for (int64_t j = 0; j < D; ++j) out[n * D + j] = (row[j] - m) * r * w[j] + b[j];
  }
}

// With xhat = (x - mean) * r and g = w * dout: dx = r * (g - mean(g) - xhat * mean(g * xhat)).
template <class T>
void layernorm_reference_backward(T* dx, T* dw, T* db, const T* dout, const T* x, const T* w, const T* mean,
                                  const T* rstd, int64_t N, int64_t D, bool accumulate_dx) {
  for (int64_t n = 0; n < N; ++n) {
    const T* row = x + n * D;
    const T* grad = dout + n * D;
    T mean_g = T(0), mean_g_xhat = T(0);
    for (int64_t j = 0; j < D; ++j) {
      const T xhat = (row[j] - mean[n]) * rstd[n];
      mean_g += w[j] * grad[j];
      mean_g_xhat += w[j] * grad[j] * xhat;
    }
    mean_g /= static_cast<T>(D);
    mean_g_xhat /= static_cast<T>(D);
    for (int64_t j = 0; j < D; ++j) {
      const T xhat = (row[j] - mean[n]) * rstd[n];
      const T value = rstd[n] * (w[j] * grad[j] - mean_g - xhat * mean_g_xhat);
      dx[n * D + j] = accumulate_dx ? dx[n * D + j] + value : value;
      dw[j] += grad[j] * xhat;
      db[j] += grad[j];
    }
  }
}

}  // namespace meshtrain::kernels
