// mHC's stream mixes on the GPU (mhc_mix.h; semantics of kernels/cpu/mhc_mix.h):
//   coefficients: pre = sigmoid(a_pre h[0..G) + pre_beta) + 1e-6, post = 2 sigmoid(a_post h[G..2G) +
//                 post_beta), logits = a_res h[2G..) + res_beta
//   collapse:     xin = sum_g pre_g x_g                  expand: out_m = sum_k M[k, m] x_k + post_m o
//   entry / exit: the streams repeated / summed.
// Each output element is computed by one thread summing over streams in the cpu's order; the sums over D
// (d_pre, d_post, d_mixing) are one block's fixed-order tree, and the parameter gradients of the
// coefficients (sums over tokens) row_reduce.cuh's fixed column-sum layout: deterministic, no atomics.
// Legend: N tokens, G streams, D width, W = 2G + G^2 coefficient columns; x, out, d_x [N, G, D]; xin, o, d_o
// [N, D]; pre, post [N, G]; M (mixing), logits [N, G, G] row-major per token; h, d_h [N, W].
#include <cstdint>

#include "meshtrain/kernels/cpu/mhc_mix.h"  // kMhcPreFloor
#include "meshtrain/kernels/cuda/device.h"
#include "meshtrain/kernels/cuda/mhc_mix.h"
#include "meshtrain/kernels/cuda/row_reduce.cuh"

namespace meshtrain::kernels::cuda {
namespace {

// With accurate expf and division, as the cpu's mhc_sigmoid.
__device__ float sigmoid(float z) {
  return __fdiv_rn(1.0f, 1.0f + expf(-z));
}

// Flat over the N tokens: the token's 2G + G^2 coefficients as the cpu reference computes them.
__global__ void coefficients_forward_kernel(float* pre, float* post, float* logits, const float* h,
                                            const float* scales, const float* pre_beta,
                                            const float* post_beta, const float* res_beta, int64_t N,
                                            int64_t G) {
  const int64_t width = 2 * G + G * G;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t n = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; n < N; n += stride) {
    const float* row = h + n * width;
    for (int64_t g = 0; g < G; ++g) {
      pre[n * G + g] = sigmoid(scales[0] * row[g] + pre_beta[g]) + static_cast<float>(kMhcPreFloor);
      post[n * G + g] = 2.0f * sigmoid(scales[1] * row[G + g] + post_beta[g]);
    }
    for (int64_t i = 0; i < G * G; ++i) logits[n * G * G + i] = scales[2] * row[2 * G + i] + res_beta[i];
  }
}

// The gradient of the pre-activation z of coefficient column `column` < 2G of token n: through pre's
// sigmoid, or post's 2 sigmoid.
__device__ float d_activation(int64_t column, int64_t n, const float* d_pre, const float* d_post,
                              const float* h, const float* scales, const float* pre_beta,
                              const float* post_beta, int64_t G) {
  const float* row = h + n * (2 * G + G * G);
  if (column < G) {
    const float s = sigmoid(scales[0] * row[column] + pre_beta[column]);
    return d_pre[n * G + column] * s * (1.0f - s);
  }
  const int64_t g = column - G;
  const float s = sigmoid(scales[1] * row[column] + post_beta[g]);
  return d_post[n * G + g] * 2.0f * s * (1.0f - s);
}

// Flat over the N W elements of d_h (written): d_z times the column's scale.
__global__ void coefficients_backward_kernel(float* d_h, const float* d_pre, const float* d_post,
                                             const float* d_logits, const float* h, const float* scales,
                                             const float* pre_beta, const float* post_beta, int64_t N,
                                             int64_t G) {
  const int64_t width = 2 * G + G * G, total = N * width;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int64_t n = i / width, column = i - n * width;
    if (column < 2 * G) {
      const float d_z = d_activation(column, n, d_pre, d_post, h, scales, pre_beta, post_beta, G);
      d_h[i] = d_z * scales[column < G ? 0 : 1];
    } else {
      d_h[i] = d_logits[n * G * G + column - 2 * G] * scales[2];
    }
  }
}

