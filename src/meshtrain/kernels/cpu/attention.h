// Causal self-attention with grouped-query heads: tiled forward with online softmax, and a backward that
// recomputes scores from q, k and the saved log-sum-exp, so no [S, S] matrix is ever stored. The same
// kernels over separate query and key / value token sets (context_attention_*) serve context parallelism:
// a rank's queries against the gathered keys and values, or against one ring block at a time.
// Legend: B batch, S sequence, Sq query tokens, Skv key / value tokens, H query heads, K kv heads (H
// divisible by K), d head width.
//
// Masking comes from per-token positions and segment ids, not from indices: query i sees key j iff
// segment_ids[b, j] == segment_ids[b, i] and positions[b, j] <= positions[b, i]. Token order in memory is
// therefore free (context-parallel reorders, packed documents). segment_ids == nullptr means one segment.
// Scores are scaled by 1/sqrt(d); query head h reads kv head h / (H / K).
// Every query must see at least one key; the mask above guarantees it (a token always sees itself).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "meshtrain/kernels/signatures.h"

namespace meshtrain::kernels {

// out [B,S,H,d]; lse [B,H,S] = log-sum-exp of the scaled, masked scores of each query (kept for backward);
// q [B,S,H,d]; k, v [B,S,K,d]; positions [B,S]; segment_ids [B,S] or nullptr. Writes out and lse.
// Needs no scratch. Parallel over (batch, head, query tile); results do not depend on the thread count.
AttentionForward attention_forward;

// Writes (=) dq [B,S,H,d], dk [B,S,K,d], dv [B,S,K,d] given dout [B,S,H,d] and the forward's out [B,S,H,d]
// and lse [B,H,S]; other inputs as in attention_forward.
// scratch [attention_backward_scratch_floats(...)] floats, owned by the caller (holds rowsum(dout * out)).
// Deterministic without atomics, and bitwise independent of the thread count (see attention.cpp).
AttentionBackward attention_backward;

// Floats of scratch attention_backward needs: B*H*S (max_threads is accepted for the arena's uniform
// sizing call and does not change the answer).
AttentionBackwardScratchFloats attention_backward_scratch_floats;

// attention_forward needs none: returns 0 (kept so the arena sizes every op the same way).
int64_t attention_forward_scratch_floats(int64_t B, int64_t S, int64_t H, int64_t K, int64_t d,
                                         int max_threads);

// Decode (generation, one new token): appends this token's k, v [K,d] to row `position` of the caches
// key_cache, value_cache [T,K,d] (T > position), then writes out [H,d] = attention of q [H,d] over cache rows
// [0, position]: the causal attention_forward of the last query of a sequence, with earlier rows' keys and
// values kept from earlier calls. Plain single-query loop, forward only (no lse, no backward: nothing
// trains through decoding); softmax shifted by its maximum; scores [position + 1] floats of scratch.
AttentionDecode attention_decode;

// Attention of a query set over a key / value set (context parallelism). Query token i of sequence b sees
// key token j iff kv_segment_ids[b, j] == q_segment_ids[b, i] and kv_positions[b, j] <= q_positions[b, i]:
// positions and segment ids are the ORIGINAL ones that travel with the tokens, so any reorder works.
// Segment ids are given for both sets or for neither (one segment). attention_forward is this kernel with
// the query set equal to the key / value set.
//
// Under context parallelism with C ranks, a rank's Sq = S / C queries run
//   - all-gather: against the gathered Skv = S keys and values in one call (accumulate = false);
//   - ring: against one block of keys and values per call, accumulate = false for the first block and true
//     for each later one. The merge is exact (see below), so the result equals the all-gather one to
//     float32 rounding, whatever the block order.
//
// A query that sees no key gets out = 0 and lse = -inf (no NaN), and zero gradients in the backward.
//
// out [B,Sq,H,d]; lse [B,H,Sq] (the layout attention_forward keeps); q [B,Sq,H,d]; k, v [B,Skv,K,d];
// q_positions, q_segment_ids [B,Sq]; kv_positions, kv_segment_ids [B,Skv]; segment ids may be nullptr.
// accumulate = false: writes out and lse from this key / value set alone.
// accumulate = true: (out, lse) already hold the normalised result over earlier key / value sets and this
// set is folded in by online-softmax rescaling: the running max restarts at lse with a running sum of 1
// and out as the accumulator, which is the same recurrence the kernel runs from one 64-key tile to the
// next (so it is exact: lse' = log(exp(lse) + exp(lse_block)), out' = (exp(lse) out + exp(lse_block)
// out_block) / exp(lse'), as context_attention_reference_merge computes it).
// Needs no scratch; parallel over (batch, head, query tile); results do not depend on the thread count.
ContextAttentionForward context_attention_forward;

// Backward of context_attention_forward over this key / value set, given the FINAL out [B,Sq,H,d] and
// lse [B,H,Sq] (over every key the queries see, e.g. after the last ring block) and dout [B,Sq,H,d]:
// the standard flash-attention backward, P = exp(scale q k^T - lse), D = rowsum(dout * out),
// dS = P (dout v^T - D), with the same P and D for every block, so per-block gradients add up to the
// whole set's.
// dq [B,Sq,H,d]; dk, dv [B,Skv,K,d] (gradients of this key / value set only).
// accumulate = false: writes (=) dq, dk, dv. accumulate = true: adds (+=) to all three; the ring zeroes dq
// once and adds each block's share into it, and adds into the dk / dv buffer that travels with the block.
// Under all-gather, dk / dv of the gathered set hold this rank's queries' share of every token's gradient:
// the caller reduce-scatters them over the context axis.
// scratch [context_attention_backward_scratch_floats(B, Sq, H)] floats (holds D). Deterministic without
// atomics, bitwise independent of the thread count.
ContextAttentionBackward context_attention_backward;

// Floats of scratch context_attention_backward needs: B*H*Sq.
ContextAttentionBackwardScratchFloats context_attention_backward_scratch_floats;

// The four kernels above, as a set, with their matrix products of one kind:
// - float32: the entries above.
// - avx512_bf16 (dtype=bfloat16; needs AVX512-BF16, vdpbf16ps): every product in bf16 (q, k, v, dout stay
//   float32 in memory and are rounded to bf16 as tiles are packed; P and dS are rounded to bf16 for the
//   products that take them; each product accumulates in float32, and the softmax statistics, lse and
//   rowsum(dout * out) stay float32). Any head width and sequence length (attention.cpp, "bf16 products").
// - amx (dtype=bfloat16 on CPUs with AMX-BF16, and AVX512-BF16 to pack): the same rounding points with the
//   products on AMX tiles (_tile_dpbf16ps, float32 accumulation). Each thread keeps bf16 copies of the token
//   tiles it packed for the whole call (linear in S; attention.cpp, "bf16 products on AMX tiles"). Its
//   softmax runs in base 2 (2^(log2(e) x), a vscalefps exp2) and the forward moves a running max only past
//   a slack of 2^8, so its float32 arithmetic differs from the other kinds' in the last bits.
// Every kind takes the same arguments, layouts, masks, scratch and accumulate semantics, and is
// deterministic and bitwise independent of the thread count; each checks at run time that the CPU can run
// it. The cpu table picks the kind it runs under dtype=bfloat16 (cpu/backend.cpp). In the backward every
// kind accumulates dq in a contiguous copy per thread and writes it to dq once: in the owner schedule the
// rows of its kv head's query heads (group x S x d floats, S rounded up to 64 and, on AMX, d to 16: linear
// in S), in the split schedule one head's (attention.cpp, "Work split and determinism").
enum class AttentionProducts { float32, avx512_bf16, amx };
AttentionKernels attention_kernels_with(AttentionProducts products);

namespace attention_detail {

// The mask rule of the references: may query i (of q_positions / q_segment_ids) see key j (of
// kv_positions / kv_segment_ids)? Segment ids are both given or both nullptr.
inline bool visible(const int32_t* q_positions, const int32_t* q_segment_ids, int64_t i,
                    const int32_t* kv_positions, const int32_t* kv_segment_ids, int64_t j) {
  if (q_segment_ids != nullptr && kv_segment_ids[j] != q_segment_ids[i]) return false;
  return kv_positions[j] <= q_positions[i];
}

// The query set and the key / value set of the kernels and the references: self-attention passes the same
// positions and segment ids for both (Sq = Skv = S); context parallelism passes a rank's queries and the
// gathered (or one ring block of) keys and values.
struct TokenSets {
  const int32_t* q_positions;     // [B, Sq]
  const int32_t* q_segment_ids;   // [B, Sq] or nullptr
  const int32_t* kv_positions;    // [B, Skv]
  const int32_t* kv_segment_ids;  // [B, Skv] or nullptr
  int64_t Sq, Skv;

