// Muon's step (optax.contrib.muon, MaxText's opt_type=muon): Nesterov momentum, its Newton-Schulz
// orthogonalisation, the shape's scale and decoupled weight decay, for a batch of matrices one at a time.
// Legend: R rows (fan_in), C cols (fan_out), n = min(R, C), m = max(R, C), t the 1-based step.
//   g = grad x gradient_scale
//   mu = beta mu + (1 - beta) g
//   mu_hat = beta mu / (1 - beta^(t+1)) + (1 - beta) g / (1 - beta^t)            (Nesterov, bias-corrected)
//   X = mu_hat, as [n, m] (transposed when R > C); X /= ||X||_F + eps
//   5 times: A = X X^T; B = b A + c A A; X = a X + B X                          ((a, b, c) below)
//   O = X, back as [R, C]
//   param -= lr (update_scale O + wd param)      (wd only where the mask decays; update_scale: optim/muon.h)
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "meshtrain/core/error.h"
#include "meshtrain/kernels/arguments.h"  // MuonStep
#include "meshtrain/kernels/signatures.h"

namespace meshtrain::kernels {

// The fast step: the Newton-Schulz products on the engine's GEMM (gemm.h), without transposing (a tall X
// iterates A = X^T X, X = a X + X B, the same function transposed).
MuonUpdate muon_update;
// Scratch for one matrix: X and the product B X (R C each), A and A A (n^2 each).
MuonScratchFloats muon_scratch_floats;

// Plain reference of one matrix's Newton-Schulz orthogonalisation, literally the iteration above in T:
// `x` [rows, cols] in, the orthogonalised [rows, cols] out.
template <class T>
std::vector<T> newton_schulz_reference(const std::vector<T>& x, int64_t rows, int64_t cols, T epsilon) {
  const bool transposed = rows > cols;
  const int64_t n = transposed ? cols : rows, m = transposed ? rows : cols;
  std::vector<T> X(static_cast<size_t>(n * m));  // [n, m]
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j)
      X[static_cast<size_t>(transposed ? j * m + i : i * m + j)] = x[static_cast<size_t>(i * cols + j)];
  T norm = 0;
  for (T value : X) norm += value * value;
  norm = std::sqrt(norm) + epsilon;
  for (T& value : X) value /= norm;
  const T a = static_cast<T>(kNewtonSchulzA), b = static_cast<T>(kNewtonSchulzB),
          c = static_cast<T>(kNewtonSchulzC);
  std::vector<T> A(static_cast<size_t>(n * n)), B(static_cast<size_t>(n * n)), next(X.size());
  for (int step = 0; step < kNewtonSchulzSteps; ++step) {
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < n; ++j) {
        T sum = 0;
        for (int64_t k = 0; k < m; ++k)
          sum += X[static_cast<size_t>(i * m + k)] * X[static_cast<size_t>(j * m + k)];
        A[static_cast<size_t>(i * n + j)] = sum;
      }
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < n; ++j) {
        T sum = 0;
        for (int64_t k = 0; k < n; ++k)
          sum += A[static_cast<size_t>(i * n + k)] * A[static_cast<size_t>(k * n + j)];
        B[static_cast<size_t>(i * n + j)] = b * A[static_cast<size_t>(i * n + j)] + c * sum;
      }
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < m; ++j) {
        T sum = 0;
        for (int64_t k = 0; k < n; ++k)
          sum += B[static_cast<size_t>(i * n + k)] * X[static_cast<size_t>(k * m + j)];
        next[static_cast<size_t>(i * m + j)] = a * X[static_cast<size_t>(i * m + j)] + sum;
      }
    X.swap(next);
  }
  std::vector<T> out(x.size());
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j)
      out[static_cast<size_t>(i * cols + j)] = X[static_cast<size_t>(transposed ? j * m + i : i * m + j)];
  return out;
}

// Plain reference of muon_update, literally the formula above in T (tests run it in double).
template <class T>
void muon_reference_update(T* param, const T* grad, T* momentum, int64_t batch, int64_t rows, int64_t cols,
                           const MuonStep& step, bool apply_weight_decay) {
  MT_CHECK(step.step >= 1, "the step is 1-based");
  const double t = static_cast<double>(step.step);
  const T beta = static_cast<T>(step.beta);
  const T correction = static_cast<T>(1.0 - std::pow(static_cast<double>(step.beta), t));
  const T next_correction = static_cast<T>(1.0 - std::pow(static_cast<double>(step.beta), t + 1.0));
  const T lr = static_cast<T>(step.learning_rate), scale = static_cast<T>(step.gradient_scale);
  const T wd = apply_weight_decay ? static_cast<T>(step.weight_decay) : T(0);
  const int64_t count = rows * cols;
  for (int64_t matrix = 0; matrix < batch; ++matrix) {
    const int64_t base = matrix * count;
    std::vector<T> mu_hat(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) {
      const T g = grad[base + i] * scale;
      momentum[base + i] = beta * momentum[base + i] + (T(1) - beta) * g;
      mu_hat[static_cast<size_t>(i)] =
          beta * momentum[base + i] / next_correction + (T(1) - beta) * g / correction;
    }
    const std::vector<T> O = newton_schulz_reference(mu_hat, rows, cols, static_cast<T>(step.epsilon));
    for (int64_t i = 0; i < count; ++i) {
      param[base + i] -=
          lr * (static_cast<T>(step.update_scale) * O[static_cast<size_t>(i)] + wd * param[base + i]);
    }
  }
}

}  // namespace meshtrain::kernels
