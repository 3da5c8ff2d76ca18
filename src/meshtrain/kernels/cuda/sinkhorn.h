// mHC's Sinkhorn mixing matrix and its backward through every iteration on the GPU. Semantics as
// kernels/cpu/sinkhorn.h.
// Every pointer is device memory (the arena); kernels run on the stream of device.h, in call order.
#pragma once

#include <cstdint>

#include "meshtrain/kernels/signatures.h"

namespace meshtrain::kernels::cuda {

SinkhornForward sinkhorn_forward;
SinkhornBackward sinkhorn_backward;

}  // namespace meshtrain::kernels::cuda
