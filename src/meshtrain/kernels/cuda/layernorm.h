// LayerNorm forward and backward on the GPU. Semantics as kernels/cpu/layernorm.h.
// Every pointer is device memory (the arena); kernels run on the stream of device.h, in call order.
#pragma once

#include <cstdint>

namespace meshtrain::kernels::cuda {

void layernorm_forward(float* out,      // [N, D]
                       float* mean,     // [N]
                       float* rstd,     // [N]
                       const float* x,  // [N, D]
                       const float* w,  // [D]
                       const float* b,  // [D]
                       int64_t N, int64_t D, float eps);
void layernorm_backward(float* dx,          // [N, D]
                        float* dw,          // [D]
                        float* db,          // [D]
                        const float* dout,  // [N, D]
                        const float* x,     // [N, D]
                        const float* w,     // [D]
                        const float* mean,  // [N]
                        const float* rstd,  // [N]
                        int64_t N, int64_t D, bool accumulate_dx);

}  // namespace meshtrain::kernels::cuda
