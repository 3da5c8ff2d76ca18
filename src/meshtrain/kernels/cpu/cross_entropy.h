// Fused unembedding + softmax cross-entropy: the loss and its gradients without ever holding the full
// [N, V] logits, plus plain logits for sampling/eval and a double-capable reference for tests. Optionally
// vocab-parallel (Megatron-style tensor parallelism): each of t ranks holds V contiguous vocabulary rows.
// Legend: N tokens, D width, V vocab (padded; per rank when vocab-parallel), C chunk of tokens
// (chunk_tokens), G group of chunks (bf16 weight gradient), t tensor ranks.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "meshtrain/core/error.h"
#include "meshtrain/kernels/arguments.h"  // UnembedLayout, CrossEntropySums, VocabParallel
#include "meshtrain/kernels/signatures.h"

namespace meshtrain::kernels {

// Loss SUM and gradients of that sum (not divided by the count: the step divides by the global count).
// Columns >= vocab_valid are excluded from the softmax and get no gradient (their dw entries are left
// untouched). Targets of counted tokens must be < vocab_valid; targets of ignored tokens are never read.
// dh and dw both null = eval only.
//
// z-loss (PaLM's, MaxText's z_loss_multiplier m >= 0): each counted token also adds m lse^2, lse the
// logsumexp of its logits, summed apart in z_loss_sum; the gradients are of loss_sum + z_loss_sum. As
// d(m lse^2) / d logit_v = 2 m lse softmax_v, a counted row's dlogits are softmax (1 + 2 m lse) - onehot:
// the same pass over the logits with another scale per row. m = 0 gives bitwise the results without it.
//
// vocab_parallel (nullptr = single rank, the whole padded vocabulary is w): vocab_valid stays the GLOBAL
// valid vocabulary size; this rank's valid local columns are [0, clamp(vocab_valid - vocab_offset, 0, V))
// (a rank may have none). Per chunk of rows: local logits -> per-row local maxima (-inf without valid
// columns) -> all_reduce_max(maxima, rows) -> per-row local sums of exp(logit - global max) (0 without
// valid columns) in values[0, rows) and target logits (0 unless the target's global id is in this rank's
// range) in values[rows, 2 * rows) -> all_reduce_sum(values, 2 * rows) -> loss = max + log(sum) - target
// logit per counted row. Both callbacks are called exactly once per chunk, ceil(N / C) chunks (none when
// N == 0), also for chunks without valid local columns or with every row masked, and never inside an
// OpenMP region: the calls match across ranks when every rank passes the same N and C (and the results are
// right when every rank also passes the same h, targets and mask). Results: valid_count is the same on
// every rank, and so is loss_sum when all_reduce_sum gives every rank bitwise the same values; dh is this
// rank's PARTIAL sum dlogits @ W_local^T (the caller all-reduces dh over the tensor ranks); dw is this
// rank's slice, accumulated locally. scratch is the same size as without the option.
UnembedCrossEntropy unembed_cross_entropy;

// dtype=bfloat16: the GEMMs of unembed_cross_entropy take bf16 inputs (W rounded once per call, each chunk's
// h and dlogits per chunk) with float32 accumulation; logits, softmax, loss and gradients stay float32. The
// weight gradient is one product per group of chunks (G = cross_entropy_group_tokens(N, C, V) tokens), dh
// one per chunk. Its bfloat16 elements of scratch for N tokens in chunks of C: W [D, V], a group of h [G, D]
// and of dlogits [G, V], then a float32 block of logits [C, 1024] (the logits GEMM runs 1024 columns at a
// time: faster, see cross_entropy.cpp) and the online softmax's shift per row and block [C, ceil(V / 1024)]:
// the exponentials are taken from each block while it is in cache (OnlineSoftmax in cross_entropy.cpp).
CrossEntropyBf16ScratchElements cross_entropy_bf16_scratch_elements;

// Floats of scratch unembed_cross_entropy needs: one chunk of logits [C, V], C per-row losses in double, and
// the vocab-parallel per-row statistics (C float maxima, 2 * C doubles plus one float to align them; one
// rank keeps its per-row z-losses there). The same size with or without vocab_parallel or the z-loss.
CrossEntropyScratchFloats cross_entropy_scratch_floats;

// Logits for sampling/eval of one or a few rows: out = h @ W (layout as above); padding columns
// (>= vocab_valid) are set to -inf so they can never be sampled.
UnembedLogits unembed_logits;

// Plain reference materialising all logits [N, V]; same semantics as unembed_cross_entropy (mask, padding,
// layouts, dh written, dw accumulated). Templated so tests can run it in double.
template <class T>
CrossEntropySums unembed_cross_entropy_reference(T* dh, T* dw, const T* h, const T* w, UnembedLayout layout,
                                                 const int32_t* targets, const uint8_t* loss_mask, int64_t N,
                                                 int64_t D, int64_t V, int64_t vocab_valid,
                                                 double z_loss_multiplier) {
  MT_CHECK(vocab_valid >= 1 && vocab_valid <= V, "vocab_valid must be in [1, V]");
  // Index of weight (d, v) in either layout.
  const auto weight_index = [&](int64_t d, int64_t v) {
    return layout == UnembedLayout::kernel_DV ? d * V + v : v * D + d;
  };
  std::vector<T> logits(static_cast<size_t>(N * V), -std::numeric_limits<T>::infinity());
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t v = 0; v < vocab_valid; ++v) {
      T sum = 0;
      for (int64_t d = 0; d < D; ++d) sum += h[n * D + d] * w[weight_index(d, v)];
      logits[n * V + v] = sum;
    }
  }
  const T z_multiplier = static_cast<T>(z_loss_multiplier);
  CrossEntropySums sums;
  for (int64_t n = 0; n < N; ++n) {
    if (dh != nullptr) std::fill(dh + n * D, dh + (n + 1) * D, T(0));
    if (loss_mask != nullptr && loss_mask[n] == 0) continue;
    const int32_t target = targets[n];
    MT_CHECK(target >= 0 && target < vocab_valid, "targets are validated by the data path");
    const T* row = logits.data() + n * V;
    const T max_logit = *std::max_element(row, row + vocab_valid);
    T sum_exp = 0;
    for (int64_t v = 0; v < vocab_valid; ++v) sum_exp += std::exp(row[v] - max_logit);
    const T log_sum_exp = max_logit + std::log(sum_exp);
    sums.loss_sum += static_cast<double>(log_sum_exp - row[target]);
    sums.z_loss_sum += static_cast<double>(z_multiplier * log_sum_exp * log_sum_exp);
    sums.valid_count += 1;
    if (dh == nullptr && dw == nullptr) continue;
    for (int64_t v = 0; v < vocab_valid; ++v) {
      // d(lse - logit[target] + m lse^2) / d logit[v] = softmax[v] (1 + 2 m lse) - onehot[v].
      const T dlogit = std::exp(row[v] - log_sum_exp) * (T(1) + T(2) * z_multiplier * log_sum_exp) -
                       (v == target ? T(1) : T(0));
      for (int64_t d = 0; d < D; ++d) {
        if (dh != nullptr) dh[n * D + d] += dlogit * w[weight_index(d, v)];
        if (dw != nullptr) dw[weight_index(d, v)] += dlogit * h[n * D + d];
      }
    }
  }
  return sums;
}

}  // namespace meshtrain::kernels
