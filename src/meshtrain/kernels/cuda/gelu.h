// Tanh-approximated GELU forward (out in float32, or bf16: _bf16) and backward on the GPU. Semantics as
// kernels/cpu/gelu.h. Every pointer is device memory (the arena); kernels run on the stream of device.h, in
// call order.
#pragma once

#include <cstdint>

#include "meshtrain/kernels/signatures.h"

namespace meshtrain::kernels::cuda {

GeluForward gelu_forward;
GeluForwardBf16 gelu_forward_bf16;
GeluBackward gelu_backward;

}  // namespace meshtrain::kernels::cuda
