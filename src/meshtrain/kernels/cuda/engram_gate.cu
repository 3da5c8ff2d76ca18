// Engram's gate on the GPU (engram_gate.h; semantics of kernels/cpu/engram_gate.h): per token and stream g,
// s_g = <q_g, k_g> / sqrt(D), gate_g = sigmoid(sign(s_g) sqrt(max(|s_g|, 1e-6))), gated_g = gate_g v; the
// backward writes d_q, d_k and d_v (the sum over streams, in stream order).
// Legend: N tokens, G streams, D width; q, k, gated, d_q, d_k, d_gated [N, G, D]; v, d_v [N, D]; gate [N, G].
#include <cstdint>

#include "meshtrain/kernels/cpu/engram_gate.h"  // kEngramGateFloor
#include "meshtrain/kernels/cuda/device.h"
#include "meshtrain/kernels/cuda/engram_gate.h"
#include "meshtrain/kernels/cuda/row_reduce.cuh"

namespace meshtrain::kernels::cuda {
namespace {

// The cpu's engram_gate_score / _of / _slope in float, with correctly rounded sqrt and division.
__device__ float score_of(float dot, int64_t D) {
  return __fdiv_rn(dot, __fsqrt_rn(static_cast<float>(D)));
}
__device__ float gate_of(float score) {
  const float sign = score > 0.0f ? 1.0f : score < 0.0f ? -1.0f : 0.0f;
  const float root = sign * __fsqrt_rn(fmaxf(fabsf(score), static_cast<float>(kEngramGateFloor)));
  return __fdiv_rn(1.0f, 1.0f + expf(-root));
}
__device__ float gate_slope(float score, float gate) {
  if (fabsf(score) <= static_cast<float>(kEngramGateFloor)) return 0.0f;
  return __fdiv_rn(gate * (1.0f - gate), 2.0f * __fsqrt_rn(fabsf(score)));
}

// The dot product of two rows of D, summed by the block (every thread gets it).
__device__ float row_dot(const float* a, const float* b, int64_t D, float* shared) {
  float sum = 0.0f;
  for (int64_t c = threadIdx.x; c < D; c += blockDim.x) sum += a[c] * b[c];
  return block_sum(sum, shared);
}

// One block per (token, stream) row: the score by a fixed-order block sum, then the row of gated.
__global__ void forward_kernel(float* gated, float* gate, const float* q, const float* k, const float* v,
                               int64_t N, int64_t G, int64_t D) {
  __shared__ float shared[32];
  for (int64_t row = blockIdx.x; row < N * G; row += gridDim.x) {
    const float value = gate_of(score_of(row_dot(q + row * D, k + row * D, D, shared), D));
    if (threadIdx.x == 0) gate[row] = value;
    const float* in = v + (row / G) * D;
    float* out = gated + row * D;
    for (int64_t c = threadIdx.x; c < D; c += blockDim.x) out[c] = value * in[c];
  }
}

// One block per token: d_v[c] = sum_g gate_g d_gated_g[c] (stream order, each element by one thread); per
// stream, d_gate = <d_gated_g, v> and the score again (block sums), then d_q_g = d_score k_g, d_k_g =
// d_score q_g with d_score = d_gate gate'(s) / sqrt(D).
__global__ void backward_kernel(float* d_q, float* d_k, float* d_v, const float* d_gated, const float* gate,
                                const float* q, const float* k, const float* v, int64_t N, int64_t G,
                                int64_t D) {
  __shared__ float shared[32];
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const float* value = v + n * D;
    for (int64_t c = threadIdx.x; c < D; c += blockDim.x) {
      float sum = 0.0f;
      for (int64_t g = 0; g < G; ++g) sum += gate[n * G + g] * d_gated[(n * G + g) * D + c];
      d_v[n * D + c] = sum;
    }
    for (int64_t g = 0; g < G; ++g) {
      const int64_t row = n * G + g;
      const float d_gate = row_dot(d_gated + row * D, value, D, shared);
      const float score = score_of(row_dot(q + row * D, k + row * D, D, shared), D);
      const float d_score =
          __fdiv_rn(d_gate * gate_slope(score, gate[row]), __fsqrt_rn(static_cast<float>(D)));
      for (int64_t c = threadIdx.x; c < D; c += blockDim.x) {
        d_q[row * D + c] = d_score * k[row * D + c];
        d_k[row * D + c] = d_score * q[row * D + c];
      }
    }
  }
}

}  // namespace

void engram_gate_forward(float* gated, float* gate, const float* q, const float* k, const float* v, int64_t N,
                         int64_t G, int64_t D) {
  if (N <= 0 || G <= 0 || D <= 0) return;
  forward_kernel<<<row_blocks(N * G), kRowThreads, 0, stream()>>>(gated, gate, q, k, v, N, G, D);
  MT_CUDA_LAUNCHED("engram_gate forward_kernel");
}

void engram_gate_backward(float* d_q, float* d_k, float* d_v, const float* d_gated, const float* gate,
                          const float* q, const float* k, const float* v, int64_t N, int64_t G, int64_t D) {
  if (N <= 0 || G <= 0 || D <= 0) return;
  backward_kernel<<<row_blocks(N), kRowThreads, 0, stream()>>>(d_q, d_k, d_v, d_gated, gate, q, k, v, N, G,
                                                               D);
  MT_CUDA_LAUNCHED("engram_gate backward_kernel");
}

}  // namespace meshtrain::kernels::cuda
