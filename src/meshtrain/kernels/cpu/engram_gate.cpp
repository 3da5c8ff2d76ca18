// Engram gate kernels (semantics in engram_gate.h): tokens in parallel, each token's streams summed in stream
// order, so results do not depend on the thread count.
#include "meshtrain/kernels/cpu/engram_gate.h"

namespace meshtrain::kernels {

void engram_gate_forward(float* gated, float* gate, const float* q, const float* k, const float* v, int64_t N,
                         int64_t G, int64_t D) {
#pragma omp parallel for schedule(static) if (N * G * D >= (1 << 14))
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t g = 0; g < G; ++g) {
      const int64_t row = n * G + g;
      const float value = engram_gate_of(engram_gate_score(q + row * D, k + row * D, D));
      gate[row] = value;
      const float* in = v + n * D;
      float* out = gated + row * D;
#pragma omp simd
      for (int64_t c = 0; c < D; ++c) out[c] = value * in[c];
    }
  }
}

void engram_gate_backward(float* d_q, float* d_k, float* d_v, const float* d_gated, const float* gate,
                          const float* q, const float* k, const float* v, int64_t N, int64_t G, int64_t D) {
#pragma omp parallel for schedule(static) if (N * G * D >= (1 << 14))
  for (int64_t n = 0; n < N; ++n) {
    engram_gate_reference_backward(d_q + n * G * D, d_k + n * G * D, d_v + n * D, d_gated + n * G * D,
                                   gate + n * G, q + n * G * D, k + n * G * D, v + n * D, 1, G, D);
  }
}

}  // namespace meshtrain::kernels
