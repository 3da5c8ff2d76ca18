// Residual stream addition: out[n] += x[n]. The residual branch of every block ends with it.
// Legend: n flat element index.
#pragma once

#include <cstdint>

#include "meshtrain/kernels/signatures.h"

namespace meshtrain::kernels {

// out [count] += x [count]
ResidualAdd residual_add;

template <class T>
void residual_reference_add(T* out, const T* x, int64_t count) {
  for (int64_t i = 0; i < count; ++i) out[i] += x[i];
}

}  // namespace meshtrain::kernels
