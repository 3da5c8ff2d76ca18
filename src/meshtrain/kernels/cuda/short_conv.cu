// Engram's ShortConv on the GPU (short_conv.h; semantics of kernels/cpu/short_conv.h):
//   y[t, c] = sum_{j=0..K-1} w[j, c] u[t - (K-1-j) dilation, c]
// over a stretch of T times per row, earlier times read from `halo` (or zeros); then out = x + gated +
// silu(y). Every output element is summed by one thread over taps in tap order (as the cpu), and each tap's
// weight gradient in a fixed (row, time) partition: deterministic, no atomics.
// Legend: B rows, T times, C channels (G D), K taps, H = (K - 1) dilation halo times; u, y, d_u, d_y
// [B, T, C]; halo, d_halo [B, H, C]; w, d_w [K, C].
#include <cstdint>

#include "meshtrain/kernels/cuda/device.h"
#include "meshtrain/kernels/cuda/row_reduce.cuh"
#include "meshtrain/kernels/cuda/short_conv.h"

namespace meshtrain::kernels::cuda {
namespace {

// Row b's input at time `source` of the stretch, channel c: u, the halo before it, or nullptr (zeros).
__device__ const float* input_at(const float* u, const float* halo, int64_t b, int64_t source, int64_t c,
                                 int64_t T, int64_t C, int64_t H) {
  if (source >= 0) return u + (b * T + source) * C + c;
  if (halo != nullptr && source >= -H) return halo + (b * H + H + source) * C + c;
  return nullptr;
}

// Flat over the B T C outputs: y = the taps' products in tap order, the missing inputs skipped.
__global__ void forward_kernel(float* y, const float* u, const float* halo, const float* w, int64_t B,
                               int64_t T, int64_t C, int64_t K, int64_t dilation) {
  const int64_t H = (K - 1) * dilation, total = B * T * C;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int64_t bt = i / C, c = i - bt * C, b = bt / T, t = bt - b * T;
    float sum = 0.0f;
    for (int64_t j = 0; j < K; ++j) {
      const float* in = input_at(u, halo, b, t - (K - 1 - j) * dilation, c, T, C, H);
      if (in != nullptr) sum += w[j * C + c] * *in;
    }
    y[i] = sum;
  }
}

// Flat over the B (H + T) C input elements (halo times first; skipped without d_halo): the gradient of an
// input is a gather over the outputs that read it, d_u[t] = sum_j d_y[t + (K-1-j) dilation] w[j], in tap
// order, written.
__global__ void backward_input_kernel(float* d_u, float* d_halo, const float* d_y, const float* w, int64_t B,
                                      int64_t T, int64_t C, int64_t K, int64_t dilation) {
  const int64_t H = (K - 1) * dilation, total = B * (T + H) * C;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int64_t row = i / C, c = i - row * C, b = row / (T + H), time = row - b * (T + H) - H;
    if (time < 0 && d_halo == nullptr) continue;
    float sum = 0.0f;
    for (int64_t j = 0; j < K; ++j) {
      const int64_t reader = time + (K - 1 - j) * dilation;
      if (reader >= 0 && reader < T) sum += d_y[(b * T + reader) * C + c] * w[j * C + c];
    }
    if (time >= 0) {
      d_u[(b * T + time) * C + c] = sum;
    } else {
      d_halo[(b * H + H + time) * C + c] = sum;
    }
  }
}

// Block (kColumns, kRowLanes), grid (ceil(C / kColumns), K): d_w[j, c] += sum over (b, t) of d_y[b, t, c]
// u[b, t - (K-1-j) dilation, c], lane k summing the (b, t) rows k, k + kRowLanes, ... in order, then lane 0
// the lanes' partials in lane order (row_reduce.cuh's column-sum layout).
__global__ void __launch_bounds__(kColumnThreads)
    backward_weight_kernel(float* d_w, const float* d_y, const float* u, const float* halo, int64_t B,
                           int64_t T, int64_t C, int64_t K, int64_t dilation) {
  __shared__ float partial[kRowLanes][kColumns];
  const int64_t H = (K - 1) * dilation;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kColumns + threadIdx.x;
  const int64_t j = blockIdx.y;
  float sum = 0.0f;
  if (c < C) {
    for (int64_t bt = threadIdx.y; bt < B * T; bt += kRowLanes) {
      const int64_t b = bt / T, t = bt - b * T;
      const float* in = input_at(u, halo, b, t - (K - 1 - j) * dilation, c, T, C, H);
      if (in != nullptr) sum += d_y[bt * C + c] * *in;
    }
  }
  partial[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float total = 0.0f;
    for (int lane = 0; lane < kRowLanes; ++lane) total += partial[lane][threadIdx.x];
    d_w[j * C + c] += total;
  }
}

