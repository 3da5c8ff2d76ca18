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

// out row t = (or +=) the sum over token t's kept slots s, in slot order, of weight[t, s] * rows row
// position[t k + s], weight 1 where weights is nullptr: the combine, and the gather's transpose.
void sum_token_slots(float* out, const float* rows, const float* weights, const int32_t* position, int64_t N,
                     int64_t k, int64_t D, bool accumulate) {
#pragma omp parallel for schedule(static) if (N * D >= kParallelMinimum)
  for (int64_t t = 0; t < N; ++t) {
    float* row_out = out + t * D;
    if (!accumulate) std::fill(row_out, row_out + D, 0.0f);
    for (int64_t s = 0; s < k; ++s) {
      const int32_t row = position[t * k + s];
      if (row < 0) continue;
      const float weight = weights == nullptr ? 1.0f : weights[t * k + s];
      const float* in = rows + row * D;
#pragma omp simd
      for (int64_t c = 0; c < D; ++c) row_out[c] += weight * in[c];
    }
  }
}

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
    if (sorted[i] < 0) {
      std::fill(sorted_x + i * D, sorted_x + (i + 1) * D, 0.0f);
    } else {
      std::memcpy(sorted_x + i * D, x + (sorted[i] / k) * D, static_cast<size_t>(D) * sizeof(float));
    }
  }
}

void moe_dispatch_plan(int32_t* send_sorted, int32_t* send_position, int32_t* send_counts,
                       const int32_t* offsets, const int32_t* sorted, int64_t M, int64_t E, int64_t P,
                       int64_t block_rows) {
  MT_CHECK(P > 0 && E % P == 0, "expert ranks divide the experts: E " + to_text(E) + ", P " + to_text(P));
  MT_CHECK(P * block_rows <= INT32_MAX, "block rows fit int32: P B_c = " + to_text(P * block_rows));
  const int64_t E_local = E / P;
  std::fill(send_sorted, send_sorted + P * block_rows, -1);
  std::fill(send_position, send_position + M, -1);
  for (int64_t j = 0; j < P; ++j) {
    const int32_t first = offsets[j * E_local];
    MT_CHECK(offsets[(j + 1) * E_local] - first <= block_rows,
             "rows for expert rank " + to_text(j) + " (" + to_text(offsets[(j + 1) * E_local] - first) +
                 ") exceed the block of " + to_text(block_rows));
    for (int64_t e = j * E_local; e < (j + 1) * E_local; ++e) {
      send_counts[e] = offsets[e + 1] - offsets[e];
      for (int32_t row = offsets[e]; row < offsets[e + 1]; ++row) {
        const auto block_row = static_cast<int32_t>(j * block_rows + (row - first));
        send_sorted[block_row] = sorted[row];
        send_position[sorted[row]] = block_row;
      }
    }
  }
}

void moe_receive_plan(int32_t* local_offsets, int32_t* local_sorted, int32_t* received_position,
                      const int32_t* received_counts, int64_t P, int64_t E_local, int64_t block_rows) {
  std::fill(local_sorted, local_sorted + P * block_rows, -1);
  std::fill(received_position, received_position + P * block_rows, -1);
  local_offsets[0] = 0;
  for (int64_t e = 0; e < E_local; ++e) {
    int32_t rows = 0;
    for (int64_t i = 0; i < P; ++i) rows += received_counts[i * E_local + e];
    local_offsets[e + 1] = local_offsets[e] + rows;
  }
  for (int64_t i = 0; i < P; ++i) {
    int64_t in_block = 0;  // rank i's rows of the local experts before e, as its block lays them out
    for (int64_t e = 0; e < E_local; ++e) {
      const int32_t count = received_counts[i * E_local + e];
      MT_CHECK(count >= 0 && in_block + count <= block_rows,
               "rank " + to_text(i) + " sent more rows than its block of " + to_text(block_rows));
      // Local rows of expert e: rank 0's first, then rank 1's, ...
      int32_t local = local_offsets[e];
      for (int64_t before = 0; before < i; ++before) local += received_counts[before * E_local + e];
      for (int32_t r = 0; r < count; ++r) {
        const auto received = static_cast<int32_t>(i * block_rows + in_block + r);
        local_sorted[local + r] = received;
        received_position[received] = local + r;
      }
      in_block += count;
    }
  }
}

void moe_gather_backward(float* d_x, const float* d_sorted_x, const int32_t* position, int64_t N, int64_t k,
                         int64_t D, bool accumulate) {
  sum_token_slots(d_x, d_sorted_x, nullptr, position, N, k, D, accumulate);
}

void moe_combine_forward(float* out, const float* y_sorted, const float* weights, const int32_t* position,
                         int64_t N, int64_t k, int64_t D, bool accumulate) {
  sum_token_slots(out, y_sorted, weights, position, N, k, D, accumulate);
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
