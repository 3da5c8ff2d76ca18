// Fast dispatch kernels (semantics in moe_dispatch.h). Row copies and weighted sums parallelised over
// sorted rows or tokens: each task owns its output rows, and a token's slots are summed in slot order, so
// results do not depend on the thread count.
#include "meshtrain/kernels/cpu/moe_dispatch.h"

#include <algorithm>
#include <cstring>

#include "meshtrain/core/error.h"

namespace meshtrain::kernels {
namespace {

// Below this many values a parallel region costs more than it saves.
constexpr int64_t kParallelMinimum = 1 << 14;

}  // namespace

int64_t moe_route_plan(int32_t* counts, int32_t* offsets, int32_t* sorted, int32_t* position,
                       int32_t* assigned, const int32_t* chosen, int64_t N, int64_t k, int64_t E,
                       int64_t capacity) {
  const int64_t M = N * k;
  MT_CHECK(M <= INT32_MAX, "assignment indices fit int32: N k = " + to_text(M));
  for (int64_t e = 0; e < E; ++e) counts[e] = 0;
  for (int64_t a = 0; a < M; ++a) {
    MT_CHECK(chosen[a] >= 0 && chosen[a] < E, "chosen expert " + to_text(chosen[a]) + " out of [0, E)");
    ++counts[chosen[a]];
  }
  if (assigned != nullptr) std::copy(counts, counts + E, assigned);
  offsets[0] = 0;
  for (int64_t e = 0; e < E; ++e) {
    if (capacity > 0) counts[e] = static_cast<int32_t>(std::min<int64_t>(counts[e], capacity));
    offsets[e + 1] = offsets[e] + counts[e];
  }
  // Second pass in assignment (= token) order; counts serve as the per-expert fill cursors and end where
  // they began.
  for (int64_t e = 0; e < E; ++e) counts[e] = 0;
  int64_t dropped = 0;
  for (int64_t a = 0; a < M; ++a) {
    const int32_t e = chosen[a];
    if (offsets[e] + counts[e] < offsets[e + 1]) {
      const int32_t row = offsets[e] + counts[e]++;
      sorted[row] = static_cast<int32_t>(a);
      position[a] = row;
    } else {
      position[a] = -1;
      ++dropped;
    }
  }
  std::fill(sorted + offsets[E], sorted + M, -1);
  return dropped;
}

void moe_gather_forward(float* sorted_x, const float* x, const int32_t* sorted, int64_t R, int64_t k,
                        int64_t D) {
#pragma omp parallel for schedule(static) if (R * D >= kParallelMinimum)
  for (int64_t i = 0; i < R; ++i) {
    std::memcpy(sorted_x + i * D, x + (sorted[i] / k) * D, static_cast<size_t>(D) * sizeof(float));
  }
}

void moe_gather_backward(float* d_x, const float* d_sorted_x, const int32_t* position, int64_t N, int64_t k,
                         int64_t D, bool accumulate) {
#pragma omp parallel for schedule(static) if (N * D >= kParallelMinimum)
  for (int64_t t = 0; t < N; ++t) {
    float* out = d_x + t * D;
    if (!accumulate) std::fill(out, out + D, 0.0f);
    for (int64_t s = 0; s < k; ++s) {
      const int32_t row = position[t * k + s];
      if (row < 0) continue;
      const float* in = d_sorted_x + row * D;
#pragma omp simd
      for (int64_t c = 0; c < D; ++c) out[c] += in[c];
    }
  }
}

void moe_combine_forward(float* out, const float* y_sorted, const float* weights, const int32_t* position,
                         int64_t N, int64_t k, int64_t D, bool accumulate) {
#pragma omp parallel for schedule(static) if (N * D >= kParallelMinimum)
  for (int64_t t = 0; t < N; ++t) {
    float* row_out = out + t * D;
    if (!accumulate) std::fill(row_out, row_out + D, 0.0f);
    for (int64_t s = 0; s < k; ++s) {
      const int32_t row = position[t * k + s];
      if (row < 0) continue;
      const float weight = weights[t * k + s];
      const float* in = y_sorted + row * D;
#pragma omp simd
      for (int64_t c = 0; c < D; ++c) row_out[c] += weight * in[c];
    }
  }
}

void moe_combine_backward(float* d_y_sorted, float* d_weights, const float* d_out, const float* y_sorted,
                          const float* weights, const int32_t* position, int64_t N, int64_t k, int64_t D) {
#pragma omp parallel for schedule(static) if (N * D >= kParallelMinimum)
  for (int64_t t = 0; t < N; ++t) {
    const float* gradient = d_out + t * D;
    for (int64_t s = 0; s < k; ++s) {
      const int32_t row = position[t * k + s];
      float dot = 0.0f;
      if (row >= 0) {
        const float weight = weights[t * k + s];
        const float* y = y_sorted + row * D;
        float* d_y = d_y_sorted + row * D;
#pragma omp simd reduction(+ : dot)
        for (int64_t c = 0; c < D; ++c) {
          d_y[c] = weight * gradient[c];
          dot += gradient[c] * y[c];
        }
      }
      d_weights[t * k + s] = dot;
    }
  }
}

}  // namespace meshtrain::kernels
