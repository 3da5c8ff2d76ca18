// Tanh-approximated GELU forward and backward on the GPU. Semantics as kernels/cpu/gelu.h.
// Every pointer is device memory (the arena); kernels run on the stream of device.h, in call order.
#pragma once

#include <cstdint>

namespace meshtrain::kernels::cuda {

void gelu_forward(float* out,      // [count]
                  const float* x,  // [count]
                  int64_t count);
void gelu_backward(float* dx,          // [count]
                   const float* dout,  // [count]
                   const float* x,     // [count]
                   int64_t count);

}  // namespace meshtrain::kernels::cuda
