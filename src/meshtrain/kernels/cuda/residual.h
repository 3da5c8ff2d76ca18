// Residual add on the GPU: out += x. Semantics as kernels/cpu/residual.h.
// Every pointer is device memory (the arena); kernels run on the stream of device.h, in call order.
#pragma once

#include <cstdint>

#include "meshtrain/kernels/signatures.h"

namespace meshtrain::kernels::cuda {

ResidualAdd residual_add;

}  // namespace meshtrain::kernels::cuda
