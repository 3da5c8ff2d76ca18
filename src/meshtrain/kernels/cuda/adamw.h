// The fused AdamW step and the gradient's sum of squares on the GPU. Semantics as kernels/cpu/adamw.h.
// Every pointer is device memory (the arena); kernels run on the stream of device.h, in call order.
#pragma once

#include <cstdint>

#include "meshtrain/kernels/arguments.h"
#include "meshtrain/kernels/signatures.h"

namespace meshtrain::kernels::cuda {

AdamWUpdate adamw_update;
SumOfSquares sum_of_squares;

}  // namespace meshtrain::kernels::cuda
