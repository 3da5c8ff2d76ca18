// Residual add on the GPU (residual.h; semantics of kernels/cpu/residual.h): out += x, elementwise.
// Legend: count elements; both arrays hold count floats.
#include <cstdint>

#include "meshtrain/kernels/cuda/device.h"
#include "meshtrain/kernels/cuda/residual.h"

namespace meshtrain::kernels::cuda {
namespace {

// Each element is read and written by one thread, so x may alias out (out doubles).
__global__ void add_kernel(float* out, const float* x, int64_t count) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    out[i] += x[i];
  }
}

}  // namespace

void residual_add(float* out, const float* x, int64_t count) {
  if (count <= 0) return;
  add_kernel<<<elementwise_blocks(count), kElementwiseThreads, 0, stream()>>>(out, x, count);
  MT_CUDA_LAUNCHED("residual add_kernel");
}

}  // namespace meshtrain::kernels::cuda
