// Engram's gate (shared/specs/engram.md section 4), after the layer's projections and RMSNorms: per token
// and stream g,
//   s_g = <q_g, k_g> / sqrt(D),  gate_g = sigmoid(sign(s_g) sqrt(max(|s_g|, 1e-6))),  gated_g = gate_g v
// (the signed square root is the reference's, not the paper's equation; sign(0) = 0).
// Legend: N tokens, G residual streams, D width.
// Gradient semantics: d_q, d_k written (=); d_v written (=) as the sum over streams. Where |s| <= 1e-6 the
// gate is constant in s, so q and k get no gradient there.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "meshtrain/kernels/signatures.h"

namespace meshtrain::kernels {

inline constexpr double kEngramGateFloor = 1e-6;

EngramGateForward engram_gate_forward;

EngramGateBackward engram_gate_backward;

// One stream's score and gate.
template <class T>
T engram_gate_score(const T* q, const T* k, int64_t D) {
  T dot = T(0);
  for (int64_t c = 0; c < D; ++c) dot += q[c] * k[c];
  return dot / std::sqrt(T(D));
}
template <class T>
T engram_gate_of(T score) {
  const T sign = score > T(0) ? T(1) : score < T(0) ? T(-1) : T(0);
  const T root = sign * std::sqrt(std::max(std::fabs(score), T(kEngramGateFloor)));
  return T(1) / (T(1) + std::exp(-root));
}
// d gate / d score.
template <class T>
T engram_gate_slope(T score, T gate) {
  if (std::fabs(score) <= T(kEngramGateFloor)) return T(0);
  return gate * (T(1) - gate) / (T(2) * std::sqrt(std::fabs(score)));
}

template <class T>
void engram_gate_reference_forward(T* gated, T* gate, const T* q, const T* k, const T* v, int64_t N,
                                   int64_t G, int64_t D) {
  for (int64_t n = 0; n < N; ++n)
    for (int64_t g = 0; g < G; ++g) {
      const int64_t row = n * G + g;
      gate[row] = engram_gate_of(engram_gate_score(q + row * D, k + row * D, D));
      for (int64_t c = 0; c < D; ++c) gated[row * D + c] = gate[row] * v[n * D + c];
    }
}

template <class T>
void engram_gate_reference_backward(T* d_q, T* d_k, T* d_v, const T* d_gated, const T* gate, const T* q,
                                    const T* k, const T* v, int64_t N, int64_t G, int64_t D) {
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t c = 0; c < D; ++c) d_v[n * D + c] = T(0);
    for (int64_t g = 0; g < G; ++g) {
      const int64_t row = n * G + g;
      T d_gate = T(0);
      for (int64_t c = 0; c < D; ++c) {
        d_gate += d_gated[row * D + c] * v[n * D + c];
        d_v[n * D + c] += gate[row] * d_gated[row * D + c];
      }
      const T score = engram_gate_score(q + row * D, k + row * D, D);
      const T d_score = d_gate * engram_gate_slope(score, gate[row]) / std::sqrt(T(D));
      for (int64_t c = 0; c < D; ++c) {
        d_q[row * D + c] = d_score * k[row * D + c];
        d_k[row * D + c] = d_score * q[row * D + c];
      }
    }
  }
}

}  // namespace meshtrain::kernels
