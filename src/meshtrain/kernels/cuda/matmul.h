// Dense matmul on the GPU through cuBLASLt: float32 operands with float32 math, or (bf16_inputs given,
// dtype=bfloat16) x, w and dout rounded to bf16 into that scratch and multiplied on the tensor cores with
// float32 accumulation and output; the _bf16_x entries take x already in bf16 (written so by its producer).
// Semantics as kernels/cpu/matmul.h.
// Every pointer is device memory (the arena); kernels run on the stream of device.h, in call order.
#pragma once

#include <cstdint>

#include "meshtrain/kernels/signatures.h"

namespace meshtrain::kernels::cuda {

MatmulForward matmul_forward;
MatmulForwardBf16X matmul_forward_bf16_x;
MatmulBackward matmul_backward;
MatmulBackwardBf16X matmul_backward_bf16_x;

}  // namespace meshtrain::kernels::cuda
