// LayerNorm on the GPU (layernorm.h; semantics of kernels/cpu/layernorm.h): out = (x - mean) rstd w + b with
// mean and rstd = 1 / sqrt(var + eps) (biased, two-pass) saved per row; backward dx = (or +=) dL/dx,
// dw += dL/dw, db += dL/db.
// layernorm_forward_bf16 writes out in bf16 (float32 math, one rounding on the store), as the cpu's.
// Legend: N tokens (rows), D width (columns); x, out, dout, dx [N, D]; w, b, dw, db [D]; mean, rstd [N].
#include <algorithm>
#include <cstdint>

#include "meshtrain/kernels/cuda/bf16.cuh"
#include "meshtrain/kernels/cuda/device.h"
#include "meshtrain/kernels/cuda/layernorm.h"
#include "meshtrain/kernels/cuda/row_reduce.cuh"

namespace meshtrain::kernels::cuda {
namespace {

// One block per row, two passes as the cpu (E[x^2] - mean^2 cancels when |mean| >> std): mean = sum(x) / D,
// rstd = 1 / sqrt(sum((x - mean)^2) / D + eps) (correctly rounded sqrt and division), then
// out = (x - mean) rstd w + b. Out: float (float32 out) or uint16_t (bf16 out).
template <class Out>
__global__ void forward_kernel(Out* out, float* mean, float* rstd, const float* x, const float* w,
                               const float* b, int64_t N, int64_t D, float eps) {
  __shared__ float shared[32];
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const float* row = x + n * D;
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) sum += row[j];
    const float m = __fdiv_rn(block_sum(sum, shared), static_cast<float>(D));
    float sum_squares = 0.0f;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
      const float centered = row[j] - m;
      sum_squares += centered * centered;
    }
    const float r = inverse_root_mean(block_sum(sum_squares, shared), D, eps);
    if (threadIdx.x == 0) {
      mean[n] = m;
      rstd[n] = r;
    }
    Out* target = out + n * D;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x)
      store_output(target, j, (row[j] - m) * r * w[j] + b[j]);
  }
}

// One block per row: with g = w dout and xhat = (x - mean) rstd, mean_g = sum(g) / D and mean_g_xhat =
// sum(g xhat) / D; dx = rstd (g - mean_g - xhat mean_g_xhat), written or added. Each thread reads dout[j]
// and x[j] before it writes dx[j] (the row sums are complete before any write), so dx may share dout's
// storage when not accumulating.
__global__ void backward_dx_kernel(float* dx, const float* dout, const float* x, const float* w,
                                   const float* mean, const float* rstd, int64_t N, int64_t D,
                                   bool accumulate_dx) {
  __shared__ float shared[32];
  const float inv_d = 1.0f / static_cast<float>(D);
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const float* row = x + n * D;
    const float* grad = dout + n * D;
    float* target = dx + n * D;
    const float m = mean[n], r = rstd[n];
    float sum_g = 0.0f, sum_g_xhat = 0.0f;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
      const float g = w[j] * grad[j];
      sum_g += g;
      sum_g_xhat += g * (row[j] - m) * r;
    }
    const float mean_g = block_sum(sum_g, shared) * inv_d;
    const float mean_g_xhat = block_sum(sum_g_xhat, shared) * inv_d;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
      const float value = r * (w[j] * grad[j] - mean_g - (row[j] - m) * r * mean_g_xhat);
      target[j] = accumulate_dx ? target[j] + value : value;
    }
  }
}

// Block (kColumns, kRowLanes), grid.x = ceil(D / kColumns): dw[j] += sum over n of dout[n, j] (x[n, j] -
// mean[n]) rstd[n] and db[j] += sum over n of dout[n, j], each column summed in the fixed order above.
__global__ void __launch_bounds__(kColumnThreads)
    backward_dw_db_kernel(float* dw, float* db, const float* dout, const float* x, const float* mean,
                          const float* rstd, int64_t N, int64_t D) {
  __shared__ float partial_w[kRowLanes][kColumns];
  __shared__ float partial_b[kRowLanes][kColumns];
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kColumns + threadIdx.x;
  float sum_w = 0.0f, sum_b = 0.0f;
  if (j < D) {
    for (int64_t n = threadIdx.y; n < N; n += kRowLanes) {
      const float g = dout[n * D + j];
      sum_w += g * (x[n * D + j] - mean[n]) * rstd[n];
      sum_b += g;
    }
  }
  partial_w[threadIdx.y][threadIdx.x] = sum_w;
  partial_b[threadIdx.y][threadIdx.x] = sum_b;
  __syncthreads();
  if (threadIdx.y == 0 && j < D) {
    float total_w = 0.0f, total_b = 0.0f;
    for (int k = 0; k < kRowLanes; ++k) {
      total_w += partial_w[k][threadIdx.x];
      total_b += partial_b[k][threadIdx.x];
    }
    dw[j] += total_w;
    db[j] += total_b;
  }
}

template <class Out>
void launch_forward(Out* out, float* mean, float* rstd, const float* x, const float* w, const float* b,
                    int64_t N, int64_t D, float eps) {
  if (N <= 0 || D <= 0) return;
  forward_kernel<Out><<<row_blocks(N), kRowThreads, 0, stream()>>>(out, mean, rstd, x, w, b, N, D, eps);
  MT_CUDA_LAUNCHED("layernorm forward_kernel");
}

}  // namespace

void layernorm_forward(float* out, float* mean, float* rstd, const float* x, const float* w, const float* b,
                       int64_t N, int64_t D, float eps) {
  launch_forward(out, mean, rstd, x, w, b, N, D, eps);
}

void layernorm_forward_bf16(uint16_t* out, float* mean, float* rstd, const float* x, const float* w,
                            const float* b, int64_t N, int64_t D, float eps) {
  launch_forward(out, mean, rstd, x, w, b, N, D, eps);
}

void layernorm_backward(float* dx, float* dw, float* db, const float* dout, const float* x, const float* w,
                        const float* mean, const float* rstd, int64_t N, int64_t D, bool accumulate_dx) {
  if (N <= 0 || D <= 0) return;
  // dw / db first: they read dout before the dx kernel writes dx (in case they share storage).
  // Cost: D / kColumns blocks of 1024 threads, each thread N / kRowLanes dependent adds (N = 16k, D = 768:
  // 24 blocks, 512 adds per thread), about one read of dout and x.
  const dim3 dw_block(kColumns, kRowLanes);
  backward_dw_db_kernel<<<blocks_for(D, kColumns), dw_block, 0, stream()>>>(dw, db, dout, x, mean, rstd, N,
                                                                            D);
  MT_CUDA_LAUNCHED("layernorm backward_dw_db_kernel");
  backward_dx_kernel<<<row_blocks(N), kRowThreads, 0, stream()>>>(dx, dout, x, w, mean, rstd, N, D,
                                                                  accumulate_dx);
  MT_CUDA_LAUNCHED("layernorm backward_dx_kernel");
}

}  // namespace meshtrain::kernels::cuda
