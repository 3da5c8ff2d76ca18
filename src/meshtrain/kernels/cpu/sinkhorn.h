// mHC's residual mixing matrix (shared/specs/mhc.md): per token, a G x G matrix of logits T becomes
//   M = softmax(T, rows) + 1e-6; normalise columns; then (iterations - 1) times: normalise rows, then columns
// (each denominator + 1e-6), a doubly stochastic matrix up to the last rows' drift. The backward goes through
// every iteration: it recomputes the token's iterates (2 iterations x G^2 values, on the stack: at most
// kSinkhornMaxStageValues) instead of storing them, so the plan holds only T and M.
// Legend: N tokens, G residual streams; every matrix is row-major [G, G] per token.
// Gradient semantics: d_logits written (=).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "meshtrain/kernels/signatures.h"

namespace meshtrain::kernels {

inline constexpr double kSinkhornEpsilon = 1e-6;
// The kernels keep a token's iterates on the stack: 2 iterations G^2 values at most (G 8 with 32 iterations;
// mHC's G 4 with 20 needs 640).
inline constexpr int64_t kSinkhornMaxStageValues = 4096;

SinkhornForward sinkhorn_forward;

SinkhornBackward sinkhorn_backward;

// One token's forward, keeping every stage in `stages` [2 iterations, G, G]: stage 0 = softmax + eps, then
// one matrix per normalisation (column, then row / column pairs). The kernels and the references share it,
// in float and in double.
template <class T>
void sinkhorn_token_forward(T* stages, const T* logits, int64_t G, int64_t iterations) {
  const auto GG = static_cast<size_t>(G * G);
  T* first = stages;
  for (int64_t i = 0; i < G; ++i) {
    const T* row = logits + i * G;
    const T largest = *std::max_element(row, row + G);
    T sum = T(0);
    for (int64_t j = 0; j < G; ++j) sum += first[i * G + j] = std::exp(row[j] - largest);
    for (int64_t j = 0; j < G; ++j) first[i * G + j] = first[i * G + j] / sum + T(kSinkhornEpsilon);
  }
  for (int64_t stage = 1; stage < 2 * iterations; ++stage) {
    const T* in = stages + (stage - 1) * GG;
    T* out = stages + stage * GG;
    const bool columns = stage % 2 == 1;  // stage 1 normalises columns, 2 rows, 3 columns, ...
    for (int64_t a = 0; a < G; ++a) {
      T sum = T(0);
      for (int64_t b = 0; b < G; ++b) sum += columns ? in[b * G + a] : in[a * G + b];
      const T denominator = sum + T(kSinkhornEpsilon);
      for (int64_t b = 0; b < G; ++b) {
        const int64_t at = columns ? b * G + a : a * G + b;
        out[at] = in[at] / denominator;
      }
    }
  }
}

// One token's backward from its stages: d_logits (=) from d_mixing. `work` holds 2 G^2 values.
template <class T>
void sinkhorn_token_backward(T* d_logits, const T* d_mixing, const T* stages, T* work, int64_t G,
                             int64_t iterations) {
  const auto GG = static_cast<size_t>(G * G);
  T* gradient = work;
  T* previous = work + GG;
  std::copy(d_mixing, d_mixing + GG, gradient);
  for (int64_t stage = 2 * iterations - 1; stage >= 1; --stage) {
    // y = x / (s + eps), s the sum of x over the line: dx = (dy - sum over the line of dy y) / (s + eps).
    const T* in = stages + (stage - 1) * GG;
    const T* out = stages + stage * GG;
    const bool columns = stage % 2 == 1;
    for (int64_t a = 0; a < G; ++a) {
      T sum = T(0), dot = T(0);
      for (int64_t b = 0; b < G; ++b) {
        const int64_t at = columns ? b * G + a : a * G + b;
        sum += in[at];
        dot += gradient[static_cast<size_t>(at)] * out[at];
      }
      const T denominator = sum + T(kSinkhornEpsilon);
      for (int64_t b = 0; b < G; ++b) {
        const int64_t at = columns ? b * G + a : a * G + b;
        previous[static_cast<size_t>(at)] = (gradient[static_cast<size_t>(at)] - dot) / denominator;
      }
    }
    std::swap(gradient, previous);
  }
  // Softmax per row (the + eps does not depend on T): dT = p (dp - sum dp p), p = stage 0 - eps.
  for (int64_t i = 0; i < G; ++i) {
    T dot = T(0);
    for (int64_t j = 0; j < G; ++j)
      dot += gradient[static_cast<size_t>(i * G + j)] *
             (stages[static_cast<size_t>(i * G + j)] - T(kSinkhornEpsilon));
    for (int64_t j = 0; j < G; ++j) {
      const T p = stages[static_cast<size_t>(i * G + j)] - T(kSinkhornEpsilon);
      d_logits[i * G + j] = p * (gradient[static_cast<size_t>(i * G + j)] - dot);
    }
  }
}

template <class T>
void sinkhorn_reference_forward(T* mixing, const T* logits, int64_t N, int64_t G, int64_t iterations) {
  std::vector<T> stages(static_cast<size_t>(2 * iterations * G * G));
  for (int64_t n = 0; n < N; ++n) {
    sinkhorn_token_forward(stages.data(), logits + n * G * G, G, iterations);
    std::copy(stages.end() - G * G, stages.end(), mixing + n * G * G);
  }
}

template <class T>
void sinkhorn_reference_backward(T* d_logits, const T* d_mixing, const T* logits, int64_t N, int64_t G,
                                 int64_t iterations) {
  std::vector<T> stages(static_cast<size_t>(2 * iterations * G * G)), work(static_cast<size_t>(2 * G * G));
  for (int64_t n = 0; n < N; ++n) {
    sinkhorn_token_forward(stages.data(), logits + n * G * G, G, iterations);
    sinkhorn_token_backward(d_logits + n * G * G, d_mixing + n * G * G, stages.data(), work.data(), G,
                            iterations);
  }
}

}  // namespace meshtrain::kernels
