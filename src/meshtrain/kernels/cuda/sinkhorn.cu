// mHC's Sinkhorn on the GPU (sinkhorn.h; semantics of kernels/cpu/sinkhorn.h): per token, M = softmax(T,
// rows) + 1e-6, normalise columns, then (iterations - 1) times rows then columns (each denominator + 1e-6);
// the backward recomputes the token's iterates and goes back through every normalisation.
// One block per token, its iterates in shared memory (2 iterations G^2 values, at most the cpu's
// kSinkhornMaxStageValues, plus 2 G^2 of gradient): each thread owns lines (rows or columns) and sums each
// in the cpu's order, stage after stage in the cpu's order, so the result is the cpu's arithmetic (up to
// expf against std::exp and contracted multiply-adds) and deterministic.
// Legend: N tokens, G streams; logits, mixing, d_logits, d_mixing [N, G, G] row-major per token.
#include <cstdint>

#include "meshtrain/core/error.h"
#include "meshtrain/kernels/cpu/sinkhorn.h"  // kSinkhornEpsilon, kSinkhornMaxStageValues
#include "meshtrain/kernels/cuda/device.h"
#include "meshtrain/kernels/cuda/row_reduce.cuh"
#include "meshtrain/kernels/cuda/sinkhorn.h"

namespace meshtrain::kernels::cuda {
namespace {

// One warp a token: G is small (mHC's 4); a thread takes lines a, a + 32, ... where G > 32.
constexpr int kTokenThreads = 32;
constexpr float kEpsilon = static_cast<float>(kSinkhornEpsilon);

// Element b of line a: row a (a G + b) or column a (b G + a).
__device__ int64_t line_at(bool columns, int64_t a, int64_t b, int64_t G) {
  return columns ? b * G + a : a * G + b;
}

// The token's stages [2 iterations, G, G] (the cpu's sinkhorn_token_forward): stage 0 the row softmax + eps,
// then one normalisation each, columns first. Every thread of the block calls it.
__device__ void token_forward(float* stages, const float* logits, int64_t G, int64_t iterations) {
  for (int64_t i = threadIdx.x; i < G; i += blockDim.x) {
    const float* row = logits + i * G;
    float largest = row[0];
    for (int64_t j = 1; j < G; ++j) largest = fmaxf(largest, row[j]);
    float sum = 0.0f;
    for (int64_t j = 0; j < G; ++j) sum += stages[i * G + j] = expf(row[j] - largest);
    for (int64_t j = 0; j < G; ++j) stages[i * G + j] = __fdiv_rn(stages[i * G + j], sum) + kEpsilon;
  }
  __syncthreads();
  for (int64_t stage = 1; stage < 2 * iterations; ++stage) {
    const float* in = stages + (stage - 1) * G * G;
    float* out = stages + stage * G * G;
    const bool columns = stage % 2 == 1;
    for (int64_t a = threadIdx.x; a < G; a += blockDim.x) {
      float sum = 0.0f;
      for (int64_t b = 0; b < G; ++b) sum += in[line_at(columns, a, b, G)];
      const float denominator = sum + kEpsilon;
      for (int64_t b = 0; b < G; ++b) {
        const int64_t at = line_at(columns, a, b, G);
        out[at] = __fdiv_rn(in[at], denominator);
      }
    }
    __syncthreads();
  }
}

// Dynamic shared memory: [2 iterations G^2] stages.
__global__ void forward_kernel(float* mixing, const float* logits, int64_t N, int64_t G, int64_t iterations) {
  extern __shared__ float stages[];
  const int64_t GG = G * G;
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    token_forward(stages, logits + n * GG, G, iterations);
    const float* last = stages + (2 * iterations - 1) * GG;
    for (int64_t i = threadIdx.x; i < GG; i += blockDim.x) mixing[n * GG + i] = last[i];
    __syncthreads();  // every thread has read the stages before the next token overwrites them
  }
}

// Dynamic shared memory: [2 iterations G^2] stages, then [2 G^2] gradients. The cpu's
// sinkhorn_token_backward: y = x / (s + eps) over each line gives dx = (dy - sum over the line of dy y) /
// (s + eps), stage by stage back to the softmax, whose dT = p (dp - sum dp p) with p = stage 0 - eps.
__global__ void backward_kernel(float* d_logits, const float* d_mixing, const float* logits, int64_t N,
                                int64_t G, int64_t iterations) {
  extern __shared__ float stages[];
  const int64_t GG = G * G;
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    token_forward(stages, logits + n * GG, G, iterations);
    float* gradient = stages + 2 * iterations * GG;
    float* previous = gradient + GG;
    for (int64_t i = threadIdx.x; i < GG; i += blockDim.x) gradient[i] = d_mixing[n * GG + i];
    __syncthreads();
    for (int64_t stage = 2 * iterations - 1; stage >= 1; --stage) {
      const float* in = stages + (stage - 1) * GG;
      const float* out = stages + stage * GG;
      const bool columns = stage % 2 == 1;
      for (int64_t a = threadIdx.x; a < G; a += blockDim.x) {
        float sum = 0.0f, dot = 0.0f;
        for (int64_t b = 0; b < G; ++b) {
          const int64_t at = line_at(columns, a, b, G);
          sum += in[at];
          dot += gradient[at] * out[at];
        }
        const float denominator = sum + kEpsilon;
        for (int64_t b = 0; b < G; ++b) {
          const int64_t at = line_at(columns, a, b, G);
          previous[at] = __fdiv_rn(gradient[at] - dot, denominator);
        }
      }
      __syncthreads();
      float* swap = gradient;
      gradient = previous;
      previous = swap;
    }
    for (int64_t i = threadIdx.x; i < G; i += blockDim.x) {
      float dot = 0.0f;
      for (int64_t j = 0; j < G; ++j) dot += gradient[i * G + j] * (stages[i * G + j] - kEpsilon);
      for (int64_t j = 0; j < G; ++j) {
        const float p = stages[i * G + j] - kEpsilon;
        d_logits[n * GG + i * G + j] = p * (gradient[i * G + j] - dot);
      }
    }
    __syncthreads();  // every thread is done with the token's shared memory before the next token's
  }
}

