#include "meshtrain/kernels/cpu/adamw.h"

#include <omp.h>

#include <algorithm>

namespace meshtrain::kernels {
namespace {

// Below this many elements a tensor (norm scales, biases) is updated by the calling thread alone:
// starting a parallel region would cost more than the update.
constexpr int64_t kParallelThreshold = 1 << 15;

}  // namespace

void adamw_update(float* param, const float* grad, float* m, float* v, int64_t count, const AdamWStep& step,
                  bool apply_weight_decay) {
  MT_CHECK(step.step >= 1, "the step is 1-based");
  MT_CHECK(count >= 0, "count >= 0");
  // Bias corrections once per call, in double; folded into the step size and the denominator scale:
  // mhat / (sqrt(vhat) + eps) = (m / bc1) / (sqrt(v) / sqrt(bc2) + eps).
  const double t = static_cast<double>(step.step);
  const double bias_correction1 = 1.0 - std::pow(static_cast<double>(step.beta1), t);
  const double bias_correction2 = 1.0 - std::pow(static_cast<double>(step.beta2), t);
  const float step_size = static_cast<float>(static_cast<double>(step.learning_rate) / bias_correction1);
  const float inverse_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bias_correction2));
  const float decay = apply_weight_decay ? step.learning_rate * step.weight_decay : 0.0f;
  const float b1 = step.beta1, b2 = step.beta2, eps = step.epsilon, scale = step.gradient_scale;
  const float one_minus_b1 = 1.0f - b1, one_minus_b2 = 1.0f - b2;

#pragma omp parallel for simd schedule(static) if (count >= kParallelThreshold)
  for (int64_t i = 0; i < count; ++i) {
    const float g = grad[i] * scale;
    const float m_new = b1 * m[i] + one_minus_b1 * g;
    const float v_new = b2 * v[i] + one_minus_b2 * g * g;
    m[i] = m_new;
    v[i] = v_new;
    // Decay uses the parameter before this step's update, as in the formula.
    const float p = param[i];
    param[i] = p - step_size * m_new / (std::sqrt(v_new) * inverse_sqrt_bc2 + eps) - decay * p;
  }
}

double sum_of_squares(const float* values, int64_t count) {
  MT_CHECK(count >= 0, "count >= 0");
  double total = 0.0;
#pragma omp parallel if (count >= kParallelThreshold)
  {
    // Each thread sums one contiguous, thread-count-determined block; the partial sums are then added
    // in thread order, so the result is the same on every run with the same thread count.
    const int64_t threads = omp_get_num_threads();
    const int64_t thread = omp_get_thread_num();
    const int64_t block = (count + threads - 1) / threads;
    const int64_t begin = std::min(count, thread * block);
    const int64_t end = std::min(count, begin + block);
    double partial = 0.0;
#pragma omp simd reduction(+ : partial)
    for (int64_t i = begin; i < end; ++i) {
      const double x = static_cast<double>(values[i]);
      partial += x * x;
    }
    // schedule(static, 1) gives iteration k to thread k; ordered adds the partials in thread order.
#pragma omp for ordered schedule(static, 1)
    for (int64_t k = 0; k < threads; ++k) {
#pragma omp ordered
      total += partial;
    }
  }
  return total;
}

}  // namespace meshtrain::kernels
