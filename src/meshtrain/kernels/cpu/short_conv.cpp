// ShortConv kernels (semantics in short_conv.h): rows in parallel, each output written by one task and
// summed over taps in tap order, so results do not depend on the thread count; each tap's weight gradient is
// summed by one task in (row, time) order.
#include "meshtrain/kernels/cpu/short_conv.h"

#include <algorithm>

namespace meshtrain::kernels {
namespace {

// Row b's input at time `source` of the stretch ([C] values): u, the halo before it, or nullptr (zeros).
const float* input_row(const float* u, const float* halo, int64_t b, int64_t source, int64_t T, int64_t C,
                       int64_t H) {
  if (source >= 0) return u + (b * T + source) * C;
  if (halo != nullptr && source >= -H) return halo + (b * H + H + source) * C;
  return nullptr;
}

}  // namespace

void short_conv_forward(float* y, const float* u, const float* halo, const float* w, int64_t B, int64_t T,
                        int64_t C, int64_t K, int64_t dilation) {
  const int64_t H = (K - 1) * dilation;
#pragma omp parallel for schedule(static) if (B * T * C >= (1 << 14))
  for (int64_t bt = 0; bt < B * T; ++bt) {
    const int64_t b = bt / T, t = bt % T;
    float* out = y + bt * C;
    std::fill(out, out + C, 0.0f);
    for (int64_t j = 0; j < K; ++j) {
      const int64_t source = t - (K - 1 - j) * dilation;
      const float* in = input_row(u, halo, b, source, T, C, H);
      if (in == nullptr) continue;
      const float* tap = w + j * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) out[c] += tap[c] * in[c];
    }
  }
}

void short_conv_backward(float* d_u, float* d_halo, float* d_w, const float* d_y, const float* u,
                         const float* halo, const float* w, int64_t B, int64_t T, int64_t C, int64_t K,
                         int64_t dilation) {
  const int64_t H = (K - 1) * dilation;
  // d_u[t] = sum_j d_y[t + (K-1-j) dilation] w[j]: a gather over the outputs that read input t, so each
  // input row is written by one task. The halo rows likewise, from the stretch's first outputs.
#pragma omp parallel for schedule(static) if (B * (T + H) * C >= (1 << 14))
  for (int64_t row = 0; row < B * (T + H); ++row) {
    const int64_t b = row / (T + H), time = row % (T + H) - H;  // time < 0: halo row
    if (time < 0 && d_halo == nullptr) continue;
    float* out = time >= 0 ? d_u + (b * T + time) * C : d_halo + (b * H + H + time) * C;
    std::fill(out, out + C, 0.0f);
    for (int64_t j = 0; j < K; ++j) {
      const int64_t reader = time + (K - 1 - j) * dilation;
      if (reader < 0 || reader >= T) continue;
      const float* gradient = d_y + (b * T + reader) * C;
      const float* tap = w + j * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) out[c] += gradient[c] * tap[c];
    }
  }
  // d_w[j, c] += sum over (b, t) of d_y[b, t, c] u[b, t - (K-1-j) dilation, c]: taps in parallel, each tap's
  // row of d_w added to by one task in (b, t) order.
#pragma omp parallel for schedule(static) if (K * B * T * C >= (1 << 14))
  for (int64_t j = 0; j < K; ++j) {
    float* tap_gradient = d_w + j * C;
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t t = 0; t < T; ++t) {
        const float* in = input_row(u, halo, b, t - (K - 1 - j) * dilation, T, C, H);
        if (in == nullptr) continue;
        const float* gradient = d_y + (b * T + t) * C;
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) tap_gradient[c] += gradient[c] * in[c];
      }
    }
  }
}

void short_conv_output_forward(float* out, const float* x, const float* gated, const float* y,
                               int64_t count) {
#pragma omp parallel for schedule(static) if (count >= (1 << 14))
  for (int64_t i = 0; i < count; ++i) out[i] = x[i] + gated[i] + silu_of(y[i]);
}

void short_conv_output_backward(float* d_gated, float* d_y, const float* d_out, const float* y,
                                int64_t count) {
#pragma omp parallel for schedule(static) if (count >= (1 << 14))
  for (int64_t i = 0; i < count; ++i) {
    d_gated[i] = d_out[i];
    d_y[i] = d_out[i] * silu_slope(y[i]);
  }
}

}  // namespace meshtrain::kernels
