#include "meshtrain/kernels/cpu/residual.h"

namespace meshtrain::kernels {

void residual_add(float* out, const float* x, int64_t count) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < count; ++i) out[i] += x[i];
}

}  // namespace meshtrain::kernels
