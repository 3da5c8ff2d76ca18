// mHC's stream mixes around a sublayer F (shared/specs/mhc.md), given the site's per-token weights:
//   collapse: xin = sum_g pre_g x_g                          (F's input)
//   expand:   out_m = sum_k M[k, m] x_k + post_m o           (o = F's output; M the Sinkhorn mixing)
// Legend: N tokens, G residual streams, D width; M row-major [G, G] per token.
// Gradient semantics: expand's backward writes d_x (=), d_mixing, d_post, d_o (=); collapse's backward adds
// into d_x (+=: the streams also reach the output through expand) and writes d_pre (=).
#pragma once

#include <cmath>
#include <cstdint>

#include "meshtrain/kernels/signatures.h"

namespace meshtrain::kernels {

MhcCollapseForward mhc_collapse_forward;
MhcCollapseBackward mhc_collapse_backward;
MhcExpandForward mhc_expand_forward;
MhcExpandBackward mhc_expand_backward;

// A site's coefficients from its projection h = RMSNorm(x) @ [pre_alpha | post_alpha | res_alpha], per token
// (scales = {a_pre, a_post, a_res}):
//   pre    = sigmoid(a_pre h[0..G) + pre_beta) + 1e-6
//   post   = 2 sigmoid(a_post h[G..2G) + post_beta)
//   logits = a_res h[2G..2G+G^2) + res_beta          (row-major [G, G]; Sinkhorn makes the mixing of them)
// Backward: d_h written (=); d_scales [3] and the betas' gradients accumulated (+=), summed over tokens in
// token order.
inline constexpr double kMhcPreFloor = 1e-6;
MhcCoefficientsForward mhc_coefficients_forward;
MhcCoefficientsBackward mhc_coefficients_backward;

// The residual streams' entry and exit: repeat x into G streams (out written), and their sum (out written
// or, accumulate, added to). Each is the other's backward.
MhcStreamsRepeat mhc_streams_repeat;
MhcStreamsSum mhc_streams_sum;

template <class T>
T mhc_sigmoid(T z) {
  return T(1) / (T(1) + std::exp(-z));
}

template <class T>
void mhc_coefficients_reference_forward(T* pre, T* post, T* logits, const T* h, const T* scales,
                                        const T* pre_beta, const T* post_beta, const T* res_beta, int64_t N,
                                        int64_t G) {
  const int64_t width = 2 * G + G * G;
  for (int64_t n = 0; n < N; ++n) {
    const T* row = h + n * width;
    for (int64_t g = 0; g < G; ++g) {
      pre[n * G + g] = mhc_sigmoid(scales[0] * row[g] + pre_beta[g]) + T(kMhcPreFloor);
      post[n * G + g] = T(2) * mhc_sigmoid(scales[1] * row[G + g] + post_beta[g]);
    }
    for (int64_t i = 0; i < G * G; ++i) logits[n * G * G + i] = scales[2] * row[2 * G + i] + res_beta[i];
  }
}

template <class T>
void mhc_coefficients_reference_backward(T* d_h, T* d_scales, T* d_pre_beta, T* d_post_beta, T* d_res_beta,
                                         const T* d_pre, const T* d_post, const T* d_logits, const T* h,
                                         const T* scales, const T* pre_beta, const T* post_beta, int64_t N,
                                         int64_t G) {
  const int64_t width = 2 * G + G * G;
  for (int64_t n = 0; n < N; ++n) {
    const T* row = h + n * width;
    T* d_row = d_h + n * width;
    for (int64_t g = 0; g < G; ++g) {
      const T s_pre = mhc_sigmoid(scales[0] * row[g] + pre_beta[g]);
      const T d_z_pre = d_pre[n * G + g] * s_pre * (T(1) - s_pre);
      d_row[g] = d_z_pre * scales[0];
      d_scales[0] += d_z_pre * row[g];
      d_pre_beta[g] += d_z_pre;
      const T s_post = mhc_sigmoid(scales[1] * row[G + g] + post_beta[g]);
      const T d_z_post = d_post[n * G + g] * T(2) * s_post * (T(1) - s_post);
      d_row[G + g] = d_z_post * scales[1];
      d_scales[1] += d_z_post * row[G + g];
      d_post_beta[g] += d_z_post;
    }
    for (int64_t i = 0; i < G * G; ++i) {
      const T d_logit = d_logits[n * G * G + i];
      d_row[2 * G + i] = d_logit * scales[2];
      d_scales[2] += d_logit * row[2 * G + i];
      d_res_beta[i] += d_logit;
    }
  }
}

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
