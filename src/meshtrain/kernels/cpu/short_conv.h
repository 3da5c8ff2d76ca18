// Engram's ShortConv core (shared/specs/engram.md section 5): a causal depthwise convolution with dilation
//   y[t, c] = sum_{j=0..K-1} w[j, c] u[t - (K-1-j) dilation, c],
// over one stretch of time per row. Times before the stretch read `halo` (the last H = (K-1) dilation inputs
// of the row's preceding stretch, oldest first: the halo a context-parallel rank receives from the rank
// holding its natural predecessor chunk) or zeros when there is none (the row's start). The RMSNorm before
// it and the SiLU and residual after it belong to the layer.
// Legend: B rows, T times in the stretch, C channels (G D), K taps, H = (K - 1) dilation halo rows.
// Gradient semantics: d_u and d_halo written (=), d_w accumulated (+=).
#pragma once

#include <cmath>
#include <cstdint>

#include "meshtrain/kernels/signatures.h"

namespace meshtrain::kernels {

ShortConvForward short_conv_forward;

ShortConvBackward short_conv_backward;

// The ShortConv's end and the Engram residual (engram.md sections 5 and 6), elementwise:
//   out = x + gated + silu(y);   backward: d_gated = d_out, d_y = d_out silu'(y) (both written).
ShortConvOutputForward short_conv_output_forward;
ShortConvOutputBackward short_conv_output_backward;

template <class Value>
Value silu_of(Value y) {
  return y / (Value(1) + std::exp(-y));
}
template <class Value>
Value silu_slope(Value y) {
  const Value sigmoid = Value(1) / (Value(1) + std::exp(-y));
  return sigmoid * (Value(1) + y * (Value(1) - sigmoid));
}

// Input time `t` (may be negative: the halo) of row b, channel c; zero before the halo.
template <class Value>
Value short_conv_input(const Value* u, const Value* halo, int64_t b, int64_t t, int64_t c, int64_t T,
                       int64_t C, int64_t H) {
  if (t >= 0) return u[(b * T + t) * C + c];
  if (halo == nullptr || t < -H) return Value(0);
  return halo[(b * H + (H + t)) * C + c];
}

template <class Value>
void short_conv_reference_forward(Value* y, const Value* u, const Value* halo, const Value* w, int64_t B,
                                  int64_t T, int64_t C, int64_t K, int64_t dilation) {
  const int64_t H = (K - 1) * dilation;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < C; ++c) {
        Value sum = Value(0);
        for (int64_t j = 0; j < K; ++j)
          sum += w[j * C + c] * short_conv_input(u, halo, b, t - (K - 1 - j) * dilation, c, T, C, H);
        y[(b * T + t) * C + c] = sum;
      }
}

template <class Value>
void short_conv_reference_backward(Value* d_u, Value* d_halo, Value* d_w, const Value* d_y, const Value* u,
                                   const Value* halo, const Value* w, int64_t B, int64_t T, int64_t C,
                                   int64_t K, int64_t dilation) {
  const int64_t H = (K - 1) * dilation;
  for (int64_t i = 0; i < B * T * C; ++i) d_u[i] = Value(0);
  if (d_halo != nullptr)
    for (int64_t i = 0; i < B * H * C; ++i) d_halo[i] = Value(0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < C; ++c) {
        const Value g = d_y[(b * T + t) * C + c];
        for (int64_t j = 0; j < K; ++j) {
          const int64_t source = t - (K - 1 - j) * dilation;
          d_w[j * C + c] += g * short_conv_input(u, halo, b, source, c, T, C, H);
          if (source >= 0) {
            d_u[(b * T + source) * C + c] += g * w[j * C + c];
          } else if (d_halo != nullptr && source >= -H) {
            d_halo[(b * H + (H + source)) * C + c] += g * w[j * C + c];
          }
        }
      }
}

}  // namespace meshtrain::kernels