  // The references' mask: may query i see key j, both of sequence b?
  bool sees(int64_t b, int64_t i, int64_t j) const {
    return visible(q_positions, q_segment_ids, b * Sq + i, kv_positions, kv_segment_ids, b * Skv + j);
  }
};

template <class T>
T dot(const T* a, const T* b, int64_t d) {
  T total = T(0);
  for (int64_t c = 0; c < d; ++c) total += a[c] * b[c];
  return total;
}

}  // namespace attention_detail

// Plain O(S^2) reference (recomputes every score; no tiling; defined below as the one-token-set case of
// context_attention_reference_forward). Same layouts and outputs as attention_forward; templated so tests
// run it in double.
// out [B,S,H,d]; lse [B,H,S]; q [B,S,H,d]; k, v [B,S,K,d]; positions [B,S]; segment_ids [B,S] or nullptr.
template <class T>
void attention_reference_forward(T* out, T* lse, const T* q, const T* k, const T* v, const int32_t* positions,
                                 const int32_t* segment_ids, int64_t B, int64_t S, int64_t H, int64_t K,
                                 int64_t d);

// Reference backward: writes (=) dq [B,S,H,d], dk, dv [B,S,K,d] from dout [B,S,H,d], out [B,S,H,d] and
// lse [B,H,S] of attention_reference_forward (or attention_forward); other inputs as there.
// With P = softmax probabilities and D_i = dout_i . out_i: dv_j += P_ij dout_i, dS_ij = P_ij (dout_i . v_j -
// D_i), dq_i += scale dS_ij k_j, dk_j += scale dS_ij q_i.
template <class T>
void attention_reference_backward(T* dq, T* dk, T* dv, const T* dout, const T* out, const T* lse, const T* q,
                                  const T* k, const T* v, const int32_t* positions,
                                  const int32_t* segment_ids, int64_t B, int64_t S, int64_t H, int64_t K,
                                  int64_t d);

// Plain reference of context_attention_forward (accumulate = false): out [B,Sq,H,d]; lse [B,H,Sq];
// q [B,Sq,H,d]; k, v [B,Skv,K,d]; q_positions, q_segment_ids [B,Sq]; kv_positions, kv_segment_ids [B,Skv]
// (segment ids both nullptr or both given). A query that sees no key gets out = 0, lse = -inf.
template <class T>
void context_attention_reference_forward(T* out, T* lse, const T* q, const T* k, const T* v,
                                         const int32_t* q_positions, const int32_t* q_segment_ids,
                                         const int32_t* kv_positions, const int32_t* kv_segment_ids,
                                         int64_t B, int64_t Sq, int64_t Skv, int64_t H, int64_t K,
                                         int64_t d) {
  const attention_detail::TokenSets sets{q_positions, q_segment_ids, kv_positions, kv_segment_ids, Sq, Skv};
  using attention_detail::dot;
  const T scale = T(1) / std::sqrt(static_cast<T>(d));
  const int64_t group = H / K;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / group;
      for (int64_t i = 0; i < Sq; ++i) {
        const T* qi = q + ((b * Sq + i) * H + h) * d;
        T* oi = out + ((b * Sq + i) * H + h) * d;
        T row_max = -std::numeric_limits<T>::infinity();
        for (int64_t j = 0; j < Skv; ++j) {
          if (!sets.sees(b, i, j)) continue;
          row_max = std::max(row_max, scale * dot(qi, k + ((b * Skv + j) * K + g) * d, d));
        }
        T sum = T(0);
        for (int64_t c = 0; c < d; ++c) oi[c] = T(0);
        for (int64_t j = 0; j < Skv; ++j) {
          if (!sets.sees(b, i, j)) continue;
          const T p = std::exp(scale * dot(qi, k + ((b * Skv + j) * K + g) * d, d) - row_max);
          sum += p;
          const T* vj = v + ((b * Skv + j) * K + g) * d;
          for (int64_t c = 0; c < d; ++c) oi[c] += p * vj[c];
        }
        if (sum == T(0)) {  // no visible key
          lse[(b * H + h) * Sq + i] = -std::numeric_limits<T>::infinity();
          continue;
        }
        for (int64_t c = 0; c < d; ++c) oi[c] /= sum;
        lse[(b * H + h) * Sq + i] = row_max + std::log(sum);
      }
    }
  }
}

