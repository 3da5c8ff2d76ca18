// SwiGLU (silu(gate) * up) forward (out in float32, or bf16: _bf16) and backward on the GPU. Semantics as
// kernels/cpu/swiglu.h. Every pointer is device memory (the arena); kernels run on the stream of device.h, in
// call order.
#pragma once

#include <cstdint>

#include "meshtrain/kernels/signatures.h"

namespace meshtrain::kernels::cuda {

SwigluForward swiglu_forward;
SwigluForwardBf16 swiglu_forward_bf16;
SwigluBackward swiglu_backward;

}  // namespace meshtrain::kernels::cuda
