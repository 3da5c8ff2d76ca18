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

void mhc_coefficients_forward(float* pre, float* post, float* logits, const float* h, const float* scales,
                              const float* pre_beta, const float* post_beta, const float* res_beta, int64_t N,
                              int64_t G) {
  const int64_t width = 2 * G + G * G;
#pragma omp parallel for schedule(static) if (N * width >= kParallelMinimum)
  for (int64_t n = 0; n < N; ++n) {
    mhc_coefficients_reference_forward(pre + n * G, post + n * G, logits + n * G * G, h + n * width, scales,
                                       pre_beta, post_beta, res_beta, 1, G);
  }
}

// The parameter gradients are sums over every token: one pass in token order (a few values per token, so
// the serial sum costs little next to the site's matmul), deterministic for any thread count.
void mhc_coefficients_backward(float* d_h, float* d_scales, float* d_pre_beta, float* d_post_beta,
                               float* d_res_beta, const float* d_pre, const float* d_post,
                               const float* d_logits, const float* h, const float* scales,
                               const float* pre_beta, const float* post_beta, int64_t N, int64_t G) {
  mhc_coefficients_reference_backward(d_h, d_scales, d_pre_beta, d_post_beta, d_res_beta, d_pre, d_post,
                                      d_logits, h, scales, pre_beta, post_beta, N, G);
}

void mhc_streams_repeat(float* out, const float* x, int64_t N, int64_t G, int64_t D) {
#pragma omp parallel for schedule(static) if (N * G * D >= kParallelMinimum)
  for (int64_t n = 0; n < N; ++n)
    for (int64_t g = 0; g < G; ++g)
      for (int64_t c = 0; c < D; ++c) out[(n * G + g) * D + c] = x[n * D + c];
}

void mhc_streams_sum(float* out, const float* x, int64_t N, int64_t G, int64_t D, bool accumulate) {
#pragma omp parallel for schedule(static) if (N * G * D >= kParallelMinimum)
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < D; ++c) {
      float sum = accumulate ? out[n * D + c] : 0.0f;
      for (int64_t g = 0; g < G; ++g) sum += x[(n * G + g) * D + c];
      out[n * D + c] = sum;
    }
}

}  // namespace meshtrain::kernels
