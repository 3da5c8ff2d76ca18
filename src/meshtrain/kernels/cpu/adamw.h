// Fused AdamW optimizer step (one pass over each tensor) and the sum of squares used for the global
// gradient norm. Legend: count = number of elements of one parameter tensor (any shape, flattened).
#pragma once

#include <cmath>
#include <cstdint>

#include "meshtrain/core/error.h"
#include "meshtrain/kernels/arguments.h"  // AdamWStep
#include "meshtrain/kernels/signatures.h"

namespace meshtrain::kernels {

// Decoupled weight decay (applied only when apply_weight_decay; the caller's mask says no decay for norms,
// biases, embeddings):
// g = grad*scale; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; mhat = m/(1-b1^t); vhat = v/(1-b2^t);
// param -= lr * (mhat / (sqrt(vhat) + eps) + wd * param)      (equals PyTorch AdamW and optax.adamw)
// With step.nesterov (optax.adamw(nesterov=True), the AdamW optax.contrib.muon steps non-matrices with):
// mhat = b1 m / (1-b1^(t+1)) + (1-b1) g / (1-b1^t).
AdamWUpdate adamw_update;

// Plain reference of adamw_update, literally the formula above; templated so tests can run it in double.
template <class T>
void adamw_reference_update(T* param, const T* grad, T* m, T* v, int64_t count, const AdamWStep& step,
                            bool apply_weight_decay) {
  MT_CHECK(step.step >= 1, "the step is 1-based");
  const double t = static_cast<double>(step.step);
  const T bias_correction1 = static_cast<T>(1.0 - std::pow(static_cast<double>(step.beta1), t));
  const T bias_correction2 = static_cast<T>(1.0 - std::pow(static_cast<double>(step.beta2), t));
  const T next_bias_correction1 = static_cast<T>(1.0 - std::pow(static_cast<double>(step.beta1), t + 1.0));
  const T b1 = static_cast<T>(step.beta1), b2 = static_cast<T>(step.beta2);
  const T lr = static_cast<T>(step.learning_rate), eps = static_cast<T>(step.epsilon);
  const T wd = apply_weight_decay ? static_cast<T>(step.weight_decay) : T(0);
  const T scale = static_cast<T>(step.gradient_scale);
  for (int64_t i = 0; i < count; ++i) {
    const T g = grad[i] * scale;
    m[i] = b1 * m[i] + (T(1) - b1) * g;
    v[i] = b2 * v[i] + (T(1) - b2) * g * g;
    const T m_hat = step.nesterov ? b1 * m[i] / next_bias_correction1 + (T(1) - b1) * g / bias_correction1
                                  : m[i] / bias_correction1;
    const T v_hat = v[i] / bias_correction2;
    param[i] -= lr * (m_hat / (std::sqrt(v_hat) + eps) + wd * param[i]);
  }
}

// Sum of squares accumulated in double (global gradient norm); deterministic for a fixed thread count.
SumOfSquares sum_of_squares;

}  // namespace meshtrain::kernels