// With accurate expf and division, as the cpu's silu_of (y / (1 + e^-y)) and silu_slope (through sigmoid).
__device__ float sigmoid(float y) {
  return __fdiv_rn(1.0f, 1.0f + expf(-y));
}

__global__ void output_forward_kernel(float* out, const float* x, const float* gated, const float* y,
                                      int64_t count) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    out[i] = x[i] + gated[i] + __fdiv_rn(y[i], 1.0f + expf(-y[i]));
  }
}

// d_gated = d_out, d_y = d_out silu'(y); each element's reads come before its writes.
__global__ void output_backward_kernel(float* d_gated, float* d_y, const float* d_out, const float* y,
                                       int64_t count) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    const float gradient = d_out[i], value = y[i];
    const float s = sigmoid(value);
    d_gated[i] = gradient;
    d_y[i] = gradient * (s * (1.0f + value * (1.0f - s)));
  }
}

}  // namespace

void short_conv_forward(float* y, const float* u, const float* halo, const float* w, int64_t B, int64_t T,
                        int64_t C, int64_t K, int64_t dilation) {
  if (B <= 0 || T <= 0 || C <= 0) return;
  forward_kernel<<<elementwise_blocks(B * T * C), kElementwiseThreads, 0, stream()>>>(y, u, halo, w, B, T, C,
                                                                                      K, dilation);
  MT_CUDA_LAUNCHED("short_conv forward_kernel");
}

void short_conv_backward(float* d_u, float* d_halo, float* d_w, const float* d_y, const float* u,
                         const float* halo, const float* w, int64_t B, int64_t T, int64_t C, int64_t K,
                         int64_t dilation) {
  if (B <= 0 || C <= 0) return;
  const int64_t H = (K - 1) * dilation;
  if (T + H > 0) {
    backward_input_kernel<<<elementwise_blocks(B * (T + H) * C), kElementwiseThreads, 0, stream()>>>(
        d_u, d_halo, d_y, w, B, T, C, K, dilation);
    MT_CUDA_LAUNCHED("short_conv backward_input_kernel");
  }
  if (T <= 0 || K <= 0) return;
  // Cost: C / kColumns x K blocks of 1024 threads, each thread B T / kRowLanes adds (B T = 16k, C = 2048,
  // K = 4: 256 blocks, 512 adds per thread).
  const dim3 grid(blocks_for(C, kColumns), static_cast<unsigned>(K));
  backward_weight_kernel<<<grid, dim3(kColumns, kRowLanes), 0, stream()>>>(d_w, d_y, u, halo, B, T, C, K,
                                                                           dilation);
  MT_CUDA_LAUNCHED("short_conv backward_weight_kernel");
}

void short_conv_output_forward(float* out, const float* x, const float* gated, const float* y,
                               int64_t count) {
  if (count <= 0) return;
  output_forward_kernel<<<elementwise_blocks(count), kElementwiseThreads, 0, stream()>>>(out, x, gated, y,
                                                                                         count);
  MT_CUDA_LAUNCHED("short_conv output_forward_kernel");
}

void short_conv_output_backward(float* d_gated, float* d_y, const float* d_out, const float* y,
                                int64_t count) {
  if (count <= 0) return;
  output_backward_kernel<<<elementwise_blocks(count), kElementwiseThreads, 0, stream()>>>(d_gated, d_y, d_out,
                                                                                          y, count);
  MT_CUDA_LAUNCHED("short_conv output_backward_kernel");
}

}  // namespace meshtrain::kernels::cuda