// Reference of the ring merge: folds a block's normalised partial result (block_out [B,Sq,H,d], block_lse
// [B,H,Sq]) into the running one (out, lse) of the same queries: lse' = log(exp(lse) + exp(block_lse)),
// out' = exp(lse - lse') out + exp(block_lse - lse') block_out. Two -inf lse stay (0, -inf).
template <class T>
void context_attention_reference_merge(T* out, T* lse, const T* block_out, const T* block_lse, int64_t B,
                                       int64_t Sq, int64_t H, int64_t d) {
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t i = 0; i < Sq; ++i) {
        T& running = lse[(b * H + h) * Sq + i];
        const T block = block_lse[(b * H + h) * Sq + i];
        const T high = std::max(running, block);
        if (high == -std::numeric_limits<T>::infinity()) continue;  // neither has seen a key
        const T merged = high + std::log(std::exp(running - high) + std::exp(block - high));
        const T keep = std::exp(running - merged), add = std::exp(block - merged);
        T* oi = out + ((b * Sq + i) * H + h) * d;
        const T* bi = block_out + ((b * Sq + i) * H + h) * d;
        for (int64_t c = 0; c < d; ++c) oi[c] = keep * oi[c] + add * bi[c];
        running = merged;
      }
    }
  }
}

// Reference backward of context_attention_forward: writes (=) dq [B,Sq,H,d], dk, dv [B,Skv,K,d] from
// dout [B,Sq,H,d] and the final out [B,Sq,H,d], lse [B,H,Sq]; other inputs as in the forward. Run over one
// block of keys and values with the final out and lse of the whole set, it gives that block's share (the
// dq shares of the blocks add up to dq). Same formulas as attention_reference_backward.
template <class T>
void context_attention_reference_backward(T* dq, T* dk, T* dv, const T* dout, const T* out, const T* lse,
                                          const T* q, const T* k, const T* v, const int32_t* q_positions,
                                          const int32_t* q_segment_ids, const int32_t* kv_positions,
                                          const int32_t* kv_segment_ids, int64_t B, int64_t Sq, int64_t Skv,
                                          int64_t H, int64_t K, int64_t d) {
  const attention_detail::TokenSets sets{q_positions, q_segment_ids, kv_positions, kv_segment_ids, Sq, Skv};
  using attention_detail::dot;
  const T scale = T(1) / std::sqrt(static_cast<T>(d));
  const int64_t group = H / K;
  for (int64_t index = 0; index < B * Sq * H * d; ++index) dq[index] = T(0);
  for (int64_t index = 0; index < B * Skv * K * d; ++index) dk[index] = dv[index] = T(0);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / group;
      for (int64_t i = 0; i < Sq; ++i) {
        const int64_t row = ((b * Sq + i) * H + h) * d;
        const T row_dot = dot(dout + row, out + row, d);
        const T row_lse = lse[(b * H + h) * Sq + i];
        for (int64_t j = 0; j < Skv; ++j) {
          if (!sets.sees(b, i, j)) continue;
          const int64_t kv_row = ((b * Skv + j) * K + g) * d;
          const T p = std::exp(scale * dot(q + row, k + kv_row, d) - row_lse);
          const T ds = p * (dot(dout + row, v + kv_row, d) - row_dot);
          for (int64_t c = 0; c < d; ++c) {
            dv[kv_row + c] += p * dout[row + c];
            dq[row + c] += scale * ds * k[kv_row + c];
            dk[kv_row + c] += scale * ds * q[row + c];
          }
        }
      }
    }
  }
}

// Self-attention is the context reference with one token set for both queries and keys (every query sees
// at least itself, so no row is empty).
template <class T>
void attention_reference_forward(T* out, T* lse, const T* q, const T* k, const T* v, const int32_t* positions,
                                 const int32_t* segment_ids, int64_t B, int64_t S, int64_t H, int64_t K,
                                 int64_t d) {
  context_attention_reference_forward(out, lse, q, k, v, positions, segment_ids, positions, segment_ids, B, S,
                                      S, H, K, d);
}

template <class T>
void attention_reference_backward(T* dq, T* dk, T* dv, const T* dout, const T* out, const T* lse, const T* q,
                                  const T* k, const T* v, const int32_t* positions,
                                  const int32_t* segment_ids, int64_t B, int64_t S, int64_t H, int64_t K,
                                  int64_t d) {
  context_attention_reference_backward(dq, dk, dv, dout, out, lse, q, k, v, positions, segment_ids, positions,
                                       segment_ids, B, S, S, H, K, d);
}

}  // namespace meshtrain::kernels
