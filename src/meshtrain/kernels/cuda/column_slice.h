// Column slices and their transpose on the GPU. Semantics as kernels/cpu/column_slice.h.
// Every pointer is device memory (the arena); kernels run on the stream of device.h, in call order.
#pragma once

#include <cstdint>

namespace meshtrain::kernels::cuda {

void column_slice_forward(float* out,      // [R * repeat, out_stride]
                          const float* x,  // [R, x_stride] or nullptr
                          int64_t R, int64_t W, int64_t repeat, int64_t out_stride, int64_t x_stride);
void column_slice_backward(float* dx,          // [R, dx_stride]
                           const float* dout,  // [R * repeat, dout_stride]
                           int64_t R, int64_t W, int64_t repeat, int64_t dx_stride, int64_t dout_stride);

}  // namespace meshtrain::kernels::cuda
