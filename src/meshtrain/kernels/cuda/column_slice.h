// Column slices and their transpose on the GPU. Semantics as kernels/cpu/column_slice.h.
// Every pointer is device memory (the arena); kernels run on the stream of device.h, in call order.
#pragma once

#include <cstdint>

#include "meshtrain/kernels/signatures.h"

namespace meshtrain::kernels::cuda {

ColumnSliceForward column_slice_forward;
ColumnSliceBackward column_slice_backward;

}  // namespace meshtrain::kernels::cuda
