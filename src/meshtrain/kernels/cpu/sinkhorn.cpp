// Sinkhorn kernels (semantics in sinkhorn.h): the per-token reference in float, tokens in parallel. Each
// token's work is independent and serial, so results do not depend on the thread count.
#include "meshtrain/kernels/cpu/sinkhorn.h"

namespace meshtrain::kernels {

void sinkhorn_forward(float* mixing, const float* logits, int64_t N, int64_t G, int64_t iterations) {
#pragma omp parallel
  {
    std::vector<float> stages;
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      sinkhorn_token_forward(stages, logits + n * G * G, G, iterations);
      std::copy(stages.end() - G * G, stages.end(), mixing + n * G * G);
    }
  }
}

void sinkhorn_backward(float* d_logits, const float* d_mixing, const float* logits, int64_t N, int64_t G,
                       int64_t iterations) {
#pragma omp parallel
  {
    std::vector<float> stages;
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      sinkhorn_token_forward(stages, logits + n * G * G, G, iterations);
      sinkhorn_token_backward(d_logits + n * G * G, d_mixing + n * G * G, stages, G, iterations);
    }
  }
}

}  // namespace meshtrain::kernels
