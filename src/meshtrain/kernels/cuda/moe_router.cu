// The router on the GPU (moe_router.h; semantics of kernels/cpu/moe_router.h). One thread per token for
// the router and its backward: E is a few to a few hundred experts, and a token's work is the cpu kernel's
// loop: its scores (expf here, the cpu's polynomial exp there), then the selection of
// cpu/moe_router_token.h, the same code on both backends (as is a token's backward), so equal choice scores
// pick the same experts and ties go to the lower index as on the cpu. The balance loss sums over tokens in
// one block in a fixed order (strided per-thread sums in double, then a fixed tree): deterministic, no
// atomics. Legend: N tokens, E routed experts, k experts per token, G routing groups.
#include <cmath>
#include <cstdint>

#include "meshtrain/core/error.h"
#include "meshtrain/kernels/cpu/moe_router.h"  // moe_router_check and the epsilon
#include "meshtrain/kernels/cpu/moe_router_token.h"
#include "meshtrain/kernels/cuda/device.h"
#include "meshtrain/kernels/cuda/moe_router.h"

namespace meshtrain::kernels::cuda {
namespace {

constexpr int kTokenThreads = 128;
// The balance loss's one block (a power of two: the tree halves it).
constexpr int kLossThreads = 256;

// Accurate expf and division, as swiglu.cu's sigmoid: 0 (not NaN) for x < -88.7.
__device__ float sigmoid(float x) {
  return 1.0f / (1.0f + expf(-x));
}

__global__ void router_forward_kernel(int32_t* chosen,              // [N, k]
                                      float* weights,               // [N, k]
                                      float* scores,                // [N, E]
                                      const float* logits,          // [N, E]
                                      const float* selection_bias,  // [E] or nullptr
                                      int64_t N, int64_t E, MoeRouting routing) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= N) return;
  const int64_t k = routing.top_k;
  const float* row = logits + t * E;
  float* s = scores + t * E;
  if (routing.score_function == RouterScore::softmax) {
    float max = row[0];
    for (int64_t e = 1; e < E; ++e) max = fmaxf(max, row[e]);
    float sum = 0.0f;
    for (int64_t e = 0; e < E; ++e) {
      s[e] = expf(row[e] - max);
      sum += s[e];
    }
    const float inverse = 1.0f / sum;
    for (int64_t e = 0; e < E; ++e) s[e] *= inverse;
  } else {
    for (int64_t e = 0; e < E; ++e) s[e] = sigmoid(row[e]);
  }
  moe_router_pick_token(chosen + t * k, weights + t * k, s, selection_bias, E, routing);
}

// d_logits row t written from d_weights row t (cpu/moe_router_token.h, as the cpu kernel).
__global__ void router_backward_kernel(float* d_logits,         // [N, E]
                                       const float* d_weights,  // [N, k]
                                       const float* scores,     // [N, E]
                                       const int32_t* chosen,   // [N, k]
                                       int64_t N, int64_t E, MoeRouting routing) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= N) return;
  const int64_t k = routing.top_k;
  moe_router_backward_token(d_logits + t * E, d_weights + t * k, scores + t * E, chosen + t * k, E, routing);
}

// result[0] = sum over tokens of sum_e counts[e] q[t, e] (q: the scores, sigmoid ones over their row sum),
// result[1] = sum of counts, both in double. One block: thread i sums tokens i, i + kLossThreads, ... in
// order, then a fixed halving tree adds the partial sums.
__global__ void balance_loss_kernel(double* result,         // [2]
                                    const float* scores,    // [N, E]
                                    const int32_t* counts,  // [E]
                                    int64_t N, int64_t E, RouterScore score_function) {
  __shared__ double partial[kLossThreads];
  double sum = 0.0;
  for (int64_t t = threadIdx.x; t < N; t += kLossThreads) {
    sum += moe_balance_loss_token(scores + t * E, counts, E, score_function);
  }
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (int half = kLossThreads / 2; half > 0; half /= 2) {
    if (static_cast<int>(threadIdx.x) < half) partial[threadIdx.x] += partial[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    int64_t total = 0;
    for (int64_t e = 0; e < E; ++e) total += counts[e];
    result[0] = partial[0];
    result[1] = static_cast<double>(total);
  }
}

// d_logits row t += the balance loss's gradient (the cpu kernel's formula; a_e = unit counts[e]).
__global__ void balance_loss_backward_kernel(float* d_logits,        // [N, E]
                                             const float* scores,    // [N, E]
                                             const int32_t* counts,  // [E]
                                             int64_t N, int64_t E, RouterScore score_function, float weight,
                                             float d_loss) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= N) return;
  int64_t total = 0;
  for (int64_t e = 0; e < E; ++e) total += counts[e];
  if (total == 0) return;
  moe_balance_loss_backward_token(d_logits + t * E, scores + t * E, counts, E, score_function,
                                  moe_balance_loss_unit(d_loss, weight, E, total, N));
}

// The balance loss's two device doubles: allocated at the first call and kept for the process (as gemm.cu's
// workspace), outside the planned arena.
double* balance_loss_result() {
  static double* result = [] {
    double* made = nullptr;
    stream();  // selects the device
    MT_CUDA(cudaMalloc(&made, 2 * sizeof(double)));
    return made;
  }();
  return result;
}

}  // namespace

void moe_router_forward(int32_t* chosen, float* weights, float* scores, const float* logits,
                        const float* selection_bias, int64_t N, int64_t E, const MoeRouting& routing) {
  moe_router_check(E, routing);
  if (N <= 0) return;
  router_forward_kernel<<<blocks_for(N, kTokenThreads), kTokenThreads, 0, stream()>>>(
      chosen, weights, scores, logits, selection_bias, N, E, routing);
  MT_CUDA_LAUNCHED("moe_router router_forward_kernel");
}

void moe_router_backward(float* d_logits, const float* d_weights, const float* scores, const int32_t* chosen,
                         int64_t N, int64_t E, const MoeRouting& routing) {
  moe_router_check(E, routing);
  if (N <= 0) return;
  router_backward_kernel<<<blocks_for(N, kTokenThreads), kTokenThreads, 0, stream()>>>(
      d_logits, d_weights, scores, chosen, N, E, routing);
  MT_CUDA_LAUNCHED("moe_router router_backward_kernel");
}

double moe_balance_loss_forward(const float* scores, const int32_t* counts, int64_t N, int64_t E,
                                RouterScore score_function, float weight) {
  if (N <= 0 || E <= 0) return 0.0;
  double* result = balance_loss_result();
  balance_loss_kernel<<<1, kLossThreads, 0, stream()>>>(result, scores, counts, N, E, score_function);
  MT_CUDA_LAUNCHED("moe_router balance_loss_kernel");
  double host[2] = {0.0, 0.0};
  memory_copy_out(host, result, sizeof(host));
  const double loss = host[0], total = host[1];
  if (total == 0.0) return 0.0;
  return static_cast<double>(weight) * static_cast<double>(E) * loss / (total * static_cast<double>(N));
}

void moe_balance_loss_backward(float* d_logits, const float* scores, const int32_t* counts, int64_t N,
                               int64_t E, RouterScore score_function, float weight, float d_loss) {
  if (N <= 0 || E <= 0) return;
  balance_loss_backward_kernel<<<blocks_for(N, kTokenThreads), kTokenThreads, 0, stream()>>>(
      d_logits, scores, counts, N, E, score_function, weight, d_loss);
  MT_CUDA_LAUNCHED("moe_router balance_loss_backward_kernel");
}

}  // namespace meshtrain::kernels::cuda
