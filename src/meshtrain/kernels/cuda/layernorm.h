// LayerNorm forward (out in float32, or in bf16 for the matmuls: _bf16) and backward on the GPU. Semantics as
// kernels/cpu/layernorm.h. Every pointer is device memory (the arena); kernels run on the stream of device.h,
// in call order.
#pragma once

#include <cstdint>

#include "meshtrain/kernels/signatures.h"

namespace meshtrain::kernels::cuda {

LayernormForward layernorm_forward;
LayernormForwardBf16 layernorm_forward_bf16;
LayernormBackward layernorm_backward;

}  // namespace meshtrain::kernels::cuda
