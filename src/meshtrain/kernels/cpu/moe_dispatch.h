// Dispatch and combine of a mixture-of-experts layer: the routing plan that sorts the N k assignments by
// expert, the gather of token rows into that order (the grouped matmul's input), the weighted combine of
// the experts' output rows back into tokens.
// Legend: N tokens, D width, E routed experts, k experts per token, M = N k assignments (assignment t k + s
// is token t's slot s), R = offsets[E] kept (sorted) rows, R <= M.
//
// Capacity: capacity <= 0 is dropless (R = M). capacity > 0: each expert keeps its first `capacity`
// assignments in token order and drops the rest; a dropped assignment has position -1, gets no sorted row,
// contributes nothing to the combine and gets a zero weight gradient (its token keeps its other experts and
// the residual / shared expert path).
// Gradient semantics: d_x (gather) written, or added with accumulate; d_y_sorted and d_weights (combine)
// written. Every backward loops over tokens and their slots through `position`: no atomics, deterministic.
#pragma once

#include <cstdint>

#include "meshtrain/kernels/arguments.h"
#include "meshtrain/kernels/signatures.h"

namespace meshtrain::kernels {

// Counting sort of the assignments by expert, stable (within an expert, token order). Writes counts (kept
// assignments per expert), offsets (prefix sums of counts, offsets[E] = R), sorted (rows [0, R): the
// assignment index of each sorted row; rows [R, M): -1), position (each assignment's sorted row, or -1 when
// dropped) and, when given, assigned (assignments per expert before dropping: the balance loss's counts).
// Returns the number of dropped assignments, M - R. O(M + E) and serial, so this one function is also its
// own plain reference (the tests check it against std::stable_sort).
MoeRoutePlan moe_route_plan;

// sorted_x row i = x row sorted[i] / k, for i < R; a zero row where sorted[i] < 0 (the padding of an
// expert-parallel block).
MoeGatherForward moe_gather_forward;

// d_x row t = (or +=) sum over token t's kept slots s of d_sorted_x row position[t k + s].
MoeGatherBackward moe_gather_backward;

// out row t = (or +=) sum over kept slots s of weights[t, s] * y_sorted row position[t k + s].
MoeCombineForward moe_combine_forward;

// d_y_sorted row position[t k + s] = weights[t, s] d_out row t; d_weights[t, s] = d_out row t . y_sorted
// row position[t k + s] (0 when dropped). Both written.
MoeCombineBackward moe_combine_backward;

// Expert parallelism: the routed experts split over P expert ranks, rank j holding experts [j E_l,
// (j + 1) E_l), E_l = E / P. Each pair of ranks exchanges one block of B_c rows (all_to_all over the expert
// axis; B_c is the layer's moe_dispatch_block_rows), so the bytes moved are fixed and equal the plan's. A
// token rank's block j holds its sorted rows of rank j's experts in sorted order (local expert 0's, then
// 1's, ...), then zero padding.

// Token side: send_sorted (each block row's assignment, -1 padding), send_position (each assignment's block
// row, -1 when dropped) and send_counts (rows per expert rank and its local expert), from the routing plan.
// Serial O(M + P B_c): its own reference.
MoeDispatchPlan moe_dispatch_plan;

// Expert side: from the counts each token rank sent (received_counts row i: rank i's rows per local expert,
// as its block lays them out), the grouped matmuls' order (expert-major, then by sending rank, then as
// sent): local_offsets (prefix sums per local expert; R_l = local_offsets[E_l]), local_sorted (each local
// row's received row, -1 past R_l) and received_position (each received row's local row, -1 padding).
// Serial O(P B_c): its own reference.
MoeReceivePlan moe_receive_plan;

template <class T>
void moe_gather_reference_forward(T* sorted_x, const T* x, const int32_t* sorted, int64_t R, int64_t k,
                                  int64_t D) {
  for (int64_t i = 0; i < R; ++i) {
    for (int64_t c = 0; c < D; ++c) sorted_x[i * D + c] = sorted[i] < 0 ? T(0) : x[(sorted[i] / k) * D + c];
  }
}

template <class T>
void moe_gather_reference_backward(T* d_x, const T* d_sorted_x, const int32_t* position, int64_t N, int64_t k,
                                   int64_t D, bool accumulate) {
  for (int64_t t = 0; t < N; ++t) {
    for (int64_t c = 0; c < D; ++c) {
      T sum = accumulate ? d_x[t * D + c] : T(0);
      for (int64_t s = 0; s < k; ++s) {
        const int32_t row = position[t * k + s];
        if (row >= 0) sum += d_sorted_x[row * D + c];
      }
      d_x[t * D + c] = sum;
    }
  }
}

template <class T>
void moe_combine_reference_forward(T* out, const T* y_sorted, const T* weights, const int32_t* position,
                                   int64_t N, int64_t k, int64_t D, bool accumulate) {
  for (int64_t t = 0; t < N; ++t) {
    for (int64_t c = 0; c < D; ++c) {
      T sum = accumulate ? out[t * D + c] : T(0);
      for (int64_t s = 0; s < k; ++s) {
        const int32_t row = position[t * k + s];
        if (row >= 0) sum += weights[t * k + s] * y_sorted[row * D + c];
      }
      out[t * D + c] = sum;
    }
  }
}

template <class T>
void moe_combine_reference_backward(T* d_y_sorted, T* d_weights, const T* d_out, const T* y_sorted,
                                    const T* weights, const int32_t* position, int64_t N, int64_t k,
                                    int64_t D) {
  for (int64_t t = 0; t < N; ++t) {
    for (int64_t s = 0; s < k; ++s) {
      const int32_t row = position[t * k + s];
      T dot = T(0);
      if (row >= 0) {
        for (int64_t c = 0; c < D; ++c) {
          d_y_sorted[row * D + c] = weights[t * k + s] * d_out[t * D + c];
          dot += d_out[t * D + c] * y_sorted[row * D + c];
        }
      }
      d_weights[t * k + s] = dot;
    }
  }
}

}  // namespace meshtrain::kernels
