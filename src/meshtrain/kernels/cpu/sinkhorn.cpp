// Sinkhorn kernels (semantics in sinkhorn.h): the per-token code of the reference in float, tokens in
// parallel, each token's iterates on the stack. Each token's work is independent and serial, so results do
// not depend on the thread count.
#include "meshtrain/kernels/cpu/sinkhorn.h"

#include <array>

#include "meshtrain/core/error.h"

namespace meshtrain::kernels {
namespace {

void check_fits(int64_t G, int64_t iterations) {
  MT_CHECK(
      G >= 1 && iterations >= 1 && 2 * iterations * G * G <= kSinkhornMaxStageValues,
      "Sinkhorn iterates of G " + to_text(G) + " x " + to_text(iterations) + " iterations fit the stack");
}

}  // namespace

void sinkhorn_forward(float* mixing, const float* logits, int64_t N, int64_t G, int64_t iterations) {
  check_fits(G, iterations);
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    std::array<float, kSinkhornMaxStageValues> stages;
    sinkhorn_token_forward(stages.data(), logits + n * G * G, G, iterations);
    const float* last = stages.data() + (2 * iterations - 1) * G * G;
    std::copy(last, last + G * G, mixing + n * G * G);
  }
}

void sinkhorn_backward(float* d_logits, const float* d_mixing, const float* logits, int64_t N, int64_t G,
                       int64_t iterations) {
  check_fits(G, iterations);
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    std::array<float, kSinkhornMaxStageValues> stages;
    std::array<float, kSinkhornMaxStageValues> work;  // 2 G^2 <= 2 iterations G^2
    sinkhorn_token_forward(stages.data(), logits + n * G * G, G, iterations);
    sinkhorn_token_backward(d_logits + n * G * G, d_mixing + n * G * G, stages.data(), work.data(), G,
                            iterations);
  }
}

}  // namespace meshtrain::kernels
