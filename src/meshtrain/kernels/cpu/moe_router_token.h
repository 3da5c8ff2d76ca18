// The router's work on one token that the cpu kernel (moe_router.cpp) and the cuda one (cuda/moe_router.cu)
// both run, so that they choose the same experts, break ties the same way and form the same gradient by
// construction. The selection: the Gk kept groups as a bit mask, then k scans of the E choice scores, each
// taking the best expert that ranks after the previous pick in (choice score descending, index ascending)
// order; allocates nothing, O(k E) per token; then the chosen experts' weights. The backward: one token's
// d_logits row. The balance loss: one token's term and its gradient.
// Legend: E experts, G groups of E / G, Gk groups kept, k experts per token.
#pragma once

#include <cstdint>
#include <limits>

#include "meshtrain/kernels/arguments.h"
#include "meshtrain/kernels/cpu/moe_router.h"  // kRouterNormalizeEpsilon

#if defined(__CUDACC__)
#define MT_ROUTER_HOST_DEVICE __host__ __device__
#define MT_ROUTER_SIMD_SUMS
#define MT_ROUTER_SIMD
#else
#define MT_ROUTER_HOST_DEVICE
// The cpu kernel vectorises the balance loss's per-token loops; each device thread runs them in order.
#define MT_ROUTER_SIMD_SUMS _Pragma("omp simd reduction(+ : inner, Z)")
#define MT_ROUTER_SIMD _Pragma("omp simd")
#endif

namespace meshtrain::kernels {

// A NaN score (a diverged run) ranks last instead of breaking the order, so chosen ids stay valid.
MT_ROUTER_HOST_DEVICE inline float moe_router_ranked(float value) {
  return value != value ? -std::numeric_limits<float>::infinity() : value;
}

// True when (value, index) ranks strictly before (best_value, best_index); best_index < 0: nothing yet.
MT_ROUTER_HOST_DEVICE inline bool moe_router_ranks_before(float value, int64_t index, float best_value,
                                                          int64_t best_index) {
  return best_index < 0 || value > best_value || (value == best_value && index < best_index);
}

// chosen [k]: the token's k experts in rank order, from choice(e), its ranked choice score of expert e (the
// score plus the selection bias, through moe_router_ranked). A group's score is the sum of its two best
// choice scores (its only one when E / G = 1); the Gk best groups are kept, ties to the lower group index.
template <class Choice>
MT_ROUTER_HOST_DEVICE void moe_router_select(int32_t* chosen, const Choice& choice, int64_t E,
                                             const MoeRouting& routing) {
  constexpr float kNegativeInfinity = -std::numeric_limits<float>::infinity();
  const int64_t k = routing.top_k, G = routing.groups, group_size = E / G;
  // Kept groups: bit g set when group g may be chosen from (G <= 64).
  uint64_t kept = G >= 64 ? ~uint64_t(0) : (uint64_t(1) << G) - 1;
  if (G > 1 && routing.groups_kept < G) {
    float group_score[64];
    for (int64_t g = 0; g < G; ++g) {
      float first = kNegativeInfinity, second = kNegativeInfinity;
      for (int64_t e = g * group_size; e < (g + 1) * group_size; ++e) {
        const float value = choice(e);
        if (value > first) {
          second = first;
          first = value;
        } else if (value > second) {
          second = value;
        }
      }
      group_score[g] = group_size > 1 ? first + second : first;
    }
    kept = 0;
    for (int64_t rank = 0; rank < routing.groups_kept; ++rank) {
      float best_score = kNegativeInfinity;
      int64_t best = -1;
      for (int64_t g = 0; g < G; ++g) {
        if (((kept >> g) & 1) != 0) continue;
        const float value = moe_router_ranked(group_score[g]);
        if (moe_router_ranks_before(value, g, best_score, best)) {
          best_score = value;
          best = g;
        }
      }
      kept |= uint64_t(1) << best;
    }
  }

  float previous_value = 0.0f;
  int64_t previous_index = -1;
  for (int64_t j = 0; j < k; ++j) {
    float best_value = kNegativeInfinity;
    int64_t best_index = -1;
    for (int64_t g = 0; g < G; ++g) {
      if (((kept >> g) & 1) == 0) continue;
      for (int64_t e = g * group_size; e < (g + 1) * group_size; ++e) {
        const float value = choice(e);
        // Only experts ranking after the previous pick remain.
        if (previous_index >= 0 && moe_router_ranks_before(value, e, previous_value, previous_index))
          continue;
        if (previous_index == e) continue;
        if (moe_router_ranks_before(value, e, best_value, best_index)) {
          best_value = value;
          best_index = e;
        }
      }
    }
    chosen[j] = static_cast<int32_t>(best_index);
    previous_value = best_value;
    previous_index = best_index;
  }
}

// One token's forward after its scores s [E]: picks [k] = the chosen experts (selection_bias, [E] or null,
// orders only), weights [k] = their scores, normalised over the k when the routing says so, times scaling.
MT_ROUTER_HOST_DEVICE inline void moe_router_pick_token(int32_t* picks, float* weights, const float* s,
                                                        const float* selection_bias, int64_t E,
                                                        const MoeRouting& routing) {
  const auto choice = [&](int64_t e) {
    return moe_router_ranked(selection_bias != nullptr ? s[e] + selection_bias[e] : s[e]);
  };
  moe_router_select(picks, choice, E, routing);
  const int64_t k = routing.top_k;
  float sum = 0.0f;
  for (int64_t j = 0; j < k; ++j) {
    weights[j] = s[picks[j]];
    sum += s[picks[j]];
  }
  const float factor = routing.normalize_top_k
                           ? routing.scaling / (sum + static_cast<float>(kRouterNormalizeEpsilon))
                           : routing.scaling;
  for (int64_t j = 0; j < k; ++j) weights[j] *= factor;
}

// out [E] = one token's d_logits (written) from its d_weights dw [k], scores s [E] and chosen ids [k]: with
// the normalisation, d score of slot j = a dw_j + b (b = 0 unnormalised; see moe_router_reference_backward),
// then through the softmax or the sigmoid.
MT_ROUTER_HOST_DEVICE inline void moe_router_backward_token(float* out, const float* dw, const float* s,
                                                            const int32_t* ids, int64_t E,
                                                            const MoeRouting& routing) {
  const int64_t k = routing.top_k;
  const float c = routing.scaling;
  float a = c, b = 0.0f;
  if (routing.normalize_top_k) {
    float sum = 0.0f, dot = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      sum += s[ids[j]];
      dot += dw[j] * s[ids[j]];
    }
    const float D = sum + static_cast<float>(kRouterNormalizeEpsilon);
    a = c / D;
    b = -c * dot / (D * D);
  }
  if (routing.score_function == RouterScore::softmax) {
    float inner = 0.0f;
    for (int64_t j = 0; j < k; ++j) inner += s[ids[j]] * (a * dw[j] + b);
    for (int64_t e = 0; e < E; ++e) out[e] = -s[e] * inner;
    for (int64_t j = 0; j < k; ++j) out[ids[j]] += s[ids[j]] * (a * dw[j] + b);
  } else {
    for (int64_t e = 0; e < E; ++e) out[e] = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      const float value = s[ids[j]];
      out[ids[j]] = (a * dw[j] + b) * value * (1.0f - value);
    }
  }
}

