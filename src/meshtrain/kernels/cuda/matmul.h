// Dense matmul on the GPU through cuBLASLt: float32 operands with float32 math, or (bf16_inputs given,
// dtype=bfloat16) x, w and dout rounded to bf16 into that scratch and multiplied on the tensor cores with
// float32 accumulation and output. Semantics as kernels/cpu/matmul.h.
// Every pointer is device memory (the arena); kernels run on the stream of device.h, in call order.
#pragma once

#include <cstdint>

#include "meshtrain/kernels/signatures.h"

namespace meshtrain::kernels::cuda {

MatmulForward matmul_forward;
MatmulBackward matmul_backward;

}  // namespace meshtrain::kernels::cuda
