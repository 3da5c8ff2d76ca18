// RMSNorm on the GPU (rmsnorm.h; semantics of kernels/cpu/rmsnorm.h): out = w * x * rstd with rstd =
// 1 / sqrt(mean(x^2) + eps) saved per row; backward dx = (or +=) dL/dx, dw += dL/dw. The per-stream form
// (Engram, mHC) is the same with G rows per token, row g scaled by w[g]; the plain form is G = 1.
// rmsnorm_forward_bf16 writes out in bf16 (float32 math, one rounding on the store), as the cpu's.
// Legend: N tokens, G streams (rows per token), D width (columns); x, out, dout, dx [N, G, D]; w, dw [G, D];
// rstd [N, G].
#include <algorithm>
#include <cstdint>

#include "meshtrain/kernels/cuda/bf16.cuh"
#include "meshtrain/kernels/cuda/device.h"
#include "meshtrain/kernels/cuda/rmsnorm.h"
#include "meshtrain/kernels/cuda/row_reduce.cuh"

namespace meshtrain::kernels::cuda {
namespace {

// One block per row (N G rows): rstd = 1 / sqrt(sum(x^2) / D + eps) (correctly rounded sqrt and division, as
// the cpu's std::sqrt and /), out = w * (x * rstd) in the cpu's order, w the row's stream's scale. Out: float
// (float32 out) or uint16_t (bf16).
template <class Out>
__global__ void forward_kernel(Out* out, float* rstd, const float* x, const float* w, int64_t N, int64_t G,
                               int64_t D, float eps) {
  __shared__ float shared[32];
  for (int64_t n = blockIdx.x; n < N * G; n += gridDim.x) {
    const float* row = x + n * D;
    const float* scale = w + (n % G) * D;
    float sum_squares = 0.0f;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) sum_squares += row[j] * row[j];
    const float r = inverse_root_mean(block_sum(sum_squares, shared), D, eps);
    if (threadIdx.x == 0) rstd[n] = r;
    Out* target = out + n * D;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x)
      store_output(target, j, __fmul_rn(scale[j], __fmul_rn(row[j], r)));
  }
}

// One block per row (N G rows): projection = sum(w * dout * x); dx = r w dout - x r^3 projection / D,
// written or added, w the row's stream's scale. Each thread reads dout[j] and x[j] before it writes dx[j]
// (and the row sum is complete before any write), so dx may share dout's storage when not accumulating.
__global__ void backward_dx_kernel(float* dx, const float* dout, const float* x, const float* w,
                                   const float* rstd, int64_t N, int64_t G, int64_t D, bool accumulate_dx) {
  __shared__ float shared[32];
  for (int64_t n = blockIdx.x; n < N * G; n += gridDim.x) {
    const float* scale = w + (n % G) * D;
    const float* row = x + n * D;
    const float* grad = dout + n * D;
    float* target = dx + n * D;
    const float r = rstd[n];
    float projection = 0.0f;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) projection += scale[j] * grad[j] * row[j];
    projection = block_sum(projection, shared);
    const float x_scale = r * r * r * projection / static_cast<float>(D);
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
      const float value = r * scale[j] * grad[j] - row[j] * x_scale;
      target[j] = accumulate_dx ? target[j] + value : value;
    }
  }
}

// Block (kColumns, kRowLanes), grid.x = ceil(G D / kColumns): dw [G, D] as the G D columns of the [N, G D]
// token rows, dw[j] += sum over n of dout[n, j] x[n, j] rstd[n, j / D], each column summed by its kRowLanes
// lanes in the fixed order above.
__global__ void __launch_bounds__(kColumnThreads)
    backward_dw_kernel(float* dw, const float* dout, const float* x, const float* rstd, int64_t N, int64_t G,
                       int64_t D) {
  __shared__ float partial[kRowLanes][kColumns];
  const int64_t width = G * D;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kColumns + threadIdx.x;
  float sum = 0.0f;
  if (j < width) {
    const int64_t stream = j / D;
    for (int64_t n = threadIdx.y; n < N; n += kRowLanes) {
      sum += dout[n * width + j] * x[n * width + j] * rstd[n * G + stream];
    }
  }
  partial[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && j < width) {
    float total = 0.0f;
    for (int k = 0; k < kRowLanes; ++k) total += partial[k][threadIdx.x];
    dw[j] += total;
  }
}

template <class Out>
void launch_forward(Out* out, float* rstd, const float* x, const float* w, int64_t N, int64_t G, int64_t D,
                    float eps) {
  if (N <= 0 || G <= 0 || D <= 0) return;
  forward_kernel<Out><<<row_blocks(N * G), kRowThreads, 0, stream()>>>(out, rstd, x, w, N, G, D, eps);
  MT_CUDA_LAUNCHED("rmsnorm forward_kernel");
}

}  // namespace

void rmsnorm_streams_forward(float* out, float* rstd, const float* x, const float* w, int64_t N, int64_t G,
                             int64_t D, float eps) {
  launch_forward(out, rstd, x, w, N, G, D, eps);
}

void rmsnorm_streams_backward(float* dx, float* dw, const float* dout, const float* x, const float* w,
                              const float* rstd, int64_t N, int64_t G, int64_t D, bool accumulate_dx) {
  if (N <= 0 || G <= 0 || D <= 0) return;
  // dw first: it reads dout before the dx kernel writes dx (in case they share storage).
  // Cost: G D / kColumns blocks of 1024 threads, each thread N / kRowLanes dependent adds (N = 16k, D = 4096:
  // 128 blocks a stream, 512 adds per thread), about one read of dout and x.
  const dim3 dw_block(kColumns, kRowLanes);
  backward_dw_kernel<<<blocks_for(G * D, kColumns), dw_block, 0, stream()>>>(dw, dout, x, rstd, N, G, D);
  MT_CUDA_LAUNCHED("rmsnorm backward_dw_kernel");
  backward_dx_kernel<<<row_blocks(N * G), kRowThreads, 0, stream()>>>(dx, dout, x, w, rstd, N, G, D,
                                                                      accumulate_dx);
  MT_CUDA_LAUNCHED("rmsnorm backward_dx_kernel");
}

void rmsnorm_forward(float* out, float* rstd, const float* x, const float* w, int64_t N, int64_t D,
                     float eps) {
  launch_forward(out, rstd, x, w, N, 1, D, eps);
}

void rmsnorm_forward_bf16(uint16_t* out, float* rstd, const float* x, const float* w, int64_t N, int64_t D,
                          float eps) {
  launch_forward(out, rstd, x, w, N, 1, D, eps);
}

void rmsnorm_backward(float* dx, float* dw, const float* dout, const float* x, const float* w,
                      const float* rstd, int64_t N, int64_t D, bool accumulate_dx) {
  rmsnorm_streams_backward(dx, dw, dout, x, w, rstd, N, 1, D, accumulate_dx);
}

}  // namespace meshtrain::kernels::cuda
