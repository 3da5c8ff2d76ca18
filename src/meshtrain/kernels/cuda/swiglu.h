// SwiGLU (silu(gate) * up) forward and backward on the GPU. Semantics as kernels/cpu/swiglu.h.
// Every pointer is device memory (the arena); kernels run on the stream of device.h, in call order.
#pragma once

#include <cstdint>

#include "meshtrain/kernels/signatures.h"

namespace meshtrain::kernels::cuda {

SwigluForward swiglu_forward;
SwigluBackward swiglu_backward;

}  // namespace meshtrain::kernels::cuda
