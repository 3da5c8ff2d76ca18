// Tanh-approximated GELU on the GPU (gelu.h; semantics of kernels/cpu/gelu.h):
// out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) and dx = dout * gelu'(x).
// gelu_forward_bf16 writes out in bf16 (float32 math, one rounding on the store), as the cpu's.
// Legend: count elements (N tokens times F MLP width); every array holds count elements.
#include <cstdint>

#include "meshtrain/kernels/cuda/bf16.cuh"
#include "meshtrain/kernels/cuda/device.h"
#include "meshtrain/kernels/cuda/gelu.h"

namespace meshtrain::kernels::cuda {
namespace {

// The cpu kernel's constants: sqrt(2 / pi) rounded once to float, and the cubic coefficient.
constexpr float kScale = static_cast<float>(0.79788456080286535588);
constexpr float kCubic = 0.044715f;

// Out: float (float32 out) or uint16_t (bf16 out).
template <class Out>
__global__ void forward_kernel(Out* out, const float* x, int64_t count) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    const float v = x[i];
    store_output(out, i, 0.5f * v * (1.0f + tanhf(kScale * (v + kCubic * v * v * v))));
  }
}

// With t = tanh(kScale (x + kCubic x^3)): gelu'(x) = 0.5 (1 + t) + 0.5 x (1 - t^2) kScale (1 + 3 kCubic x^2).
// x is read before dx is written, so dx may share dout's or x's storage.
__global__ void backward_kernel(float* dx, const float* dout, const float* x, int64_t count) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    const float v = x[i];
    const float t = tanhf(kScale * (v + kCubic * v * v * v));
    const float slope =
        0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * kScale * (1.0f + 3.0f * kCubic * v * v);
    dx[i] = dout[i] * slope;
  }
}

template <class Out>
void launch_forward(Out* out, const float* x, int64_t count) {
  if (count <= 0) return;
  forward_kernel<Out><<<elementwise_blocks(count), kElementwiseThreads, 0, stream()>>>(out, x, count);
  MT_CUDA_LAUNCHED("gelu forward_kernel");
}

}  // namespace

void gelu_forward(float* out, const float* x, int64_t count) {
  launch_forward(out, x, count);
}

void gelu_forward_bf16(uint16_t* out, const float* x, int64_t count) {
  launch_forward(out, x, count);
}

void gelu_backward(float* dx, const float* dout, const float* x, int64_t count) {
  if (count <= 0) return;
  backward_kernel<<<elementwise_blocks(count), kElementwiseThreads, 0, stream()>>>(dx, dout, x, count);
  MT_CUDA_LAUNCHED("gelu backward_kernel");
}

}  // namespace meshtrain::kernels::cuda
