// SwiGLU on the GPU (swiglu.h; semantics of kernels/cpu/swiglu.h): out = silu(gate) * up and its gradients.
// swiglu_forward_bf16 writes out in bf16 (float32 math, one rounding on the store), as the cpu's.
// Legend: count elements (N tokens times F MLP width); every array holds count elements.
#include <cstdint>

#include "meshtrain/kernels/cuda/bf16.cuh"
#include "meshtrain/kernels/cuda/device.h"
#include "meshtrain/kernels/cuda/swiglu.h"

namespace meshtrain::kernels::cuda {
namespace {

// sigmoid(g) = 1 / (1 + e^-g) with accurate expf and division: 0 (not NaN) for g < -88.7, where e^-g is inf.
__device__ float sigmoid(float g) {
  return 1.0f / (1.0f + expf(-g));
}

// Out: float (float32 out) or uint16_t (bf16 out).
template <class Out>
__global__ void forward_kernel(Out* out, const float* gate, const float* up, int64_t count) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    const float g = gate[i];
    store_output(out, i, g * sigmoid(g) * up[i]);
  }
}

// dgate = dout * up * sigmoid(g) * (1 + g (1 - sigmoid(g))), dup = dout * g * sigmoid(g). Every read of an
// element comes before its writes, so a gradient may share an input's storage element for element.
__global__ void backward_kernel(float* dgate, float* dup, const float* dout, const float* gate,
                                const float* up, int64_t count) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    const float g = gate[i], u = up[i], d = dout[i];
    const float s = sigmoid(g);
    dgate[i] = d * u * s * (1.0f + g * (1.0f - s));
    dup[i] = d * g * s;
  }
}

template <class Out>
void launch_forward(Out* out, const float* gate, const float* up, int64_t count) {
  if (count <= 0) return;
  forward_kernel<Out><<<elementwise_blocks(count), kElementwiseThreads, 0, stream()>>>(out, gate, up, count);
  MT_CUDA_LAUNCHED("swiglu forward_kernel");
}

}  // namespace

void swiglu_forward(float* out, const float* gate, const float* up, int64_t count) {
  launch_forward(out, gate, up, count);
}

void swiglu_forward_bf16(uint16_t* out, const float* gate, const float* up, int64_t count) {
  launch_forward(out, gate, up, count);
}

void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                     int64_t count) {
  if (count <= 0) return;
  backward_kernel<<<elementwise_blocks(count), kElementwiseThreads, 0, stream()>>>(dgate, dup, dout, gate, up,
                                                                                   count);
  MT_CUDA_LAUNCHED("swiglu backward_kernel");
}

}  // namespace meshtrain::kernels::cuda
