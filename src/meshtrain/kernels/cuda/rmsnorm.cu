// RMSNorm on the GPU (rmsnorm.h; semantics of kernels/cpu/rmsnorm.h): out = w * x * rstd with rstd =
// 1 / sqrt(mean(x^2) + eps) saved per row; backward dx = (or +=) dL/dx, dw += dL/dw.
// rmsnorm_forward_bf16 writes out in bf16 (float32 math, one rounding on the store), as the cpu's.
// Legend: N tokens (rows), D width (columns); x, out, dout, dx [N, D]; w, dw [D]; rstd [N].
#include <algorithm>
#include <cstdint>

#include "meshtrain/kernels/cuda/bf16.cuh"
#include "meshtrain/kernels/cuda/device.h"
#include "meshtrain/kernels/cuda/rmsnorm.h"
#include "meshtrain/kernels/cuda/row_reduce.cuh"

namespace meshtrain::kernels::cuda {
namespace {

// One block per row: rstd = 1 / sqrt(sum(x^2) / D + eps) (correctly rounded sqrt and division, as the cpu's
// std::sqrt and /), out = w * (x * rstd) in the cpu's order. Out: float (float32 out) or uint16_t (bf16).
template <class Out>
__global__ void forward_kernel(Out* out, float* rstd, const float* x, const float* w, int64_t N, int64_t D,
                               float eps) {
  __shared__ float shared[32];
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const float* row = x + n * D;
    float sum_squares = 0.0f;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) sum_squares += row[j] * row[j];
    const float r = inverse_root_mean(block_sum(sum_squares, shared), D, eps);
    if (threadIdx.x == 0) rstd[n] = r;
    Out* target = out + n * D;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x)
      store_output(target, j, __fmul_rn(w[j], __fmul_rn(row[j], r)));
  }
}

// One block per row: projection = sum(w * dout * x); dx = r w dout - x r^3 projection / D, written or added.
// Each thread reads dout[j] and x[j] before it writes dx[j] (and the row sum is complete before any write),
// so dx may share dout's storage when not accumulating.
__global__ void backward_dx_kernel(float* dx, const float* dout, const float* x, const float* w,
                                   const float* rstd, int64_t N, int64_t D, bool accumulate_dx) {
  __shared__ float shared[32];
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const float* row = x + n * D;
    const float* grad = dout + n * D;
    float* target = dx + n * D;
    const float r = rstd[n];
    float projection = 0.0f;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) projection += w[j] * grad[j] * row[j];
    projection = block_sum(projection, shared);
    const float x_scale = r * r * r * projection / static_cast<float>(D);
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
      const float value = r * w[j] * grad[j] - row[j] * x_scale;
      target[j] = accumulate_dx ? target[j] + value : value;
    }
  }
}

// Block (kColumns, kRowLanes), grid.x = ceil(D / kColumns): dw[j] += sum over n of dout[n, j] x[n, j]
// rstd[n], each column summed by its kRowLanes lanes in the fixed order above.
__global__ void __launch_bounds__(kColumnThreads)
    backward_dw_kernel(float* dw, const float* dout, const float* x, const float* rstd, int64_t N,
                       int64_t D) {
  __shared__ float partial[kRowLanes][kColumns];
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kColumns + threadIdx.x;
  float sum = 0.0f;
  if (j < D) {
    for (int64_t n = threadIdx.y; n < N; n += kRowLanes) sum += dout[n * D + j] * x[n * D + j] * rstd[n];
  }
  partial[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && j < D) {
    float total = 0.0f;
    for (int k = 0; k < kRowLanes; ++k) total += partial[k][threadIdx.x];
    dw[j] += total;
  }
}

template <class Out>
void launch_forward(Out* out, float* rstd, const float* x, const float* w, int64_t N, int64_t D, float eps) {
  if (N <= 0 || D <= 0) return;
  forward_kernel<Out><<<row_blocks(N), kRowThreads, 0, stream()>>>(out, rstd, x, w, N, D, eps);
  MT_CUDA_LAUNCHED("rmsnorm forward_kernel");
}

}  // namespace

void rmsnorm_forward(float* out, float* rstd, const float* x, const float* w, int64_t N, int64_t D,
                     float eps) {
  launch_forward(out, rstd, x, w, N, D, eps);
}

void rmsnorm_forward_bf16(uint16_t* out, float* rstd, const float* x, const float* w, int64_t N, int64_t D,
                          float eps) {
  launch_forward(out, rstd, x, w, N, D, eps);
}

void rmsnorm_backward(float* dx, float* dw, const float* dout, const float* x, const float* w,
                      const float* rstd, int64_t N, int64_t D, bool accumulate_dx) {
  if (N <= 0 || D <= 0) return;
  // dw first: it reads dout before the dx kernel writes dx (in case they share storage).
  // Cost: D / kColumns blocks of 1024 threads, each thread N / kRowLanes dependent adds (N = 16k, D = 4096:
  // 128 blocks, 512 adds per thread), about one read of dout and x.
  const dim3 dw_block(kColumns, kRowLanes);
  backward_dw_kernel<<<blocks_for(D, kColumns), dw_block, 0, stream()>>>(dw, dout, x, rstd, N, D);
  MT_CUDA_LAUNCHED("rmsnorm backward_dw_kernel");
  backward_dx_kernel<<<row_blocks(N), kRowThreads, 0, stream()>>>(dx, dout, x, w, rstd, N, D, accumulate_dx);
  MT_CUDA_LAUNCHED("rmsnorm backward_dx_kernel");
}

}  // namespace meshtrain::kernels::cuda
