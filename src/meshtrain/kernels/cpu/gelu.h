// GELU of the GPT-2 MLP, tanh approximation: out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
// Legend: count = N * F values (N tokens, F MLP width); every array below holds count values.
#pragma once

#include <cmath>
#include <cstdint>
#include <numbers>

#include "meshtrain/kernels/signatures.h"

namespace meshtrain::kernels {

GeluForward gelu_forward;

// The same with out rounded to bfloat16 as it is written (bitwise gelu_forward's out rounded): the MLP's
// down projection reads it as its bf16 input under dtype=bfloat16.
GeluForwardBf16 gelu_forward_bf16;

// dx = dout * gelu'(x), written (=).
GeluBackward gelu_backward;

template <class T>
void gelu_reference_forward(T* out, const T* x, int64_t count) {
  const T k = std::sqrt(T(2) / std::numbers::pi_v<T>), c = T(0.044715);
  for (int64_t i = 0; i < count; ++i) {
    const T v = x[i];
    out[i] = T(0.5) * v * (T(1) + std::tanh(k * (v + c * v * v * v)));
  }
}

// With t = tanh(k (x + c x^3)): gelu'(x) = 0.5 (1 + t) + 0.5 x (1 - t^2) k (1 + 3 c x^2).
template <class T>
void gelu_reference_backward(T* dx, const T* dout, const T* x, int64_t count) {
  const T k = std::sqrt(T(2) / std::numbers::pi_v<T>), c = T(0.044715);
  for (int64_t i = 0; i < count; ++i) {
    const T v = x[i];
    const T t = std::tanh(k * (v + c * v * v * v));
    dx[i] = dout[i] * (T(0.5) * (T(1) + t) + T(0.5) * v * (T(1) - t * t) * k * (T(1) + T(3) * c * v * v));
  }
}

}  // namespace meshtrain::kernels
