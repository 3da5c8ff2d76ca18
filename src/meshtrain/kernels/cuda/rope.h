// Rotary position embedding forward and backward on the GPU. Semantics as kernels/cpu/rope.h.
// Every pointer is device memory (the arena); kernels run on the stream of device.h, in call order.
#pragma once

#include <cstdint>

#include "meshtrain/kernels/signatures.h"

namespace meshtrain::kernels::cuda {

RopeForward rope_forward;
RopeBackward rope_backward;

}  // namespace meshtrain::kernels::cuda
