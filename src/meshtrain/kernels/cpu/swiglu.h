// SwiGLU gate of the Llama MLP: out = silu(gate) * up with silu(g) = g * sigmoid(g), elementwise.
// Legend: count = N * F values (N tokens, F MLP width); every array below holds count values.
#pragma once

#include <cmath>
#include <cstdint>

namespace meshtrain::kernels {

void swiglu_forward(float* out,         // [count]
                    const float* gate,  // [count]
                    const float* up,    // [count]
                    int64_t count);

// The same with out rounded to bfloat16 as it is written (bitwise swiglu_forward's out rounded): the MLP's
// down projection reads it as its bf16 input under dtype=bfloat16.
void swiglu_forward_bf16(uint16_t* out,      // [count] bfloat16 bits
                         const float* gate,  // [count]
                         const float* up,    // [count]
                         int64_t count);

// dgate = dout * up * silu'(gate), dup = dout * silu(gate); both written (=).
void swiglu_backward(float* dgate,       // [count]
                     float* dup,         // [count]
                     const float* dout,  // [count]
                     const float* gate,  // [count]
                     const float* up,    // [count]
                     int64_t count);

template <class T>
void swiglu_reference_forward(T* out,         // [count]
                              const T* gate,  // [count]
                              const T* up,    // [count]
                              int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    const T sigmoid = T(1) / (T(1) + std::exp(-gate[i]));
    out[i] = gate[i] * sigmoid * up[i];
  }
}

// silu'(g) = sigmoid(g) * (1 + g * (1 - sigmoid(g))).
template <class T>
void swiglu_reference_backward(T* dgate,       // [count]
                               T* dup,         // [count]
                               const T* dout,  // [count]
                               const T* gate,  // [count]
                               const T* up,    // [count]
                               int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    const T g = gate[i], u = up[i], d = dout[i];
    const T sigmoid = T(1) / (T(1) + std::exp(-g));
    dgate[i] = d * u * sigmoid * (T(1) + g * (T(1) - sigmoid));
    dup[i] = d * g * sigmoid;
  }
}

}  // namespace meshtrain::kernels
