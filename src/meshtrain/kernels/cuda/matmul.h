// Dense matmul on the GPU through cuBLASLt: float32 operands with float32 math, or (bf16_inputs given,
// dtype=bfloat16) x, w and dout rounded to bf16 into that scratch and multiplied on the tensor cores with
// float32 accumulation and output. Semantics as kernels/cpu/matmul.h.
// Every pointer is device memory (the arena); kernels run on the stream of device.h, in call order.
#pragma once

#include <cstdint>

namespace meshtrain::kernels::cuda {

void matmul_forward(float* out,         // [N, O]
                    const float* x,     // [N, I]
                    const float* w,     // [I, O]
                    const float* bias,  // [O] or nullptr
                    int64_t N, int64_t I, int64_t O, uint16_t* bf16_inputs);
void matmul_backward(float* dx,          // [N, I] or nullptr
                     float* dw,          // [I, O] or nullptr
                     float* dbias,       // [O] or nullptr
                     const float* dout,  // [N, O]
                     const float* x,     // [N, I]
                     const float* w,     // [I, O]
                     int64_t N, int64_t I, int64_t O, bool accumulate_dx, uint16_t* bf16_inputs);

}  // namespace meshtrain::kernels::cuda
