// Rotary position embedding forward and backward on the GPU. Semantics as kernels/cpu/rope.h.
// Every pointer is device memory (the arena); kernels run on the stream of device.h, in call order.
#pragma once

#include <cstdint>

namespace meshtrain::kernels::cuda {

void rope_forward(float* out,                // [N, H, d]
                  const float* x,            // [N, H, d]
                  const int32_t* positions,  // [N]
                  int64_t N, int64_t H, int64_t d, float theta);
void rope_backward(float* dx,                 // [N, H, d]
                   const float* dout,         // [N, H, d]
                   const int32_t* positions,  // [N]
                   int64_t N, int64_t H, int64_t d, float theta);

}  // namespace meshtrain::kernels::cuda