// The parameters' gradients, sums over tokens, as W + 3 columns: column c < W is the bias of coefficient
// column c (pre_beta, post_beta, res_beta: d_z itself), column W + s the scale s (per token sum_g d_z h in
// column order, the cpu's order). Block (kColumns, kRowLanes), grid ceil((W + 3) / kColumns): lane k sums
// tokens k, k + kRowLanes, ... in order, lane 0 the lanes' partials in lane order, then adds to the
// gradient.
__global__ void __launch_bounds__(kColumnThreads)
    coefficients_parameters_kernel(float* d_scales, float* d_pre_beta, float* d_post_beta, float* d_res_beta,
                                   const float* d_pre, const float* d_post, const float* d_logits,
                                   const float* h, const float* scales, const float* pre_beta,
                                   const float* post_beta, int64_t N, int64_t G) {
  __shared__ float partial[kRowLanes][kColumns];
  const int64_t width = 2 * G + G * G;
  const int64_t column = static_cast<int64_t>(blockIdx.x) * kColumns + threadIdx.x;
  const bool active = column < width + 3;
  // The token's term of this column.
  const auto term = [&](int64_t n) {
    if (column < 2 * G) return d_activation(column, n, d_pre, d_post, h, scales, pre_beta, post_beta, G);
    if (column < width) return d_logits[n * G * G + column - 2 * G];
    const int64_t scale = column - width;
    const float* row = h + n * width;
    float sum = 0.0f;
    if (scale < 2) {
      for (int64_t g = 0; g < G; ++g) {
        const int64_t at = scale * G + g;
        sum += d_activation(at, n, d_pre, d_post, h, scales, pre_beta, post_beta, G) * row[at];
      }
    } else {
      for (int64_t i = 0; i < G * G; ++i) sum += d_logits[n * G * G + i] * row[2 * G + i];
    }
    return sum;
  };
  float sum = 0.0f;
  if (active) {
    for (int64_t n = threadIdx.y; n < N; n += kRowLanes) sum += term(n);
  }
  partial[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && active) {
    float total = 0.0f;
    for (int lane = 0; lane < kRowLanes; ++lane) total += partial[lane][threadIdx.x];
    if (column < G) {
      d_pre_beta[column] += total;
    } else if (column < 2 * G) {
      d_post_beta[column - G] += total;
    } else if (column < width) {
      d_res_beta[column - 2 * G] += total;
    } else {
      d_scales[column - width] += total;
    }
  }
}

// Flat over N D: xin = sum_g pre_g x_g in stream order.
__global__ void collapse_forward_kernel(float* xin, const float* x, const float* pre, int64_t N, int64_t G,
                                        int64_t D) {
  const int64_t total = N * D;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int64_t n = i / D, c = i - n * D;
    float sum = 0.0f;
    for (int64_t g = 0; g < G; ++g) sum += pre[n * G + g] * x[(n * G + g) * D + c];
    xin[i] = sum;
  }
}

// Flat over N G D: d_x += pre_g d_xin.
__global__ void collapse_backward_streams_kernel(float* d_x, const float* d_xin, const float* pre, int64_t N,
                                                 int64_t G, int64_t D) {
  const int64_t total = N * G * D;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int64_t row = i / D, c = i - row * D, n = row / G;
    d_x[i] += pre[row] * d_xin[n * D + c];
  }
}

// One block per (token, pair) of rows a, b of width D: out[pair] = <a, b> (a fixed-order block sum). The
// pair p of token n reads row a_row(n, p) of `a` and b_row(n, p) of `b`: the callers' layouts below.
enum class DotPairs {
  streams_with_token,  // pairs G: <x[n, p], d[n]> (collapse's d_pre)
  token_with_streams,  // pairs G: <o[n], d[n, p]> (expand's d_post)
  stream_pairs,        // pairs G^2, p = k G + m: <x[n, k], d[n, m]> (expand's d_mixing)
};
__global__ void dot_kernel(float* out, const float* a, const float* b, int64_t N, int64_t G, int64_t D,
                           DotPairs pairs) {
  __shared__ float shared[32];
  const int64_t per_token = pairs == DotPairs::stream_pairs ? G * G : G;
  for (int64_t at = blockIdx.x; at < N * per_token; at += gridDim.x) {
    const int64_t n = at / per_token, p = at - n * per_token;
    int64_t a_row = n * G + p, b_row = n;  // streams_with_token
    if (pairs == DotPairs::token_with_streams) {
      a_row = n;
      b_row = n * G + p;
    } else if (pairs == DotPairs::stream_pairs) {
      a_row = n * G + p / G;
      b_row = n * G + p % G;
    }
    float sum = 0.0f;
    for (int64_t c = threadIdx.x; c < D; c += blockDim.x) sum += a[a_row * D + c] * b[b_row * D + c];
    sum = block_sum(sum, shared);
    if (threadIdx.x == 0) out[at] = sum;
  }
}