// The balance loss's term of one token, sum_e counts[e] q[e] in double, with q its scores s [E] (sigmoid
// scores over their row sum). Each backend adds the tokens' terms in its own fixed order.
MT_ROUTER_HOST_DEVICE inline double moe_balance_loss_token(const float* s, const int32_t* counts, int64_t E,
                                                           RouterScore score_function) {
  double row = 0.0, normaliser = 0.0;
  for (int64_t e = 0; e < E; ++e) {
    row += static_cast<double>(counts[e]) * s[e];
    normaliser += s[e];
  }
  return score_function == RouterScore::sigmoid ? row / normaliser : row;
}

// The balance loss's gradient factor: a_e = unit counts[e], unit = d_loss weight E / (total N), total the
// sum of the counts (> 0).
MT_ROUTER_HOST_DEVICE inline float moe_balance_loss_unit(float d_loss, float weight, int64_t E, int64_t total,
                                                         int64_t N) {
  return static_cast<float>(static_cast<double>(d_loss) * weight * static_cast<double>(E) /
                            (static_cast<double>(total) * static_cast<double>(N)));
}

// out [E] += one token's gradient of the balance loss with respect to its router logits, from its scores s
// [E], through the softmax or the sigmoid.
MT_ROUTER_HOST_DEVICE inline void moe_balance_loss_backward_token(float* out, const float* s,
                                                                  const int32_t* counts, int64_t E,
                                                                  RouterScore score_function, float unit) {
  float inner = 0.0f, Z = 0.0f;
  MT_ROUTER_SIMD_SUMS
  for (int64_t e = 0; e < E; ++e) {
    inner += s[e] * (unit * static_cast<float>(counts[e]));
    Z += s[e];
  }
  if (score_function == RouterScore::softmax) {
    MT_ROUTER_SIMD
    for (int64_t e = 0; e < E; ++e) out[e] += s[e] * (unit * static_cast<float>(counts[e]) - inner);
  } else {
    const float inverse_Z = 1.0f / Z;
    const float mean = inner * inverse_Z;
    MT_ROUTER_SIMD
    for (int64_t e = 0; e < E; ++e) {
      out[e] += (unit * static_cast<float>(counts[e]) - mean) * inverse_Z * s[e] * (1.0f - s[e]);
    }
  }
}

}  // namespace meshtrain::kernels
