// The router of a mixture-of-experts layer: from router logits (x @ W_router, the existing matmul) to each
// token's k chosen experts and their combine weights, and the auxiliary load-balance loss.
// Legend: N tokens, E routed experts, k experts per token (MoeRouting::top_k), G routing groups, Gk groups
// kept, M = N k assignments (assignment t k + s is token t's slot s).
//
// Semantics (Hugging Face transformers' DeepseekV3TopkRouter and Qwen3MoeSparseMoeBlock):
//   scores  = softmax(logits) over E, or sigmoid(logits), per token                                [N, E]
//   choice  = scores + selection_bias (DeepSeek-V3's e_score_correction_bias: it changes which experts are
//             chosen, never the weights, and gets no gradient)
//   groups  (G > 1): the E experts form G contiguous groups of E / G; a group's score is the sum of its
//             two best choice scores (its only one when E / G = 1), with or without a bias, as HF does
//             (DeepSeek's inference code takes the group maximum when there is no bias); the Gk best groups
//             are kept and the experts of the others cannot be chosen. HF fills their choice scores with 0
//             rather than excluding them, so with a negative bias (choice < 0) HF can pick an expert of a
//             dropped group; here they are excluded, as a -inf fill would do. Both agree while the kept
//             choice scores are >= 0.
//   chosen  = the k best experts by choice score, in descending order of choice score. Ties (torch.topk
//             leaves them unspecified) go to the lower expert index, for groups as for experts.
//   weights = scores[chosen] (unbiased), divided by (their sum + 1e-20) when normalize_top_k (HF's V3
//             router adds the 1e-20, Qwen3-MoE nothing: the difference is below float rounding unless the
//             sum underflows), then times scaling.
// The selection is piecewise constant, so the backward differentiates only the weights: through the
// normalisation and the score function to d_logits. Gradient semantics: d_logits written (=) by the router
// backward, added to (+=) by the balance-loss backward, so the caller runs the router backward first.
//
// Load-balance loss (Switch Transformer; DeepSeek-V2/V3's expert-level balance loss) over a set of tokens:
//   L_bal = weight * E * sum_e f_e P_e,
//   f_e = counts[e] / sum(counts): the share of assignments (before capacity dropping) that went to e,
//         a constant for the gradient; counts over these N tokens give f_e = counts[e] / (N k);
//   P_e = mean over the N tokens of q[t, e], q the scores normalised to sum 1 over E: softmax scores as they
//         are, sigmoid scores divided by their sum over E (DeepSeek-V3 eq. 18-20, s'_{i,t}).
// HF's load_balancing_loss_func (Mixtral, Qwen3-MoE) computes E * sum_e (counts[e] / N) P_e with softmax
// scores, over all MoE layers' tokens at once: for one layer, k times this value.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <utility>
#include <vector>

#include "meshtrain/core/error.h"
#include "meshtrain/kernels/arguments.h"
#include "meshtrain/kernels/signatures.h"

