// The signature of every kernel of the backend table, written once: one function type per entry, with the
// shape of every pointer argument. The table (backend.h) holds pointers of these types, and each backend's
// headers (cpu/<op>.h, cuda/<op>.h) declare their functions by them (`RmsnormForward rmsnorm_forward;`), so
// a signature changed here is changed for every backend, and a definition that drifts from it is a compile
// or link error. What each kernel computes is summed up per op here and documented in full in the cpu
// header of the op, which every backend matches.
// Legend: N tokens, B batch, S sequence, D width, H query heads, K kv heads, d head width, I / O matmul input
// / output width, R embedding rows held here, V vocab (padded, per rank), C cross-entropy chunk of tokens, T
// decode cache rows, count elements of an elementwise op; for the mixture-of-experts entries E routed
// experts, k experts per token, M = N k assignments, R_moe = offsets[E] kept (sorted) assignment rows; for
// Engram and mHC G streams and H_e an Engram layer's table heads, and for short_conv B rows, T times, C
// channels, K taps.
#pragma once

#include <cstdint>

#include "meshtrain/kernels/arguments.h"

namespace meshtrain::kernels {

// matmul.h: out = x @ w + bias; dx = (or +=) dout @ w^T, dw += x^T @ dout, dbias += column sums. With
// bf16_inputs (dtype=bfloat16: [matmul_bf16_scratch_elements(N, I, O, x_is_bf16)] bfloat16 scratch) the
// GEMMs take x, w and dout rounded to bf16 there, accumulating in f32; the _bf16_x entries take x already
// rounded (matmul_input_dtype).
using MatmulForward = void(float* out,         // [N, O]
                           const float* x,     // [N, I]
                           const float* w,     // [I, O]
                           const float* bias,  // [O] or nullptr
                           int64_t N, int64_t I, int64_t O,
                           uint16_t* bf16_inputs);  // bf16 scratch, or nullptr (float32 GEMMs)
using MatmulForwardBf16X = void(float* out,         // [N, O]
                                const uint16_t* x,  // [N, I] bfloat16 bits
                                const float* w,     // [I, O]
                                const float* bias,  // [O] or nullptr
                                int64_t N, int64_t I, int64_t O,
                                uint16_t* bf16_inputs);  // bf16 scratch

using MatmulBackward = void(float* dx,          // [N, I] or nullptr
                            float* dw,          // [I, O] or nullptr
                            float* dbias,       // [O] or nullptr
                            const float* dout,  // [N, O]
                            const float* x,     // [N, I]
                            const float* w,     // [I, O]
                            int64_t N, int64_t I, int64_t O, bool accumulate_dx,
                            uint16_t* bf16_inputs);  // bf16 scratch, or nullptr (float32 GEMMs)
using MatmulBackwardBf16X = void(float* dx,          // [N, I] or nullptr
                                 float* dw,          // [I, O] or nullptr
                                 float* dbias,       // [O] or nullptr
                                 const float* dout,  // [N, O]
                                 const uint16_t* x,  // [N, I] bfloat16 bits
                                 const float* w,     // [I, O]
                                 int64_t N, int64_t I, int64_t O, bool accumulate_dx,
                                 uint16_t* bf16_inputs);  // bf16 scratch
using MatmulBf16ScratchElements = int64_t(int64_t N, int64_t I, int64_t O, bool x_is_bf16);

// residual.h: out += x.
using ResidualAdd = void(float* out,      // [count]
                         const float* x,  // [count]
                         int64_t count);

// embedding.h: out = (or +=) table[ids - vocab_offset]; dtable[ids - vocab_offset] += dout. global_rows <
// 0: vocab_offset + R.
using EmbeddingForward = void(float* out,          // [N, D]
                              const int32_t* ids,  // [N]
                              const float* table,  // [R, D]
                              int64_t N, int64_t R, int64_t D, bool accumulate, int64_t vocab_offset,
                              int64_t global_rows);
using EmbeddingBackward = void(float* dtable,       // [R, D]
                               const int32_t* ids,  // [N]
                               const float* dout,   // [N, D]
                               int64_t N, int64_t R, int64_t D, int64_t vocab_offset, int64_t global_rows);

// cross_entropy.h: fused unembedding + softmax cross-entropy (loss sum, z-loss sum; dh written, dw
// accumulated), its scratch size, and plain logits for decoding (padding columns -inf).
using UnembedCrossEntropy =
    CrossEntropySums(float* dh,       // [N, D] WRITTEN (=), or nullptr
                     float* dw,       // layout of w, ACCUMULATED (+=), or nullptr
                     const float* h,  // [N, D]
                     const float* w,  // [D, V] kernel_DV or [V, D] table_VD
                     UnembedLayout layout,
                     const int32_t* targets,    // [N] global ids
                     const uint8_t* loss_mask,  // [N] 1 = counts, 0 = ignored; nullptr = all
                     int64_t N, int64_t D, int64_t V, int64_t vocab_valid,
                     double z_loss_multiplier,             // m >= 0: adds m lse^2 per counted token; 0 none
                     int64_t chunk_tokens,                 // C: rows of logits held at a time
                     float* scratch,                       // [cross_entropy_scratch_floats(C, V)]
                     const VocabParallel* vocab_parallel,  // nullptr: one rank
                     uint16_t* bf16_inputs);  // [cross_entropy_bf16_scratch_elements(N, C, D, V)] or nullptr
using CrossEntropyScratchFloats = int64_t(int64_t chunk_tokens, int64_t V);
using CrossEntropyBf16ScratchElements = int64_t(int64_t N, int64_t chunk_tokens, int64_t D, int64_t V);
using UnembedLogits = void(float* out,      // [N, V]
                           const float* h,  // [N, D]
                           const float* w,  // [D, V] kernel_DV or [V, D] table_VD
                           UnembedLayout layout, int64_t N, int64_t D, int64_t V, int64_t vocab_valid);

// rmsnorm.h: saves rstd; dx = (or +=) dL/dx, dw += dL/dw. The _bf16 forwards of this, layernorm, swiglu and
// gelu write out rounded to bf16 (matmul_input_dtype).
using RmsnormForward = void(float* out,      // [N, D]
                            float* rstd,     // [N]
                            const float* x,  // [N, D]
                            const float* w,  // [D]
                            int64_t N, int64_t D, float eps);
// RmsnormForward with out [N, D] in bfloat16 bits.
using RmsnormForwardBf16 = void(uint16_t* out, float* rstd, const float* x, const float* w, int64_t N,
                                int64_t D, float eps);
using RmsnormBackward = void(float* dx,          // [N, D]
                             float* dw,          // [D]
                             const float* dout,  // [N, D]
                             const float* x,     // [N, D]
                             const float* w,     // [D]
                             const float* rstd,  // [N] from the forward
                             int64_t N, int64_t D, bool accumulate_dx);

// Per-stream scales (Engram, mHC): G rows of width D per token, stream g scaled by w[g].
using RmsnormStreamsForward = void(float* out,      // [N, G, D]
                                   float* rstd,     // [N, G]
                                   const float* x,  // [N, G, D]
                                   const float* w,  // [G, D]
                                   int64_t N, int64_t G, int64_t D, float eps);
using RmsnormStreamsBackward = void(float* dx,          // [N, G, D]
                                    float* dw,          // [G, D]
                                    const float* dout,  // [N, G, D]
                                    const float* x,     // [N, G, D]
                                    const float* w,     // [G, D]
                                    const float* rstd,  // [N, G] from the forward
                                    int64_t N, int64_t G, int64_t D, bool accumulate_dx);

// layernorm.h: saves mean and rstd; dx = (or +=) dL/dx, dw += dL/dw, db += dL/db.
using LayernormForward = void(float* out,      // [N, D]
                              float* mean,     // [N]
                              float* rstd,     // [N]
                              const float* x,  // [N, D]
                              const float* w,  // [D]
                              const float* b,  // [D]
                              int64_t N, int64_t D, float eps);
// LayernormForward with out [N, D] in bfloat16 bits.
using LayernormForwardBf16 = void(uint16_t* out, float* mean, float* rstd, const float* x, const float* w,
                                  const float* b, int64_t N, int64_t D, float eps);
using LayernormBackward = void(float* dx,          // [N, D]
                               float* dw,          // [D]
                               float* db,          // [D]
                               const float* dout,  // [N, D]
                               const float* x,     // [N, D]
                               const float* w,     // [D]
                               const float* mean,  // [N] from the forward
                               const float* rstd,  // [N] from the forward
                               int64_t N, int64_t D, bool accumulate_dx);

// swiglu.h: out = silu(gate) * up; dgate, dup written.
using SwigluForward = void(float* out,         // [count]
                           const float* gate,  // [count]
                           const float* up,    // [count]
                           int64_t count);
// SwigluForward with out [count] in bfloat16 bits.
using SwigluForwardBf16 = void(uint16_t* out, const float* gate, const float* up, int64_t count);
using SwigluBackward = void(float* dgate,       // [count]
                            float* dup,         // [count]
                            const float* dout,  // [count]
                            const float* gate,  // [count]
                            const float* up,    // [count]
                            int64_t count);

// gelu.h: tanh-approximated GELU; dx written.
using GeluForward = void(float* out,      // [count]
                         const float* x,  // [count]
                         int64_t count);
// GeluForward with out [count] in bfloat16 bits.
using GeluForwardBf16 = void(uint16_t* out, const float* x, int64_t count);
using GeluBackward = void(float* dx,          // [count]
                          const float* dout,  // [count]
                          const float* x,     // [count]
                          int64_t count);

// rope.h: rotary embedding by per-token positions; out may alias x, dx may alias dout.
using RopeForward = void(float* out,                // [N, H, d]
                         const float* x,            // [N, H, d]
                         const int32_t* positions,  // [N]
                         int64_t N, int64_t H, int64_t d, float theta);
using RopeBackward = void(float* dx,                 // [N, H, d]
                          const float* dout,         // [N, H, d]
                          const int32_t* positions,  // [N]
                          int64_t N, int64_t H, int64_t d, float theta);

// column_slice.h: W columns of each of R rows copied to `repeat` rows of out (x nullptr: zeros), and the
// transpose, which writes each dx row as the sum of its `repeat` dout rows; strides are row widths.
using ColumnSliceForward = void(float* out,      // [R * repeat rows of out_stride], W columns written
                                const float* x,  // [R rows of x_stride], W columns read, or nullptr
                                int64_t R, int64_t W, int64_t repeat, int64_t out_stride, int64_t x_stride);
using ColumnSliceBackward = void(float* dx,          // [R rows of dx_stride], W columns written
                                 const float* dout,  // [R * repeat rows of dout_stride], W columns read
                                 int64_t R, int64_t W, int64_t repeat, int64_t dx_stride,
                                 int64_t dout_stride);

// attention.h: causal grouped-query attention masked by positions and segment ids; the backward writes
// dq, dk, dv and needs attention_backward_scratch_floats(...) floats of scratch.
// Shapes: q, out, dq, dout [B, S, H, d]; k, v, dk, dv [B, S, K, d]; lse [B, H, S]; positions [B, S];
// segment_ids [B, S] or nullptr (one segment).
using AttentionForward = void(float* out, float* lse, const float* q, const float* k, const float* v,
                              const int32_t* positions, const int32_t* segment_ids, int64_t B, int64_t S,
                              int64_t H, int64_t K, int64_t d);
using AttentionBackward = void(float* dq, float* dk, float* dv, const float* dout, const float* out,
                               const float* lse, const float* q, const float* k, const float* v,
                               const int32_t* positions, const int32_t* segment_ids, int64_t B, int64_t S,
                               int64_t H, int64_t K, int64_t d, float* scratch);
using AttentionBackwardScratchFloats = int64_t(int64_t B, int64_t S, int64_t H, int64_t K, int64_t d,
                                               int max_threads);

// attention.h, context parallelism: a rank's Sq queries against another key / value set of Skv tokens (e.g.
// the whole sequence gathered over mesh.context), masked by both sets' positions and segment ids; forward
// writes (or, accumulate, merges into) out and lse; backward writes (or adds) dq and the dk, dv of the
// key / value set, with context_attention_backward_scratch_floats(B, Sq, H) floats of scratch.
// Shapes: q, out, dq, dout [B, Sq, H, d]; k, v, dk, dv [B, Skv, K, d]; lse [B, H, Sq]; q_positions,
// q_segment_ids [B, Sq]; kv_positions, kv_segment_ids [B, Skv]; segment ids both given or both nullptr.
using ContextAttentionForward = void(float* out, float* lse, const float* q, const float* k, const float* v,
                                     const int32_t* q_positions, const int32_t* q_segment_ids,
                                     const int32_t* kv_positions, const int32_t* kv_segment_ids, int64_t B,
                                     int64_t Sq, int64_t Skv, int64_t H, int64_t K, int64_t d,
                                     bool accumulate);
using ContextAttentionBackward = void(float* dq, float* dk, float* dv, const float* dout, const float* out,
                                      const float* lse, const float* q, const float* k, const float* v,
                                      const int32_t* q_positions, const int32_t* q_segment_ids,
                                      const int32_t* kv_positions, const int32_t* kv_segment_ids, int64_t B,
                                      int64_t Sq, int64_t Skv, int64_t H, int64_t K, int64_t d,
                                      bool accumulate, float* scratch);
using ContextAttentionBackwardScratchFloats = int64_t(int64_t B, int64_t Sq, int64_t H);

// The four attention kernels of one kind (float32, or one kind of bf16 products) as a set.
struct AttentionKernels {
  AttentionForward* forward;
  AttentionBackward* backward;
  ContextAttentionForward* context_forward;
  ContextAttentionBackward* context_backward;
};

// attention.h, decoding: one new token's k, v appended to the caches at row `position`, its q attending over
// rows [0, position].
using AttentionDecode = void(float* out,          // [H, d]
                             float* key_cache,    // [T, K, d]
                             float* value_cache,  // [T, K, d]
                             float* scores,       // [position + 1]
                             const float* q,      // [H, d]
                             const float* k,      // [K, d]
                             const float* v,      // [K, d]
                             int64_t position, int64_t H, int64_t K, int64_t d);

// moe_router.h: scores, top-k choice (selection_bias orders only) and weights (=); d_logits (=) from
// d_weights; the load-balance loss and its gradient (d_logits +=).
using MoeRouterForward = void(int32_t* chosen,              // [N, k]
                              float* weights,               // [N, k]
                              float* scores,                // [N, E] saved for the backward
                              const float* logits,          // [N, E]
                              const float* selection_bias,  // [E] or nullptr
                              int64_t N, int64_t E, const MoeRouting& routing);
using MoeRouterBackward = void(float* d_logits,         // [N, E]
                               const float* d_weights,  // [N, k]
                               const float* scores,     // [N, E] from the forward
                               const int32_t* chosen,   // [N, k] from the forward
                               int64_t N, int64_t E, const MoeRouting& routing);
using MoeBalanceLossForward = double(const float* scores,    // [N, E]
                                     const int32_t* counts,  // [E]
                                     int64_t N, int64_t E, RouterScore score_function, float weight);
using MoeBalanceLossBackward = void(float* d_logits,        // [N, E]
                                    const float* scores,    // [N, E]
                                    const int32_t* counts,  // [E]
                                    int64_t N, int64_t E, RouterScore score_function, float weight,
                                    float d_loss);

// moe_dispatch.h: the routing plan (assignments sorted by expert, capacity dropping; returns the dropped
// count), gather into sorted rows (a zero row for index -1; d_x = or +=), weighted combine back to tokens
// (out = or +=; d_y_sorted and d_weights =).
using MoeRoutePlan = int64_t(int32_t* counts,        // [E]
                             int32_t* offsets,       // [E + 1]
                             int32_t* sorted,        // [M]
                             int32_t* position,      // [M]
                             int32_t* assigned,      // [E] or nullptr
                             const int32_t* chosen,  // [N, k] expert ids in [0, E)
                             int64_t N, int64_t k, int64_t E, int64_t capacity);
// Expert parallelism's block layouts (P expert ranks, E_l local experts, B_c block rows).
using MoeDispatchPlan = void(int32_t* send_sorted,    // [P B_c]
                             int32_t* send_position,  // [M]
                             int32_t* send_counts,    // [P, E_l]
                             const int32_t* offsets,  // [E + 1]
                             const int32_t* sorted,   // [M]
                             int64_t M, int64_t E, int64_t P, int64_t block_rows);
using MoeReceivePlan = void(int32_t* local_offsets,          // [E_l + 1]
                            int32_t* local_sorted,           // [P B_c]
                            int32_t* received_position,      // [P B_c]
                            const int32_t* received_counts,  // [P, E_l]
                            int64_t P, int64_t E_local, int64_t block_rows);
using MoeGatherForward = void(float* sorted_x,        // [R_moe, D]
                              const float* x,         // [N, D]
                              const int32_t* sorted,  // [M]
                              int64_t R, int64_t k, int64_t D);
using MoeGatherBackward = void(float* d_x,               // [N, D]
                               const float* d_sorted_x,  // [R_moe, D]
                               const int32_t* position,  // [M]
                               int64_t N, int64_t k, int64_t D, bool accumulate);
using MoeCombineForward = void(float* out,               // [N, D]
                               const float* y_sorted,    // [R_moe, D]
                               const float* weights,     // [N, k]
                               const int32_t* position,  // [M]
                               int64_t N, int64_t k, int64_t D, bool accumulate);
using MoeCombineBackward = void(float* d_y_sorted,        // [R_moe, D]
                                float* d_weights,         // [N, k]
                                const float* d_out,       // [N, D]
                                const float* y_sorted,    // [R_moe, D]
                                const float* weights,     // [N, k]
                                const int32_t* position,  // [M]
                                int64_t N, int64_t k, int64_t D);

// grouped_matmul.h: per expert segment of sorted rows, out = x @ w[e]; d_x = d_out @ w[e]^T, d_w[e] +=.
using GroupedMatmulForward = void(float* out,              // [R_moe, O]
                                  const float* x,          // [R_moe, I]
                                  const float* w,          // [E, I, O]
                                  const int32_t* offsets,  // [E + 1]
                                  int64_t E, int64_t I, int64_t O);
using GroupedMatmulBackward = void(float* d_x,              // [R_moe, I] or nullptr
                                   float* d_w,              // [E, I, O] or nullptr
                                   const float* d_out,      // [R_moe, O]
                                   const float* x,          // [R_moe, I]
                                   const float* w,          // [E, I, O]
                                   const int32_t* offsets,  // [E + 1]
                                   int64_t E, int64_t I, int64_t O);

// Engram (shared/specs/engram.md). engram_table.h: each token's hash ids as rows of the layer's flat table
// (its heads' tables one after another), rows[n, i] = ids[n, i] + head_offsets[i]; the table read itself is
// embedding_forward / _backward over those rows.
using EngramTableRows = void(int32_t* rows,                // [N, H_e]
                             const int32_t* ids,           // [N, H_e]
                             const int32_t* head_offsets,  // [H_e] in HOST memory: the layer's constants
                             int64_t N, int64_t heads);

// engram_gate.h: gate_g = sigmoid(signed sqrt(<q_g, k_g> / sqrt(D))),
// gated_g = gate_g v; d_q, d_k, d_v written.
using EngramGateForward = void(float* gated,    // [N, G, D]
                               float* gate,     // [N, G] saved for the backward
                               const float* q,  // [N, G, D]
                               const float* k,  // [N, G, D]
                               const float* v,  // [N, D]
                               int64_t N, int64_t G, int64_t D);
using EngramGateBackward = void(float* d_q,            // [N, G, D]
                                float* d_k,            // [N, G, D]
                                float* d_v,            // [N, D]
                                const float* d_gated,  // [N, G, D]
                                const float* gate,     // [N, G]
                                const float* q,        // [N, G, D]
                                const float* k,        // [N, G, D]
                                const float* v,        // [N, D]
                                int64_t N, int64_t G, int64_t D);

// short_conv.h: the causal depthwise convolution of dilation `dilation` over a stretch of T times, times
// before it read `halo` (nullptr: zeros); d_u, d_halo written, d_w accumulated. Then out = x + gated +
// silu(y) and its backward (d_gated, d_y written).
using ShortConvForward = void(float* y,           // [B, T, C]
                              const float* u,     // [B, T, C]
                              const float* halo,  // [B, (K - 1) dilation, C] or nullptr (zeros)
                              const float* w,     // [K, C]
                              int64_t B, int64_t T, int64_t C, int64_t K, int64_t dilation);
using ShortConvBackward = void(float* d_u,         // [B, T, C]
                               float* d_halo,      // [B, (K - 1) dilation, C] or nullptr
                               float* d_w,         // [K, C]
                               const float* d_y,   // [B, T, C]
                               const float* u,     // [B, T, C]
                               const float* halo,  // [B, (K - 1) dilation, C] or nullptr
                               const float* w,     // [K, C]
                               int64_t B, int64_t T, int64_t C, int64_t K, int64_t dilation);
using ShortConvOutputForward = void(float* out,          // [count]
                                    const float* x,      // [count] the residual stream
                                    const float* gated,  // [count]
                                    const float* y,      // [count] the convolution
                                    int64_t count);
using ShortConvOutputBackward = void(float* d_gated,      // [count]
                                     float* d_y,          // [count]
                                     const float* d_out,  // [count]
                                     const float* y,      // [count]
                                     int64_t count);

// mHC (shared/specs/mhc.md). mhc_mix.h: a site's coefficients (pre, post, mixing logits) from its
// projection h; the collapse of the streams into the sublayer's input and the expand of its output; the
// streams' entry (repeat) and exit (sum).
using MhcCoefficientsForward = void(float* pre,              // [N, G]
                                    float* post,             // [N, G]
                                    float* logits,           // [N, G, G]
                                    const float* h,          // [N, 2G + G^2]
                                    const float* scales,     // [3]
                                    const float* pre_beta,   // [G]
                                    const float* post_beta,  // [G]
                                    const float* res_beta,   // [G, G]
                                    int64_t N, int64_t G);
using MhcCoefficientsBackward = void(float* d_h,              // [N, 2G + G^2] written
                                     float* d_scales,         // [3] +=
                                     float* d_pre_beta,       // [G] +=
                                     float* d_post_beta,      // [G] +=
                                     float* d_res_beta,       // [G, G] +=
                                     const float* d_pre,      // [N, G]
                                     const float* d_post,     // [N, G]
                                     const float* d_logits,   // [N, G, G]
                                     const float* h,          // [N, 2G + G^2]
                                     const float* scales,     // [3]
                                     const float* pre_beta,   // [G]
                                     const float* post_beta,  // [G]
                                     int64_t N, int64_t G);
using MhcCollapseForward = void(float* xin,        // [N, D]
                                const float* x,    // [N, G, D]
                                const float* pre,  // [N, G]
                                int64_t N, int64_t G, int64_t D);
using MhcCollapseBackward = void(float* d_x,          // [N, G, D] +=
                                 float* d_pre,        // [N, G] written
                                 const float* d_xin,  // [N, D]
                                 const float* x,      // [N, G, D]
                                 const float* pre,    // [N, G]
                                 int64_t N, int64_t G, int64_t D);
using MhcExpandForward = void(float* out,           // [N, G, D]
                              const float* x,       // [N, G, D]
                              const float* mixing,  // [N, G, G]
                              const float* post,    // [N, G]
                              const float* o,       // [N, D]
                              int64_t N, int64_t G, int64_t D);
using MhcExpandBackward = void(float* d_x,           // [N, G, D] written
                               float* d_mixing,      // [N, G, G] written
                               float* d_post,        // [N, G] written
                               float* d_o,           // [N, D] written
                               const float* d_out,   // [N, G, D]
                               const float* x,       // [N, G, D]
                               const float* mixing,  // [N, G, G]
                               const float* post,    // [N, G]
                               const float* o,       // [N, D]
                               int64_t N, int64_t G, int64_t D);
using MhcStreamsRepeat = void(float* out,      // [N, G, D]
                              const float* x,  // [N, D]
                              int64_t N, int64_t G, int64_t D);
using MhcStreamsSum = void(float* out,      // [N, D]
                           const float* x,  // [N, G, D]
                           int64_t N, int64_t G, int64_t D, bool accumulate);

// sinkhorn.h: the mixing matrix from its logits (d_logits written).
using SinkhornForward = void(float* mixing,        // [N, G, G]
                             const float* logits,  // [N, G, G]
                             int64_t N, int64_t G, int64_t iterations);
using SinkhornBackward = void(float* d_logits,        // [N, G, G]
                              const float* d_mixing,  // [N, G, G]
                              const float* logits,    // [N, G, G]
                              int64_t N, int64_t G, int64_t iterations);

// adamw.h: the fused AdamW step, and the sum of squares (in double) of the global gradient norm.
using AdamWUpdate = void(float* param,       // [count] updated in place
                         const float* grad,  // [count] raw (unscaled) gradient
                         float* m,           // [count] first moment, updated
                         float* v,           // [count] second moment, updated
                         int64_t count, const AdamWStep& step, bool apply_weight_decay);
using SumOfSquares = double(const float* values,  // [count]
                            int64_t count);

// muon.h: Muon's step of `batch` matrices [rows = fan_in, cols = fan_out] one after another (an expert
// tensor's experts): Nesterov momentum, Newton-Schulz orthogonalisation, scale, decoupled decay.
using MuonUpdate = void(float* param,       // [batch, rows, cols] updated in place
                        const float* grad,  // [batch, rows, cols] raw (unscaled) gradient
                        float* momentum,    // [batch, rows, cols] updated
                        int64_t batch, int64_t rows, int64_t cols, const MuonStep& step,
                        bool apply_weight_decay,
                        float* scratch);  // [muon_scratch_floats(rows, cols)]
using MuonScratchFloats = int64_t(int64_t rows, int64_t cols);

}  // namespace meshtrain::kernels
