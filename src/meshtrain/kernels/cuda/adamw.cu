// The fused AdamW step and the gradient's sum of squares (global norm) on the GPU (adamw.h; semantics of
// kernels/cpu/adamw.h): elementwise float32 in the cpu kernel's operation order, and a two-pass double sum.
// Legend: count elements of one tensor (any shape, flattened); param, grad, m, v, values [count].
#include <cmath>
#include <cstdint>

#include "meshtrain/core/error.h"
#include "meshtrain/kernels/cuda/adamw.h"
#include "meshtrain/kernels/cuda/device.h"

namespace meshtrain::kernels::cuda {
namespace {

// The sum of squares: always kSumBlocks blocks of kSumThreads threads (whatever count is), thread t of
// block b summing elements b kSumThreads + t + k kSumBlocks kSumThreads in k order, each block's sum by a
// fixed tree into square_partials[b], then one thread adding the partials in block order. A fixed grid and
// order: the result is bitwise the same on every call (it is not the cpu's order, which depends on its
// threads).
constexpr int kSumBlocks = 256;
constexpr int kSumThreads = 256;
// Device-side homes of the two passes (no scratch argument; the one stream orders every use, so calls from
// one host thread never overlap).
__device__ double square_partials[kSumBlocks];
__device__ double square_total;

// The cpu kernel's per-call constants (bias corrections in double, folded into the step size and the
// scale of sqrt(v)).
struct Constants {
  float b1, one_minus_b1, b2, one_minus_b2, scale, step_size, inverse_sqrt_bc2, eps, decay;
};

// One element per thread (grid-stride). Every operation is an explicit round-to-nearest intrinsic in the
// cpu kernel's order, so nvcc cannot contract a product and a sum into a fused multiply-add: the result
// equals the cpu's wherever its compiler did not contract either.
//   g = grad scale; m = b1 m + (1 - b1) g; v = b2 v + ((1 - b2) g) g;
//   param = (p - (step_size m) / (sqrt(v) inverse_sqrt_bc2 + eps)) - decay p, p the parameter before.
// Each element is read and written by its own thread only.
__global__ void update_kernel(float* param,       // [count]
                              const float* grad,  // [count]
                              float* m,           // [count]
                              float* v,           // [count]
                              int64_t count, Constants c) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    const float g = __fmul_rn(grad[i], c.scale);
    const float m_new = __fadd_rn(__fmul_rn(c.b1, m[i]), __fmul_rn(c.one_minus_b1, g));
    const float v_new = __fadd_rn(__fmul_rn(c.b2, v[i]), __fmul_rn(__fmul_rn(c.one_minus_b2, g), g));
    m[i] = m_new;
    v[i] = v_new;
    const float p = param[i];
    const float denominator = __fadd_rn(__fmul_rn(__fsqrt_rn(v_new), c.inverse_sqrt_bc2), c.eps);
    const float update = __fdiv_rn(__fmul_rn(c.step_size, m_new), denominator);
    param[i] = __fsub_rn(__fsub_rn(p, update), __fmul_rn(c.decay, p));
  }
}

// Grid kSumBlocks, block kSumThreads: square_partials[b] = the sum of squares (in double) of block b's
// elements.
__global__ void sum_partials_kernel(const float* values,  // [count]
                                    int64_t count) {
  __shared__ double shared[kSumThreads / 32];
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  double sum = 0.0;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    const double x = static_cast<double>(values[i]);
    sum += x * x;
  }
  // A fixed tree: shuffles within each warp, then warp 0 over the warps' sums.
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int warp = static_cast<int>(threadIdx.x / 32);
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_down_sync(0xffffffffu, sum, offset);
  if (lane == 0) shared[warp] = sum;
  __syncthreads();
  if (warp == 0) {
    sum = lane < kSumThreads / 32 ? shared[lane] : 0.0;
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_down_sync(0xffffffffu, sum, offset);
    if (lane == 0) square_partials[blockIdx.x] = sum;
  }
}

// One thread: total = square_partials[0] + square_partials[1] + ... in block order.
__global__ void sum_total_kernel() {
  double sum = 0.0;
  for (int b = 0; b < kSumBlocks; ++b) sum += square_partials[b];
  square_total = sum;
}

}  // namespace

void adamw_update(float* param, const float* grad, float* m, float* v, int64_t count, const AdamWStep& step,
                  bool apply_weight_decay) {
  MT_CHECK(step.step >= 1, "the step is 1-based");
  MT_CHECK(count >= 0, "count >= 0");
  if (count == 0) return;
  // As the cpu kernel: bias corrections once per call in double; mhat / (sqrt(vhat) + eps) =
  // (m / bc1) / (sqrt(v) / sqrt(bc2) + eps).
  const double t = static_cast<double>(step.step);
  const double bias_correction1 = 1.0 - std::pow(static_cast<double>(step.beta1), t);
  const double bias_correction2 = 1.0 - std::pow(static_cast<double>(step.beta2), t);
  Constants c{};
  c.b1 = step.beta1;
  c.one_minus_b1 = 1.0f - step.beta1;
  c.b2 = step.beta2;
  c.one_minus_b2 = 1.0f - step.beta2;
  c.scale = step.gradient_scale;
  c.step_size = static_cast<float>(static_cast<double>(step.learning_rate) / bias_correction1);
  c.inverse_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bias_correction2));
  c.eps = step.epsilon;
  c.decay = apply_weight_decay ? step.learning_rate * step.weight_decay : 0.0f;
  update_kernel<<<elementwise_blocks(count), kElementwiseThreads, 0, stream()>>>(param, grad, m, v, count, c);
  MT_CUDA_LAUNCHED("adamw update_kernel");
}

double sum_of_squares(const float* values, int64_t count) {
  MT_CHECK(count >= 0, "count >= 0");
  if (count == 0) return 0.0;
  sum_partials_kernel<<<kSumBlocks, kSumThreads, 0, stream()>>>(values, count);
  MT_CUDA_LAUNCHED("adamw sum_partials_kernel");
  sum_total_kernel<<<1, 1, 0, stream()>>>();
  MT_CUDA_LAUNCHED("adamw sum_total_kernel");
  double result = 0.0;
  MT_CUDA(
      cudaMemcpyFromSymbolAsync(&result, square_total, sizeof(double), 0, cudaMemcpyDeviceToHost, stream()));
  MT_CUDA(cudaStreamSynchronize(stream()));
  return result;
}

}  // namespace meshtrain::kernels::cuda
