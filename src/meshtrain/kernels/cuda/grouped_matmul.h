// The routed experts' grouped matmul on the GPU: per expert segment of sorted rows, out = x @ w[e] and its
// backward. Semantics as kernels/cpu/grouped_matmul.h. Every pointer is device memory (the arena); kernels
// run on the stream of device.h, in call order.
#pragma once

#include <cstdint>

#include "meshtrain/kernels/signatures.h"

namespace meshtrain::kernels::cuda {

GroupedMatmulForward grouped_matmul_forward;
GroupedMatmulBackward grouped_matmul_backward;

}  // namespace meshtrain::kernels::cuda
