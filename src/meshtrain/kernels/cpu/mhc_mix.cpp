// mHC mix kernels (semantics in mhc_mix.h): tokens in parallel, each token's sums in a fixed order, so
// results do not depend on the thread count.
#include "meshtrain/kernels/cpu/mhc_mix.h"

namespace meshtrain::kernels {
namespace {

constexpr int64_t kParallelMinimum = 1 << 14;

// The step every mix backward takes per (stream, gradient row) pair: accumulate += weight * grad, and the
// returned <other, grad>, in one pass over grad.
float add_scaled_and_dot(float* __restrict accumulate, float weight, const float* __restrict grad,
                         const float* __restrict other, int64_t D) {
  float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
  for (int64_t c = 0; c < D; ++c) {
    accumulate[c] += weight * grad[c];
    dot += other[c] * grad[c];
  }
  return dot;
}

}  // namespace

// The per-token loops keep D innermost and contiguous (the references' stream loops, reordered), so they
// vectorise; each output element sums its terms in the references' order.
void mhc_collapse_forward(float* xin, const float* x, const float* pre, int64_t N, int64_t G, int64_t D) {
#pragma omp parallel for schedule(static) if (N * G * D >= kParallelMinimum)
  for (int64_t n = 0; n < N; ++n) {
    float* __restrict out = xin + n * D;
    const float* streams = x + n * G * D;
    const float* weights = pre + n * G;
    for (int64_t c = 0; c < D; ++c) out[c] = 0.0f;
    for (int64_t g = 0; g < G; ++g) {
      const float* __restrict stream = streams + g * D;
      const float weight = weights[g];
#pragma omp simd
      for (int64_t c = 0; c < D; ++c) out[c] += weight * stream[c];
    }
  }
}

void mhc_collapse_backward(float* d_x, float* d_pre, const float* d_xin, const float* x, const float* pre,
                           int64_t N, int64_t G, int64_t D) {
#pragma omp parallel for schedule(static) if (N * G * D >= kParallelMinimum)
  for (int64_t n = 0; n < N; ++n) {
    const float* grad = d_xin + n * D;
    for (int64_t g = 0; g < G; ++g) {
      d_pre[n * G + g] =
          add_scaled_and_dot(d_x + (n * G + g) * D, pre[n * G + g], grad, x + (n * G + g) * D, D);
    }
  }
}

void mhc_expand_forward(float* out, const float* x, const float* mixing, const float* post, const float* o,
                        int64_t N, int64_t G, int64_t D) {
#pragma omp parallel for schedule(static) if (N * G * D >= kParallelMinimum)
  for (int64_t n = 0; n < N; ++n) {
    const float* __restrict branch = o + n * D;
    const float* matrix = mixing + n * G * G;
    for (int64_t m = 0; m < G; ++m) {
      float* __restrict row = out + (n * G + m) * D;
      const float scale = post[n * G + m];
#pragma omp simd
      for (int64_t c = 0; c < D; ++c) row[c] = scale * branch[c];
      for (int64_t k = 0; k < G; ++k) {
        const float* __restrict stream = x + (n * G + k) * D;
        const float weight = matrix[k * G + m];
#pragma omp simd
        for (int64_t c = 0; c < D; ++c) row[c] += weight * stream[c];
      }
    }
  }
}

void mhc_expand_backward(float* d_x, float* d_mixing, float* d_post, float* d_o, const float* d_out,
                         const float* x, const float* mixing, const float* post, const float* o, int64_t N,
                         int64_t G, int64_t D) {
#pragma omp parallel for schedule(static) if (N * G * D >= kParallelMinimum)
  for (int64_t n = 0; n < N; ++n) {
    const float* grads = d_out + n * G * D;
    const float* __restrict branch = o + n * D;
    const float* matrix = mixing + n * G * G;
    float* __restrict d_branch = d_o + n * D;
    for (int64_t c = 0; c < D; ++c) d_branch[c] = 0.0f;
    for (int64_t m = 0; m < G; ++m) {
      d_post[n * G + m] = add_scaled_and_dot(d_branch, post[n * G + m], grads + m * D, branch, D);
    }
    for (int64_t k = 0; k < G; ++k) {
      float* d_stream = d_x + (n * G + k) * D;
      const float* stream = x + (n * G + k) * D;
      for (int64_t c = 0; c < D; ++c) d_stream[c] = 0.0f;
      for (int64_t m = 0; m < G; ++m) {
        d_mixing[(n * G + k) * G + m] =
            add_scaled_and_dot(d_stream, matrix[k * G + m], grads + m * D, stream, D);
      }
    }
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
