// SwiGLU gate of the Llama MLP: out = silu(gate) * up with silu(g) = g * sigmoid(g), elementwise.
// Legend: count = N * F values (N tokens, F MLP width); every array below holds count values.
#pragma once

#include <cmath>
#include <cstdint>

#include "meshtrain/kernels/signatures.h"

namespace meshtrain::kernels {

SwigluForward swiglu_forward;

// The same with out rounded to bfloat16 as it is written (bitwise swiglu_forward's out rounded): the MLP's
// down projection reads it as its bf16 input under dtype=bfloat16.
SwigluForwardBf16 swiglu_forward_bf16;

// dgate = dout * up * silu'(gate), dup = dout * silu(gate); both written (=).
SwigluBackward swiglu_backward;

template <class T>
void swiglu_reference_forward(T* out, const T* gate, const T* up, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    const T sigmoid = T(1) / (T(1) + std::exp(-gate[i]));
    out[i] = gate[i] * sigmoid * up[i];
  }
}

// silu'(g) = sigmoid(g) * (1 + g * (1 - sigmoid(g))).
template <class T>
void swiglu_reference_backward(T* dgate, T* dup, const T* dout, const T* gate, const T* up, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    const T g = gate[i], u = up[i], d = dout[i];
    const T sigmoid = T(1) / (T(1) + std::exp(-g));
    dgate[i] = d * u * sigmoid * (T(1) + g * (T(1) - sigmoid));
    dup[i] = d * g * sigmoid;
  }
}

}  // namespace meshtrain::kernels