void launch_dot(float* out, const float* a, const float* b, int64_t N, int64_t G, int64_t D, DotPairs pairs) {
  const int64_t per_token = pairs == DotPairs::stream_pairs ? G * G : G;
  dot_kernel<<<row_blocks(N * per_token), kRowThreads, 0, stream()>>>(out, a, b, N, G, D, pairs);
  MT_CUDA_LAUNCHED("mhc_mix dot_kernel");
}

// Flat over N G D: out_m = post_m o + sum_k M[k, m] x_k, in the cpu's order.
__global__ void expand_forward_kernel(float* out, const float* x, const float* mixing, const float* post,
                                      const float* o, int64_t N, int64_t G, int64_t D) {
  const int64_t total = N * G * D;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int64_t row = i / D, c = i - row * D, n = row / G, m = row - n * G;
    float sum = post[row] * o[n * D + c];
    for (int64_t k = 0; k < G; ++k) sum += mixing[(n * G + k) * G + m] * x[(n * G + k) * D + c];
    out[i] = sum;
  }
}

// Flat over N G D, and N D for d_o: d_x_k = sum_m M[k, m] d_out_m (written), d_o = sum_m post_m d_out_m
// (written), each in stream order from zero.
__global__ void expand_backward_values_kernel(float* d_x, float* d_o, const float* d_out, const float* mixing,
                                              const float* post, int64_t N, int64_t G, int64_t D) {
  const int64_t total = N * G * D;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int64_t row = i / D, c = i - row * D, n = row / G, k = row - n * G;
    float sum = 0.0f;
    for (int64_t m = 0; m < G; ++m) sum += mixing[(n * G + k) * G + m] * d_out[(n * G + m) * D + c];
    d_x[i] = sum;
    if (k == 0) {
      float branch = 0.0f;
      for (int64_t m = 0; m < G; ++m) branch += post[n * G + m] * d_out[(n * G + m) * D + c];
      d_o[n * D + c] = branch;
    }
  }
}

// Flat over N G D: out[n, g] = x[n].
__global__ void repeat_kernel(float* out, const float* x, int64_t N, int64_t G, int64_t D) {
  const int64_t total = N * G * D;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int64_t row = i / D, c = i - row * D;
    out[i] = x[(row / G) * D + c];
  }
}

// Flat over N D: out = (out or 0) + the streams in stream order.
__global__ void sum_kernel(float* out, const float* x, int64_t N, int64_t G, int64_t D, bool accumulate) {
  const int64_t total = N * D;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int64_t n = i / D, c = i - n * D;
    float sum = accumulate ? out[i] : 0.0f;
    for (int64_t g = 0; g < G; ++g) sum += x[(n * G + g) * D + c];
    out[i] = sum;
  }
}

}  // namespace

void mhc_coefficients_forward(float* pre, float* post, float* logits, const float* h, const float* scales,
                              const float* pre_beta, const float* post_beta, const float* res_beta, int64_t N,
                              int64_t G) {
  if (N <= 0 || G <= 0) return;
  coefficients_forward_kernel<<<elementwise_blocks(N), kElementwiseThreads, 0, stream()>>>(
      pre, post, logits, h, scales, pre_beta, post_beta, res_beta, N, G);
  MT_CUDA_LAUNCHED("mhc_mix coefficients_forward_kernel");
}

