// Fast router kernels (semantics in moe_router.h). One OpenMP task per token: each owns its rows of every
// output, so results do not depend on the thread count. The selection and the backward of a token are
// moe_router_token.h's, shared with the cuda kernel; the selection costs O(k E) per token, small beside the
// router matmul's O(D E).
#include "meshtrain/kernels/cpu/moe_router.h"

#include <omp.h>

#include <cmath>

#include "meshtrain/kernels/cpu/fast_math.h"
#include "meshtrain/kernels/cpu/moe_router_token.h"

namespace meshtrain::kernels {
namespace {

// Below this many logits a parallel region costs more than it saves.
constexpr int64_t kParallelMinimum = 1 << 13;

}  // namespace

void moe_router_forward(int32_t* chosen, float* weights, float* scores, const float* logits,
                        const float* selection_bias, int64_t N, int64_t E, const MoeRouting& routing) {
  moe_router_check(E, routing);
  const int64_t k = routing.top_k;
#pragma omp parallel for schedule(static) if (N * E >= kParallelMinimum)
  for (int64_t t = 0; t < N; ++t) {
    const float* row = logits + t * E;
    float* s = scores + t * E;
    if (routing.score_function == RouterScore::softmax) {
      float max = row[0];
      for (int64_t e = 1; e < E; ++e) max = std::max(max, row[e]);
      float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
      for (int64_t e = 0; e < E; ++e) {
        s[e] = exp_approx(row[e] - max);
        sum += s[e];
      }
      const float inverse = 1.0f / sum;
#pragma omp simd
      for (int64_t e = 0; e < E; ++e) s[e] *= inverse;
    } else {
#pragma omp simd
      for (int64_t e = 0; e < E; ++e) s[e] = sigmoid_approx(row[e]);
    }
    moe_router_pick_token(chosen + t * k, weights + t * k, s, selection_bias, E, routing);
  }
}

void moe_router_backward(float* d_logits, const float* d_weights, const float* scores, const int32_t* chosen,
                         int64_t N, int64_t E, const MoeRouting& routing) {
  moe_router_check(E, routing);
  const int64_t k = routing.top_k;
#pragma omp parallel for schedule(static) if (N * E >= kParallelMinimum)
  for (int64_t t = 0; t < N; ++t) {
    moe_router_backward_token(d_logits + t * E, d_weights + t * k, scores + t * E, chosen + t * k, E,
                              routing);
  }
}

double moe_balance_loss_forward(const float* scores, const int32_t* counts, int64_t N, int64_t E,
                                RouterScore score_function, float weight) {
  int64_t total = 0;
  for (int64_t e = 0; e < E; ++e) total += counts[e];
  if (N == 0 || total == 0) return 0.0;
  // sum_t sum_e counts[e] q[t, e] in double, serially in token order: deterministic, and O(N E) like one
  // pass over the scores.
  double loss = 0.0;
  for (int64_t t = 0; t < N; ++t) loss += moe_balance_loss_token(scores + t * E, counts, E, score_function);
  return static_cast<double>(weight) * static_cast<double>(E) * loss /
         (static_cast<double>(total) * static_cast<double>(N));
}

void moe_balance_loss_backward(float* d_logits, const float* scores, const int32_t* counts, int64_t N,
                               int64_t E, RouterScore score_function, float weight, float d_loss) {
  int64_t total = 0;
  for (int64_t e = 0; e < E; ++e) total += counts[e];
  if (N == 0 || total == 0) return;
  const float unit = moe_balance_loss_unit(d_loss, weight, E, total, N);
#pragma omp parallel for schedule(static) if (N * E >= kParallelMinimum)
  for (int64_t t = 0; t < N; ++t) {
    moe_balance_loss_backward_token(d_logits + t * E, scores + t * E, counts, E, score_function, unit);
  }
}

}  // namespace meshtrain::kernels
