// SwiGLU (silu(gate) * up) forward and backward on the GPU. Semantics as kernels/cpu/swiglu.h.
// Every pointer is device memory (the arena); kernels run on the stream of device.h, in call order.
#pragma once

#include <cstdint>

namespace meshtrain::kernels::cuda {

void swiglu_forward(float* out,         // [count]
                    const float* gate,  // [count]
                    const float* up,    // [count]
                    int64_t count);
void swiglu_backward(float* dgate,       // [count]
                     float* dup,         // [count]
                     const float* dout,  // [count]
                     const float* gate,  // [count]
                     const float* up,    // [count]
                     int64_t count);

}  // namespace meshtrain::kernels::cuda
