// Writing a float32 result into an output of either storage type: float32 as it is, bfloat16 rounded to
// nearest even (bfloat16_from_float). A producer whose output only dense matmuls read (a norm, an MLP gate)
// is one template over its output type, so under dtype=bfloat16 it writes the rounded values the matmul
// would otherwise round from a float32 copy, bitwise the same values in one pass fewer.
#pragma once

#include <cstdint>

#include "meshtrain/core/dtype.h"

namespace meshtrain::kernels {

inline void store(float* target, float value) {
  *target = value;
}
inline void store(uint16_t* target, float value) {
  *target = bfloat16_from_float(value);
}

}  // namespace meshtrain::kernels
