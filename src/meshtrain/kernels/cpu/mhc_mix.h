// mHC's stream mixes around a sublayer F (shared/specs/mhc.md), given the site's per-token weights:
//   collapse: xin = sum_g pre_g x_g                          (F's input)
//   expand:   out_m = sum_k M[k, m] x_k + post_m o           (o = F's output; M the Sinkhorn mixing)
// Legend: N tokens, G residual streams, D width; M row-major [G, G] per token.
// Gradient semantics: expand's backward writes d_x (=), d_mixing, d_post, d_o (=); collapse's backward adds
// into d_x (+=: the streams also reach the output through expand) and writes d_pre (=).
#pragma once

#include <cstdint>

namespace meshtrain::kernels {

void mhc_collapse_forward(float* xin,        // [N, D]
                          const float* x,    // [N, G, D]
                          const float* pre,  // [N, G]
                          int64_t N, int64_t G, int64_t D);
void mhc_collapse_backward(float* d_x,          // [N, G, D] +=
                           float* d_pre,        // [N, G]
                           const float* d_xin,  // [N, D]
                           const float* x,      // [N, G, D]
                           const float* pre,    // [N, G]
                           int64_t N, int64_t G, int64_t D);
void mhc_expand_forward(float* out,           // [N, G, D]
                        const float* x,       // [N, G, D]
                        const float* mixing,  // [N, G, G]
                        const float* post,    // [N, G]
                        const float* o,       // [N, D]
                        int64_t N, int64_t G, int64_t D);
void mhc_expand_backward(float* d_x,           // [N, G, D]
                         float* d_mixing,      // [N, G, G]
                         float* d_post,        // [N, G]
                         float* d_o,           // [N, D]
                         const float* d_out,   // [N, G, D]
                         const float* x,       // [N, G, D]
                         const float* mixing,  // [N, G, G]
                         const float* post,    // [N, G]
                         const float* o,       // [N, D]
                         int64_t N, int64_t G, int64_t D);

template <class T>
void mhc_collapse_reference_forward(T* xin, const T* x, const T* pre, int64_t N, int64_t G, int64_t D) {
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < D; ++c) {
      T sum = T(0);
      for (int64_t g = 0; g < G; ++g) sum += pre[n * G + g] * x[(n * G + g) * D + c];
      xin[n * D + c] = sum;
    }
}

template <class T>
void mhc_collapse_reference_backward(T* d_x, T* d_pre, const T* d_xin, const T* x, const T* pre, int64_t N,
                                     int64_t G, int64_t D) {
  for (int64_t n = 0; n < N; ++n)
    for (int64_t g = 0; g < G; ++g) {
      T dot = T(0);
      for (int64_t c = 0; c < D; ++c) {
        d_x[(n * G + g) * D + c] += pre[n * G + g] * d_xin[n * D + c];
        dot += d_xin[n * D + c] * x[(n * G + g) * D + c];
      }
      d_pre[n * G + g] = dot;
    }
}

template <class T>
void mhc_expand_reference_forward(T* out, const T* x, const T* mixing, const T* post, const T* o, int64_t N,
                                  int64_t G, int64_t D) {
  for (int64_t n = 0; n < N; ++n)
    for (int64_t m = 0; m < G; ++m)
      for (int64_t c = 0; c < D; ++c) {
        T sum = post[n * G + m] * o[n * D + c];
        for (int64_t k = 0; k < G; ++k) sum += mixing[(n * G + k) * G + m] * x[(n * G + k) * D + c];
        out[(n * G + m) * D + c] = sum;
      }
}

template <class T>
void mhc_expand_reference_backward(T* d_x, T* d_mixing, T* d_post, T* d_o, const T* d_out, const T* x,
                                   const T* mixing, const T* post, const T* o, int64_t N, int64_t G,
                                   int64_t D) {
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t c = 0; c < D; ++c) {
      T sum = T(0);
      for (int64_t m = 0; m < G; ++m) sum += post[n * G + m] * d_out[(n * G + m) * D + c];
      d_o[n * D + c] = sum;
    }
    for (int64_t m = 0; m < G; ++m) {
      T dot = T(0);
      for (int64_t c = 0; c < D; ++c) dot += o[n * D + c] * d_out[(n * G + m) * D + c];
      d_post[n * G + m] = dot;
    }
    for (int64_t k = 0; k < G; ++k) {
      for (int64_t c = 0; c < D; ++c) {
        T sum = T(0);
        for (int64_t m = 0; m < G; ++m) sum += mixing[(n * G + k) * G + m] * d_out[(n * G + m) * D + c];
        d_x[(n * G + k) * D + c] = sum;
      }
      for (int64_t m = 0; m < G; ++m) {
        T dot = T(0);
        for (int64_t c = 0; c < D; ++c) dot += x[(n * G + k) * D + c] * d_out[(n * G + m) * D + c];
        d_mixing[(n * G + k) * G + m] = dot;
      }
    }
  }
}

}  // namespace meshtrain::kernels
