// LayerNorm forward and backward on the GPU. Semantics as kernels/cpu/layernorm.h.
// Every pointer is device memory (the arena); kernels run on the stream of device.h, in call order.
#pragma once

#include <cstdint>

#include "meshtrain/kernels/signatures.h"

namespace meshtrain::kernels::cuda {

LayernormForward layernorm_forward;
LayernormBackward layernorm_backward;

}  // namespace meshtrain::kernels::cuda
