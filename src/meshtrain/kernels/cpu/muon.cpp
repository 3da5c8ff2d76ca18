#include "meshtrain/kernels/cpu/muon.h"

#include <algorithm>

#include "meshtrain/kernels/cpu/adamw.h"  // sum_of_squares
#include "meshtrain/kernels/cpu/gemm.h"

namespace meshtrain::kernels {

int64_t muon_scratch_floats(int64_t rows, int64_t cols) {
  const int64_t n = std::min(rows, cols);
  return 2 * rows * cols + 2 * n * n;
}

void muon_update(float* param, const float* grad, float* momentum, int64_t batch, int64_t rows, int64_t cols,
                 const MuonStep& step, bool apply_weight_decay, float* scratch) {
  MT_CHECK(step.step >= 1, "the step is 1-based");
  MT_CHECK(batch >= 0 && rows > 0 && cols > 0, "a batch of non-empty matrices");
  const double t = static_cast<double>(step.step);
  const auto current = static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(step.beta), t)));
  const auto next = static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(step.beta), t + 1.0)));
  const float beta = step.beta, one_minus_beta = 1.0f - step.beta, scale = step.gradient_scale;
  const float decay = apply_weight_decay ? step.learning_rate * step.weight_decay : 0.0f;
  const float update_step = step.learning_rate * step.update_scale;
  const auto a = static_cast<float>(kNewtonSchulzA), b = static_cast<float>(kNewtonSchulzB),
             c = static_cast<float>(kNewtonSchulzC);
  // R <= C: X is [R, C] and iterates A = X X^T, X = a X + B X. R > C: X stays [R, C] and iterates the
  // transpose's iteration transposed, A = X^T X, X = a X + X B (B is symmetric).
  const bool tall = rows > cols;
  const int64_t n = std::min(rows, cols), count = rows * cols;
  float* X = scratch;          // [R, C]
  float* product = X + count;  // [R, C]: B X or X B
  float* A = product + count;  // [n, n]
  float* AA = A + n * n;       // [n, n], then B
  for (int64_t matrix = 0; matrix < batch; ++matrix) {
    const int64_t base = matrix * count;
#pragma omp parallel for simd schedule(static) if (count >= (1 << 15))
    for (int64_t i = 0; i < count; ++i) {
      const float g = grad[base + i] * scale;
      const float mu = beta * momentum[base + i] + one_minus_beta * g;
      momentum[base + i] = mu;
      X[i] = beta * mu * next + one_minus_beta * g * current;
    }
    const auto inverse_norm = static_cast<float>(1.0 / (std::sqrt(sum_of_squares(X, count)) + step.epsilon));
#pragma omp parallel for simd schedule(static) if (count >= (1 << 15))
    for (int64_t i = 0; i < count; ++i) X[i] *= inverse_norm;
    for (int s = 0; s < kNewtonSchulzSteps; ++s) {
      if (tall) {
        gemm(true, false, n, n, rows, X, cols, X, cols, false, A, n);  // X^T X
      } else {
        gemm(false, true, n, n, cols, X, cols, X, cols, false, A, n);  // X X^T
      }
      gemm(false, false, n, n, n, A, n, A, n, false, AA, n);
      for (int64_t i = 0; i < n * n; ++i) AA[i] = b * A[i] + c * AA[i];
      if (tall) {
        gemm(false, false, rows, cols, cols, X, cols, AA, n, false, product, cols);  // X B
      } else {
        gemm(false, false, rows, cols, rows, AA, n, X, cols, false, product, cols);  // B X
      }
#pragma omp parallel for simd schedule(static) if (count >= (1 << 15))
      for (int64_t i = 0; i < count; ++i) X[i] = a * X[i] + product[i];
    }
#pragma omp parallel for simd schedule(static) if (count >= (1 << 15))
    for (int64_t i = 0; i < count; ++i) {
      const float p = param[base + i];  // decay uses the parameter before the update
      param[base + i] = p - update_step * X[i] - decay * p;
    }
  }
}

}  // namespace meshtrain::kernels