void mhc_coefficients_backward(float* d_h, float* d_scales, float* d_pre_beta, float* d_post_beta,
                               float* d_res_beta, const float* d_pre, const float* d_post,
                               const float* d_logits, const float* h, const float* scales,
                               const float* pre_beta, const float* post_beta, int64_t N, int64_t G) {
  if (N <= 0 || G <= 0) return;
  const int64_t width = 2 * G + G * G;
  coefficients_backward_kernel<<<elementwise_blocks(N * width), kElementwiseThreads, 0, stream()>>>(
      d_h, d_pre, d_post, d_logits, h, scales, pre_beta, post_beta, N, G);
  MT_CUDA_LAUNCHED("mhc_mix coefficients_backward_kernel");
  coefficients_parameters_kernel<<<blocks_for(width + 3, kColumns), dim3(kColumns, kRowLanes), 0, stream()>>>(
      d_scales, d_pre_beta, d_post_beta, d_res_beta, d_pre, d_post, d_logits, h, scales, pre_beta, post_beta,
      N, G);
  MT_CUDA_LAUNCHED("mhc_mix coefficients_parameters_kernel");
}

void mhc_collapse_forward(float* xin, const float* x, const float* pre, int64_t N, int64_t G, int64_t D) {
  if (N <= 0 || D <= 0) return;
  collapse_forward_kernel<<<elementwise_blocks(N * D), kElementwiseThreads, 0, stream()>>>(xin, x, pre, N, G,
                                                                                           D);
  MT_CUDA_LAUNCHED("mhc_mix collapse_forward_kernel");
}

void mhc_collapse_backward(float* d_x, float* d_pre, const float* d_xin, const float* x, const float* pre,
                           int64_t N, int64_t G, int64_t D) {
  if (N <= 0 || G <= 0) return;
  launch_dot(d_pre, x, d_xin, N, G, D, DotPairs::streams_with_token);
  if (D <= 0) return;
  collapse_backward_streams_kernel<<<elementwise_blocks(N * G * D), kElementwiseThreads, 0, stream()>>>(
      d_x, d_xin, pre, N, G, D);
  MT_CUDA_LAUNCHED("mhc_mix collapse_backward_streams_kernel");
}

void mhc_expand_forward(float* out, const float* x, const float* mixing, const float* post, const float* o,
                        int64_t N, int64_t G, int64_t D) {
  if (N <= 0 || G <= 0 || D <= 0) return;
  expand_forward_kernel<<<elementwise_blocks(N * G * D), kElementwiseThreads, 0, stream()>>>(
      out, x, mixing, post, o, N, G, D);
  MT_CUDA_LAUNCHED("mhc_mix expand_forward_kernel");
}

void mhc_expand_backward(float* d_x, float* d_mixing, float* d_post, float* d_o, const float* d_out,
                         const float* x, const float* mixing, const float* post, const float* o, int64_t N,
                         int64_t G, int64_t D) {
  if (N <= 0 || G <= 0) return;
  launch_dot(d_post, o, d_out, N, G, D, DotPairs::token_with_streams);
  launch_dot(d_mixing, x, d_out, N, G, D, DotPairs::stream_pairs);
  if (D <= 0) return;
  expand_backward_values_kernel<<<elementwise_blocks(N * G * D), kElementwiseThreads, 0, stream()>>>(
      d_x, d_o, d_out, mixing, post, N, G, D);
  MT_CUDA_LAUNCHED("mhc_mix expand_backward_values_kernel");
}

void mhc_streams_repeat(float* out, const float* x, int64_t N, int64_t G, int64_t D) {
  if (N <= 0 || G <= 0 || D <= 0) return;
  repeat_kernel<<<elementwise_blocks(N * G * D), kElementwiseThreads, 0, stream()>>>(out, x, N, G, D);
  MT_CUDA_LAUNCHED("mhc_mix repeat_kernel");
}

void mhc_streams_sum(float* out, const float* x, int64_t N, int64_t G, int64_t D, bool accumulate) {
  if (N <= 0 || D <= 0) return;
  sum_kernel<<<elementwise_blocks(N * D), kElementwiseThreads, 0, stream()>>>(out, x, N, G, D, accumulate);
  MT_CUDA_LAUNCHED("mhc_mix sum_kernel");
}

}  // namespace meshtrain::kernels::cuda
