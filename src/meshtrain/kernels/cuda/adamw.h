// The fused AdamW step and the gradient's sum of squares on the GPU. Semantics as kernels/cpu/adamw.h.
// Every pointer is device memory (the arena); kernels run on the stream of device.h, in call order.
#pragma once

#include <cstdint>

#include "meshtrain/kernels/arguments.h"

namespace meshtrain::kernels::cuda {

void adamw_update(float* param,       // [count]
                  const float* grad,  // [count]
                  float* m,           // [count]
                  float* v,           // [count]
                  int64_t count, const AdamWStep& step, bool apply_weight_decay);
double sum_of_squares(const float* values,  // [count]
                      int64_t count);

}  // namespace meshtrain::kernels::cuda