// The cpu kernel's bound on a token's iterates, which also keeps the shared memory below 48 KiB
// (4096 stage values + 2 G^2 <= 8192 floats).
size_t checked_stage_bytes(int64_t G, int64_t iterations, int64_t extra_values) {
  MT_CHECK(G >= 1 && iterations >= 1 && 2 * iterations * G * G <= kSinkhornMaxStageValues,
           "Sinkhorn iterates of G " + to_text(G) + " x " + to_text(iterations) +
               " iterations fit the shared memory");
  return static_cast<size_t>(2 * iterations * G * G + extra_values) * sizeof(float);
}

}  // namespace

void sinkhorn_forward(float* mixing, const float* logits, int64_t N, int64_t G, int64_t iterations) {
  const size_t shared_bytes = checked_stage_bytes(G, iterations, 0);
  if (N <= 0) return;
  forward_kernel<<<row_blocks(N), kTokenThreads, shared_bytes, stream()>>>(mixing, logits, N, G, iterations);
  MT_CUDA_LAUNCHED("sinkhorn forward_kernel");
}

void sinkhorn_backward(float* d_logits, const float* d_mixing, const float* logits, int64_t N, int64_t G,
                       int64_t iterations) {
  const size_t shared_bytes = checked_stage_bytes(G, iterations, 2 * G * G);
  if (N <= 0) return;
  backward_kernel<<<row_blocks(N), kTokenThreads, shared_bytes, stream()>>>(d_logits, d_mixing, logits, N, G,
                                                                            iterations);
  MT_CUDA_LAUNCHED("sinkhorn backward_kernel");
}

}  // namespace meshtrain::kernels::cuda
