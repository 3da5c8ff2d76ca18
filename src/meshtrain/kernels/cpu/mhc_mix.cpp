// mHC mix kernels (semantics in mhc_mix.h): the per-token reference in float, tokens in parallel (each
// token's sums in a fixed order, so results do not depend on the thread count).
#include "meshtrain/kernels/cpu/mhc_mix.h"

namespace meshtrain::kernels {
namespace {
constexpr int64_t kParallelMinimum = 1 << 14;
}  // namespace

void mhc_collapse_forward(float* xin, const float* x, const float* pre, int64_t N, int64_t G, int64_t D) {
#pragma omp parallel for schedule(static) if (N * G * D >= kParallelMinimum)
  for (int64_t n = 0; n < N; ++n)
    mhc_collapse_reference_forward(xin + n * D, x + n * G * D, pre + n * G, 1, G, D);
}

void mhc_collapse_backward(float* d_x, float* d_pre, const float* d_xin, const float* x, const float* pre,
                           int64_t N, int64_t G, int64_t D) {
#pragma omp parallel for schedule(static) if (N * G * D >= kParallelMinimum)
  for (int64_t n = 0; n < N; ++n) {
    mhc_collapse_reference_backward(d_x + n * G * D, d_pre + n * G, d_xin + n * D, x + n * G * D, pre + n * G,
                                    1, G, D);
  }
}

void mhc_expand_forward(float* out, const float* x, const float* mixing, const float* post, const float* o,
                        int64_t N, int64_t G, int64_t D) {
#pragma omp parallel for schedule(static) if (N * G * D >= kParallelMinimum)
  for (int64_t n = 0; n < N; ++n) {
    mhc_expand_reference_forward(out + n * G * D, x + n * G * D, mixing + n * G * G, post + n * G, o + n * D,
                                 1, G, D);
  }
}

void mhc_expand_backward(float* d_x, float* d_mixing, float* d_post, float* d_o, const float* d_out,
                         const float* x, const float* mixing, const float* post, const float* o, int64_t N,
                         int64_t G, int64_t D) {
#pragma omp parallel for schedule(static) if (N * G * D >= kParallelMinimum)
  for (int64_t n = 0; n < N; ++n) {
    mhc_expand_reference_backward(d_x + n * G * D, d_mixing + n * G * G, d_post + n * G, d_o + n * D,
                                  d_out + n * G * D, x + n * G * D, mixing + n * G * G, post + n * G,
                                  o + n * D, 1, G, D);
  }
}

}  // namespace meshtrain::kernels
