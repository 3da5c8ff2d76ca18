// Residual add on the GPU: out += x. Semantics as kernels/cpu/residual.h.
// Every pointer is device memory (the arena); kernels run on the stream of device.h, in call order.
#pragma once

#include <cstdint>

namespace meshtrain::kernels::cuda {

void residual_add(float* out,      // [count]
                  const float* x,  // [count]
                  int64_t count);

}  // namespace meshtrain::kernels::cuda