namespace meshtrain::kernels {

// Denominator guard of the normalised weights (HF DeepseekV3TopkRouter).
constexpr double kRouterNormalizeEpsilon = 1e-20;

// The most routing groups a router supports (a kept-group bit mask per token; DeepSeek-V3 uses 8).
constexpr int64_t kRouterMaxGroups = 64;

// Internal: the ranges that config validation guarantees (see MoeRouting).
inline void moe_router_check(int64_t E, const MoeRouting& routing) {
  MT_CHECK(E >= 1, "num_experts >= 1");
  MT_CHECK(routing.groups >= 1 && routing.groups <= kRouterMaxGroups && E % routing.groups == 0,
           "n_routing_groups divides num_experts and is at most 64 (config validation)");
  MT_CHECK(routing.groups_kept >= 1 && routing.groups_kept <= routing.groups,
           "1 <= topk_routing_group <= n_routing_groups (config validation)");
  MT_CHECK(routing.top_k >= 1 && routing.top_k <= routing.groups_kept * (E / routing.groups),
           "1 <= num_experts_per_tok <= experts in the kept groups (config validation)");
}

// chosen, weights and scores written (=). selection_bias only orders the experts.
MoeRouterForward moe_router_forward;

// d_logits written (=) from d_weights through the normalisation and the score function.
MoeRouterBackward moe_router_backward;

// L_bal (above), accumulated in double. counts: assignments per expert before capacity dropping
// (moe_route_plan's `assigned`), over these tokens or over a larger set the loss is defined on.
MoeBalanceLossForward moe_balance_loss_forward;

// d_logits += d_loss * dL_bal / d_logits (f_e constant).
MoeBalanceLossBackward moe_balance_loss_backward;

// The plain reference: materialises the choice scores and sorts them (std::stable_sort), so it shares no
// selection code with the fast kernel.
template <class T>
void moe_router_reference_forward(int32_t* chosen, T* weights, T* scores, const T* logits,
                                  const T* selection_bias, int64_t N, int64_t E, const MoeRouting& routing) {
  moe_router_check(E, routing);
  const int64_t k = routing.top_k, G = routing.groups, group_size = E / G;
  std::vector<T> choice(E);
  std::vector<int64_t> order(E), group_order(G);
  std::vector<T> group_score(G);
  std::vector<bool> allowed(E);
  for (int64_t t = 0; t < N; ++t) {
    const T* row = logits + t * E;
    T* s = scores + t * E;
    if (routing.score_function == RouterScore::softmax) {
      const T max = *std::max_element(row, row + E);
      T sum = T(0);
      for (int64_t e = 0; e < E; ++e) sum += (s[e] = std::exp(row[e] - max));
      for (int64_t e = 0; e < E; ++e) s[e] /= sum;
    } else {
      for (int64_t e = 0; e < E; ++e) s[e] = T(1) / (T(1) + std::exp(-row[e]));
    }
    for (int64_t e = 0; e < E; ++e) choice[e] = s[e] + (selection_bias != nullptr ? selection_bias[e] : T(0));
    std::fill(allowed.begin(), allowed.end(), true);
    if (G > 1) {
      for (int64_t g = 0; g < G; ++g) {
        std::vector<T> members(choice.begin() + g * group_size, choice.begin() + (g + 1) * group_size);
        std::sort(members.begin(), members.end(), [](T a, T b) { return a > b; });
        group_score[g] = members[0] + (group_size > 1 ? members[1] : T(0));
      }
      std::iota(group_order.begin(), group_order.end(), 0);
      std::stable_sort(group_order.begin(), group_order.end(),
                       [&](int64_t a, int64_t b) { return group_score[a] > group_score[b]; });
      for (int64_t rank = routing.groups_kept; rank < G; ++rank) {
        for (int64_t j = 0; j < group_size; ++j) allowed[group_order[rank] * group_size + j] = false;
      }
    }
    order.clear();
    for (int64_t e = 0; e < E; ++e) {
      if (allowed[e]) order.push_back(e);
    }
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return choice[a] > choice[b]; });
    T sum = T(0);
    for (int64_t j = 0; j < k; ++j) {
      chosen[t * k + j] = static_cast<int32_t>(order[j]);
      weights[t * k + j] = s[order[j]];
      sum += s[order[j]];
    }
    const T divisor = routing.normalize_top_k ? sum + T(kRouterNormalizeEpsilon) : T(1);
    for (int64_t j = 0; j < k; ++j) weights[t * k + j] = weights[t * k + j] / divisor * T(routing.scaling);
  }
}

// With w_j = c s_j / D, D = sum_i s_i + eps (normalised): ds_j = c (dw_j / D - sum_i dw_i s_i / D^2);
// otherwise ds_j = c dw_j. Then softmax: dlogit_e = s_e (ds_e - sum_f s_f ds_f); sigmoid: ds_e s_e (1 - s_e).
template <class T>
void moe_router_reference_backward(T* d_logits, const T* d_weights, const T* scores, const int32_t* chosen,
                                   int64_t N, int64_t E, const MoeRouting& routing) {
  moe_router_check(E, routing);
  const int64_t k = routing.top_k;
  const T c = T(routing.scaling);
  std::vector<T> d_scores(E);
  for (int64_t t = 0; t < N; ++t) {
    const T* s = scores + t * E;
    const T* dw = d_weights + t * k;
    const int32_t* ids = chosen + t * k;
    std::fill(d_scores.begin(), d_scores.end(), T(0));
    if (routing.normalize_top_k) {
      T sum = T(0), dot = T(0);
      for (int64_t j = 0; j < k; ++j) {
        sum += s[ids[j]];
        dot += dw[j] * s[ids[j]];
      }
      const T D = sum + T(kRouterNormalizeEpsilon);
      for (int64_t j = 0; j < k; ++j) d_scores[ids[j]] = c * (dw[j] / D - dot / (D * D));
    } else {
      for (int64_t j = 0; j < k; ++j) d_scores[ids[j]] = c * dw[j];
    }
    T* out = d_logits + t * E;
    if (routing.score_function == RouterScore::softmax) {
      T inner = T(0);
      for (int64_t e = 0; e < E; ++e) inner += s[e] * d_scores[e];
      for (int64_t e = 0; e < E; ++e) out[e] = s[e] * (d_scores[e] - inner);
    } else {
      for (int64_t e = 0; e < E; ++e) out[e] = d_scores[e] * s[e] * (T(1) - s[e]);
    }
  }
}

template <class T>
T moe_balance_loss_reference_forward(const T* scores, const int32_t* counts, int64_t N, int64_t E,
                                     RouterScore score_function, T weight) {
  int64_t total = 0;
  for (int64_t e = 0; e < E; ++e) total += counts[e];
  if (N == 0 || total == 0) return T(0);
  T loss = T(0);
  for (int64_t t = 0; t < N; ++t) {
    const T* s = scores + t * E;
    T normaliser = T(1);
    if (score_function == RouterScore::sigmoid) normaliser = std::accumulate(s, s + E, T(0));
    for (int64_t e = 0; e < E; ++e) loss += T(counts[e]) / T(total) * (s[e] / normaliser);
  }
  return weight * T(E) * loss / T(N);
}

// a_e = dL/dq_{t,e} = d_loss weight E f_e / N. Softmax: dlogit_e += s_e (a_e - sum_f s_f a_f). Sigmoid, with
// q = s / Z: ds_j = (a_j - sum_e a_e q_e) / Z and dlogit_j += ds_j s_j (1 - s_j).
template <class T>
void moe_balance_loss_reference_backward(T* d_logits, const T* scores, const int32_t* counts, int64_t N,
                                         int64_t E, RouterScore score_function, T weight, T d_loss) {
  int64_t total = 0;
  for (int64_t e = 0; e < E; ++e) total += counts[e];
  if (N == 0 || total == 0) return;
  std::vector<T> a(E);
  for (int64_t e = 0; e < E; ++e) a[e] = d_loss * weight * T(E) * (T(counts[e]) / T(total)) / T(N);
  for (int64_t t = 0; t < N; ++t) {
    const T* s = scores + t * E;
    T* out = d_logits + t * E;
    if (score_function == RouterScore::softmax) {
      T inner = T(0);
      for (int64_t e = 0; e < E; ++e) inner += s[e] * a[e];
      for (int64_t e = 0; e < E; ++e) out[e] += s[e] * (a[e] - inner);
    } else {
      const T Z = std::accumulate(s, s + E, T(0));
      T inner = T(0);
      for (int64_t e = 0; e < E; ++e) inner += a[e] * s[e] / Z;
      for (int64_t e = 0; e < E; ++e) out[e] += (a[e] - inner) / Z * s[e] * (T(1) - s[e]);
    }
  }
}

}  // namespace meshtrain::kernels
