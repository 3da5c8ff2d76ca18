// The backend seam: one table of kernel entry points per backend (`cpu`, and `cuda` where built). Model ops
// call kernels only through the table their OpContext carries, and the spec builder sizes kernel scratch with
// the table's queries, so a new backend is a new folder beside kernels/cpu/ that fills the same table, not
// edits throughout the model and engine.
//
// A backend plugs in as kernels/<name>/backend.cpp defining `const KernelBackend& <name>_backend()`, plus one
// case in kernel_backend_for_device (backend.cpp). Every pointer argument points into the arena the engine
// hands the op: host memory for cpu, device memory for cuda. Semantics (what is written, what accumulates,
// determinism) are those documented in the cpu headers, which every backend must match.
// Legend: N tokens, B batch, S sequence, D width, H query heads, K kv heads, d head width, I / O matmul input
// / output width, R embedding rows held here, V vocab (padded, per rank), C cross-entropy chunk of tokens, T
// decode cache rows, count elements of an elementwise op; for the mixture-of-experts entries E routed
// experts, k experts per token, M = N k assignments, R_moe = offsets[E] kept (sorted) assignment rows.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "meshtrain/core/dtype.h"
#include "meshtrain/kernels/arguments.h"

namespace meshtrain::kernels {

struct KernelBackend {
  const char* name;  // "cpu", "cuda"

  // The device and its memory. device_check: why this process cannot run the backend's kernels ("" when it
  // can: cpu always; cuda when built with CUDA and a GPU is visible). device_description: the device in
  // words with its memory, for logs and errors. The arena the engine hands every op lives in
  // memory_allocate's memory (zeroed; nullptr when it does not fit). memory_on_host: the engine and ops may
  // read and write it in place (cpu); otherwise every host access goes through memory_copy_in / _out
  // (copy_out has finished when it returns) and memory_fill. device_synchronize waits for every kernel
  // queued so far (a no-op where kernels run synchronously, as on the cpu).
  std::string (*device_check)();
  std::string (*device_description)();
  bool (*memory_on_host)();
  void* (*memory_allocate)(size_t bytes);
  void (*memory_free)(void* base);
  void (*memory_copy_in)(void* device, const void* host, size_t bytes);
  void (*memory_copy_out)(void* host, const void* device, size_t bytes);
  void (*memory_fill)(void* device, uint8_t byte, size_t bytes);
  void (*device_synchronize)();

  // The dtype this backend stores activations, caches and kernel scratch in when the config's compute dtype
  // is `compute`: cpu keeps float32 and runs dtype=bfloat16 as bf16 inputs to every dense matmul (below).
  DType (*activation_dtype)(DType compute);

  // The dtype of an activation that only dense matmuls read (a norm's output before the projections, the
  // MLP's gated hidden) when the compute dtype is `compute`. cpu: bf16 under dtype=bfloat16, written rounded
  // by its producer (the *_forward_bf16 entries) and read by the matmuls as their bf16 input
  // (matmul_*_bf16_x), instead of each matmul rounding a float32 copy in the forward and again in the
  // backward. A backend without those entries returns activation_dtype(compute).
  DType (*matmul_input_dtype)(DType compute);

  // matmul.h: out = x @ w + bias; dx = (or +=) dout @ w^T, dw += x^T @ dout, dbias += column sums. With
  // bf16_inputs (dtype=bfloat16) the GEMMs take x, w and dout rounded to bf16 there, accumulating in f32;
  // the _bf16_x entries take x already rounded (matmul_input_dtype).
  void (*matmul_forward)(float* out,         // [N, O]
                         const float* x,     // [N, I]
                         const float* w,     // [I, O]
                         const float* bias,  // [O] or nullptr
                         int64_t N, int64_t I, int64_t O,
                         uint16_t* bf16_inputs);  // [matmul_bf16_scratch_elements(N, I, O, false)] or nullptr
  void (*matmul_forward_bf16_x)(float* out,       // [N, O]
                                const uint16_t* x,  // [N, I] bfloat16
                                const float* w,     // [I, O]
                                const float* bias,  // [O] or nullptr
                                int64_t N, int64_t I, int64_t O,
                                uint16_t* bf16_inputs);  // [matmul_bf16_scratch_elements(N, I, O, true)]
  void (*matmul_backward)(
      float* dx,          // [N, I] or nullptr
      float* dw,          // [I, O] or nullptr
      float* dbias,       // [O] or nullptr
      const float* dout,  // [N, O]
      const float* x,     // [N, I]
      const float* w,     // [I, O]
      int64_t N, int64_t I, int64_t O, bool accumulate_dx,
      uint16_t* bf16_inputs);                   // [matmul_bf16_scratch_elements(N, I, O, false)] or nullptr
  void (*matmul_backward_bf16_x)(float* dx,     // [N, I] or nullptr
                                 float* dw,     // [I, O] or nullptr
                                 float* dbias,  // [O] or nullptr
                                 const float* dout,  // [N, O]
                                 const uint16_t* x,  // [N, I] bfloat16
                                 const float* w,     // [I, O]
                                 int64_t N, int64_t I, int64_t O, bool accumulate_dx,
                                 uint16_t* bf16_inputs);  // [matmul_bf16_scratch_elements(N, I, O, true)]
  int64_t (*matmul_bf16_scratch_elements)(int64_t N, int64_t I, int64_t O, bool x_is_bf16);

  // residual.h: out += x.
  void (*residual_add)(float* out,      // [count]
                       const float* x,  // [count]
                       int64_t count);

  // embedding.h: out = (or +=) table[ids - vocab_offset]; dtable[ids - vocab_offset] += dout. global_rows <
  // 0: vocab_offset + R.
  void (*embedding_forward)(float* out,          // [N, D]
                            const int32_t* ids,  // [N]
                            const float* table,  // [R, D]
                            int64_t N, int64_t R, int64_t D, bool accumulate, int64_t vocab_offset,
                            int64_t global_rows);
  void (*embedding_backward)(float* dtable,       // [R, D]
                             const int32_t* ids,  // [N]
                             const float* dout,   // [N, D]
                             int64_t N, int64_t R, int64_t D, int64_t vocab_offset, int64_t global_rows);

  // cross_entropy.h: fused unembedding + softmax cross-entropy (loss sum; dh written, dw accumulated), its
  // scratch size, and plain logits for decoding (padding columns -inf).
  CrossEntropySums (*unembed_cross_entropy)(float* dh,       // [N, D] or nullptr
                                            float* dw,       // layout of w, or nullptr
                                            const float* h,  // [N, D]
                                            const float* w,  // [D, V] kernel_DV or [V, D] table_VD
                                            UnembedLayout layout,
                                            const int32_t* targets,    // [N]
                                            const uint8_t* loss_mask,  // [N] or nullptr
                                            int64_t N, int64_t D, int64_t V, int64_t vocab_valid,
                                            int64_t chunk_tokens,  // C
                                            float* scratch,        // [cross_entropy_scratch_floats(C, V)]
                                            const VocabParallel* vocab_parallel,  // nullptr: one rank
                                            uint16_t* bf16_inputs);  // bf16 GEMM inputs, or nullptr (f32)
  int64_t (*cross_entropy_scratch_floats)(int64_t chunk_tokens, int64_t V);
  int64_t (*cross_entropy_bf16_scratch_elements)(int64_t chunk_tokens, int64_t D, int64_t V);
  void (*unembed_logits)(float* out,      // [N, V]
                         const float* h,  // [N, D]
                         const float* w,  // [D, V] kernel_DV or [V, D] table_VD
                         UnembedLayout layout, int64_t N, int64_t D, int64_t V, int64_t vocab_valid);

  // rmsnorm.h: saves rstd; dx = (or +=) dL/dx, dw += dL/dw. The _bf16 forwards of this and the next three
  // write out rounded to bf16 (matmul_input_dtype).
  void (*rmsnorm_forward)(float* out,      // [N, D]
                          float* rstd,     // [N]
                          const float* x,  // [N, D]
                          const float* w,  // [D]
                          int64_t N, int64_t D, float eps);
  void (*rmsnorm_forward_bf16)(uint16_t* out,   // [N, D] bfloat16
                               float* rstd,     // [N]
                               const float* x,  // [N, D]
                               const float* w,  // [D]
                               int64_t N, int64_t D, float eps);
  void (*rmsnorm_backward)(float* dx,          // [N, D]
                           float* dw,          // [D]
                           const float* dout,  // [N, D]
                           const float* x,     // [N, D]
                           const float* w,     // [D]
                           const float* rstd,  // [N]
                           int64_t N, int64_t D, bool accumulate_dx);

  // layernorm.h: saves mean and rstd; dx = (or +=) dL/dx, dw += dL/dw, db += dL/db.
  void (*layernorm_forward)(float* out,      // [N, D]
                            float* mean,     // [N]
                            float* rstd,     // [N]
                            const float* x,  // [N, D]
                            const float* w,  // [D]
                            const float* b,  // [D]
                            int64_t N, int64_t D, float eps);
  void (*layernorm_forward_bf16)(uint16_t* out,   // [N, D] bfloat16
                                 float* mean,     // [N]
                                 float* rstd,     // [N]
                                 const float* x,  // [N, D]
                                 const float* w,  // [D]
                                 const float* b,  // [D]
                                 int64_t N, int64_t D, float eps);
  void (*layernorm_backward)(float* dx,          // [N, D]
                             float* dw,          // [D]
                             float* db,          // [D]
                             const float* dout,  // [N, D]
                             const float* x,     // [N, D]
                             const float* w,     // [D]
                             const float* mean,  // [N]
                             const float* rstd,  // [N]
                             int64_t N, int64_t D, bool accumulate_dx);

  // swiglu.h: out = silu(gate) * up; dgate, dup written.
  void (*swiglu_forward)(float* out,         // [count]
                         const float* gate,  // [count]
                         const float* up,    // [count]
                         int64_t count);
  void (*swiglu_forward_bf16)(uint16_t* out,      // [count] bfloat16
                              const float* gate,  // [count]
                              const float* up,    // [count]
                              int64_t count);
  void (*swiglu_backward)(float* dgate,       // [count]
                          float* dup,         // [count]
                          const float* dout,  // [count]
                          const float* gate,  // [count]
                          const float* up,    // [count]
                          int64_t count);

  // gelu.h: tanh-approximated GELU; dx written.
  void (*gelu_forward)(float* out,      // [count]
                       const float* x,  // [count]
                       int64_t count);
  void (*gelu_forward_bf16)(uint16_t* out,   // [count] bfloat16
                            const float* x,  // [count]
                            int64_t count);
  void (*gelu_backward)(float* dx,          // [count]
                        const float* dout,  // [count]
                        const float* x,     // [count]
                        int64_t count);

  // rope.h: rotary embedding by per-token positions; out may alias x, dx may alias dout.
  void (*rope_forward)(float* out,                // [N, H, d]
                       const float* x,            // [N, H, d]
                       const int32_t* positions,  // [N]
                       int64_t N, int64_t H, int64_t d, float theta);
  void (*rope_backward)(float* dx,                 // [N, H, d]
                        const float* dout,         // [N, H, d]
                        const int32_t* positions,  // [N]
                        int64_t N, int64_t H, int64_t d, float theta);

  // column_slice.h: W columns of each of R rows copied to `repeat` rows of out (x nullptr: zeros), and the
  // transpose, which writes each dx row as the sum of its `repeat` dout rows; strides are row widths.
  void (*column_slice_forward)(float* out,      // [R * repeat, out_stride]
                               const float* x,  // [R, x_stride] or nullptr
                               int64_t R, int64_t W, int64_t repeat, int64_t out_stride, int64_t x_stride);
  void (*column_slice_backward)(float* dx,          // [R, dx_stride]
                                const float* dout,  // [R * repeat, dout_stride]
                                int64_t R, int64_t W, int64_t repeat, int64_t dx_stride, int64_t dout_stride);

  // attention.h: causal grouped-query attention masked by positions and segment ids; the backward writes
  // dq, dk, dv and needs attention_backward_scratch_floats(...) floats; the decode step appends one token's
  // k, v to the caches at row `position` and attends over rows [0, position].
  void (*attention_forward)(float* out,                  // [B, S, H, d]
                            float* lse,                  // [B, H, S]
                            const float* q,              // [B, S, H, d]
                            const float* k,              // [B, S, K, d]
                            const float* v,              // [B, S, K, d]
                            const int32_t* positions,    // [B, S]
                            const int32_t* segment_ids,  // [B, S] or nullptr
                            int64_t B, int64_t S, int64_t H, int64_t K, int64_t d);
  void (*attention_backward)(float* dq,                   // [B, S, H, d]
                             float* dk,                   // [B, S, K, d]
                             float* dv,                   // [B, S, K, d]
                             const float* dout,           // [B, S, H, d]
                             const float* out,            // [B, S, H, d]
                             const float* lse,            // [B, H, S]
                             const float* q,              // [B, S, H, d]
                             const float* k,              // [B, S, K, d]
                             const float* v,              // [B, S, K, d]
                             const int32_t* positions,    // [B, S]
                             const int32_t* segment_ids,  // [B, S] or nullptr
                             int64_t B, int64_t S, int64_t H, int64_t K, int64_t d,
                             float* scratch);  // [attention_backward_scratch_floats(...)]
  int64_t (*attention_backward_scratch_floats)(int64_t B, int64_t S, int64_t H, int64_t K, int64_t d,
                                               int max_threads);
  // attention.h, context parallelism: a rank's queries (Sq) against another key / value set (Skv, e.g. the
  // whole sequence gathered over mesh.context), masked by both sets' positions and segment ids; forward
  // writes (or, accumulate, merges into) out and lse; backward writes (or adds) dq and the dk, dv of the
  // key / value set, with context_attention_backward_scratch_floats(B, Sq, H) floats of scratch.
  void (*context_attention_forward)(float* out,                     // [B, Sq, H, d]
                                    float* lse,                     // [B, H, Sq]
                                    const float* q,                 // [B, Sq, H, d]
                                    const float* k,                 // [B, Skv, K, d]
                                    const float* v,                 // [B, Skv, K, d]
                                    const int32_t* q_positions,     // [B, Sq]
                                    const int32_t* q_segment_ids,   // [B, Sq] or nullptr
                                    const int32_t* kv_positions,    // [B, Skv]
                                    const int32_t* kv_segment_ids,  // [B, Skv] or nullptr
                                    int64_t B, int64_t Sq, int64_t Skv, int64_t H, int64_t K, int64_t d,
                                    bool accumulate);
  void (*context_attention_backward)(float* dq,                      // [B, Sq, H, d]
                                     float* dk,                      // [B, Skv, K, d]
                                     float* dv,                      // [B, Skv, K, d]
                                     const float* dout,              // [B, Sq, H, d]
                                     const float* out,               // [B, Sq, H, d]
                                     const float* lse,               // [B, H, Sq]
                                     const float* q,                 // [B, Sq, H, d]
                                     const float* k,                 // [B, Skv, K, d]
                                     const float* v,                 // [B, Skv, K, d]
                                     const int32_t* q_positions,     // [B, Sq]
                                     const int32_t* q_segment_ids,   // [B, Sq] or nullptr
                                     const int32_t* kv_positions,    // [B, Skv]
                                     const int32_t* kv_segment_ids,  // [B, Skv] or nullptr
                                     int64_t B, int64_t Sq, int64_t Skv, int64_t H, int64_t K, int64_t d,
                                     bool accumulate,
                                     float* scratch);  // [context_attention_backward_scratch_floats(...)]
  int64_t (*context_attention_backward_scratch_floats)(int64_t B, int64_t Sq, int64_t H);
  void (*attention_decode)(float* out,          // [H, d]
                           float* key_cache,    // [T, K, d]
                           float* value_cache,  // [T, K, d]
                           float* scores,       // [position + 1]
                           const float* q,      // [H, d]
                           const float* k,      // [K, d]
                           const float* v,      // [K, d]
                           int64_t position, int64_t H, int64_t K, int64_t d);

  // moe_router.h: scores, top-k choice (selection_bias orders only) and weights (=); d_logits (=) from
  // d_weights; the load-balance loss and its gradient (d_logits +=).
  void (*moe_router_forward)(int32_t* chosen,              // [N, k]
                             float* weights,               // [N, k]
                             float* scores,                // [N, E]
                             const float* logits,          // [N, E]
                             const float* selection_bias,  // [E] or nullptr
                             int64_t N, int64_t E, const MoeRouting& routing);
  void (*moe_router_backward)(float* d_logits,         // [N, E]
                              const float* d_weights,  // [N, k]
                              const float* scores,     // [N, E]
                              const int32_t* chosen,   // [N, k]
                              int64_t N, int64_t E, const MoeRouting& routing);
  double (*moe_balance_loss_forward)(const float* scores,    // [N, E]
                                     const int32_t* counts,  // [E]
                                     int64_t N, int64_t E, RouterScore score_function, float weight);
  void (*moe_balance_loss_backward)(float* d_logits,        // [N, E]
                                    const float* scores,    // [N, E]
                                    const int32_t* counts,  // [E]
                                    int64_t N, int64_t E, RouterScore score_function, float weight,
                                    float d_loss);

  // moe_dispatch.h: the routing plan (assignments sorted by expert, capacity dropping; returns the dropped
  // count), gather into sorted rows (a zero row for index -1; d_x = or +=), weighted combine back to tokens
  // (out = or +=; d_y_sorted and d_weights =).
  int64_t (*moe_route_plan)(int32_t* counts,        // [E]
                            int32_t* offsets,       // [E + 1]
                            int32_t* sorted,        // [M]
                            int32_t* position,      // [M]
                            int32_t* assigned,      // [E] or nullptr
                            const int32_t* chosen,  // [N, k]
                            int64_t N, int64_t k, int64_t E, int64_t capacity);
  void (*moe_gather_forward)(float* sorted_x,        // [R_moe, D]
                             const float* x,         // [N, D]
                             const int32_t* sorted,  // [M]
                             int64_t R, int64_t k, int64_t D);
  // Expert parallelism's block layouts (P expert ranks, E_l local experts, B_c block rows).
  void (*moe_dispatch_plan)(int32_t* send_sorted,    // [P B_c]
                            int32_t* send_position,  // [M]
                            int32_t* send_counts,    // [P, E_l]
                            const int32_t* offsets,  // [E + 1]
                            const int32_t* sorted,   // [M]
                            int64_t M, int64_t E, int64_t P, int64_t block_rows);
  void (*moe_receive_plan)(int32_t* local_offsets,          // [E_l + 1]
                           int32_t* local_sorted,           // [P B_c]
                           int32_t* received_position,      // [P B_c]
                           const int32_t* received_counts,  // [P, E_l]
                           int64_t P, int64_t E_local, int64_t block_rows);
  void (*moe_gather_backward)(float* d_x,               // [N, D]
                              const float* d_sorted_x,  // [R_moe, D]
                              const int32_t* position,  // [M]
                              int64_t N, int64_t k, int64_t D, bool accumulate);
  void (*moe_combine_forward)(float* out,               // [N, D]
                              const float* y_sorted,    // [R_moe, D]
                              const float* weights,     // [N, k]
                              const int32_t* position,  // [M]
                              int64_t N, int64_t k, int64_t D, bool accumulate);
  void (*moe_combine_backward)(float* d_y_sorted,        // [R_moe, D]
                               float* d_weights,         // [N, k]
                               const float* d_out,       // [N, D]
                               const float* y_sorted,    // [R_moe, D]
                               const float* weights,     // [N, k]
                               const int32_t* position,  // [M]
                               int64_t N, int64_t k, int64_t D);

  // grouped_matmul.h: per expert segment of sorted rows, out = x @ w[e]; d_x = d_out @ w[e]^T, d_w[e] +=.
  void (*grouped_matmul_forward)(float* out,              // [R_moe, O]
                                 const float* x,          // [R_moe, I]
                                 const float* w,          // [E, I, O]
                                 const int32_t* offsets,  // [E + 1]
                                 int64_t E, int64_t I, int64_t O);
  void (*grouped_matmul_backward)(float* d_x,              // [R_moe, I] or nullptr
                                  float* d_w,              // [E, I, O] or nullptr
                                  const float* d_out,      // [R_moe, O]
                                  const float* x,          // [R_moe, I]
                                  const float* w,          // [E, I, O]
                                  const int32_t* offsets,  // [E + 1]
                                  int64_t E, int64_t I, int64_t O);

  // rmsnorm.h, per-stream scales (Engram, mHC): G rows of width D per token, stream g scaled by w[g].
  void (*rmsnorm_streams_forward)(float* out,      // [N, G, D]
                                  float* rstd,     // [N, G]
                                  const float* x,  // [N, G, D]
                                  const float* w,  // [G, D]
                                  int64_t N, int64_t G, int64_t D, float eps);
  void (*rmsnorm_streams_backward)(float* dx,          // [N, G, D]
                                   float* dw,          // [G, D]
                                   const float* dout,  // [N, G, D]
                                   const float* x,     // [N, G, D]
                                   const float* w,     // [G, D]
                                   const float* rstd,  // [N, G]
                                   int64_t N, int64_t G, int64_t D, bool accumulate_dx);

  // Engram (shared/specs/engram.md). engram_gate.h: gate_g = sigmoid(signed sqrt(<q_g, k_g> / sqrt(D))),
  // gated_g = gate_g v; d_q, d_k, d_v written.
  void (*engram_gate_forward)(float* gated,    // [N, G, D]
                              float* gate,     // [N, G]
                              const float* q,  // [N, G, D]
                              const float* k,  // [N, G, D]
                              const float* v,  // [N, D]
                              int64_t N, int64_t G, int64_t D);
  void (*engram_gate_backward)(float* d_q,            // [N, G, D]
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
  void (*short_conv_forward)(float* y,           // [B, T, C]
                             const float* u,     // [B, T, C]
                             const float* halo,  // [B, (K - 1) dilation, C] or nullptr
                             const float* w,     // [K, C]
                             int64_t B, int64_t T, int64_t C, int64_t K, int64_t dilation);
  void (*short_conv_backward)(float* d_u,         // [B, T, C]
                              float* d_halo,      // [B, (K - 1) dilation, C] or nullptr
                              float* d_w,         // [K, C]
                              const float* d_y,   // [B, T, C]
                              const float* u,     // [B, T, C]
                              const float* halo,  // [B, (K - 1) dilation, C] or nullptr
                              const float* w,     // [K, C]
                              int64_t B, int64_t T, int64_t C, int64_t K, int64_t dilation);
  void (*short_conv_output_forward)(float* out, const float* x, const float* gated, const float* y,
                                    int64_t count);
  void (*short_conv_output_backward)(float* d_gated, float* d_y, const float* d_out, const float* y,
                                     int64_t count);

  // mHC (shared/specs/mhc.md). mhc_mix.h: a site's coefficients (pre, post, mixing logits) from its
  // projection h; the collapse of the streams into the sublayer's input and the expand of its output; the
  // streams' entry (repeat) and exit (sum). sinkhorn.h: the mixing matrix from its logits (d_logits
  // written).
  void (*mhc_coefficients_forward)(float* pre,              // [N, G]
                                   float* post,             // [N, G]
                                   float* logits,           // [N, G, G]
                                   const float* h,          // [N, 2G + G^2]
                                   const float* scales,     // [3]
                                   const float* pre_beta,   // [G]
                                   const float* post_beta,  // [G]
                                   const float* res_beta,   // [G, G]
                                   int64_t N, int64_t G);
  void (*mhc_coefficients_backward)(float* d_h,              // [N, 2G + G^2] written
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
  void (*sinkhorn_forward)(float* mixing,        // [N, G, G]
                           const float* logits,  // [N, G, G]
                           int64_t N, int64_t G, int64_t iterations);
  void (*sinkhorn_backward)(float* d_logits,        // [N, G, G]
                            const float* d_mixing,  // [N, G, G]
                            const float* logits,    // [N, G, G]
                            int64_t N, int64_t G, int64_t iterations);
  void (*mhc_collapse_forward)(float* xin,        // [N, D]
                               const float* x,    // [N, G, D]
                               const float* pre,  // [N, G]
                               int64_t N, int64_t G, int64_t D);
  void (*mhc_collapse_backward)(float* d_x,          // [N, G, D] +=
                                float* d_pre,        // [N, G] written
                                const float* d_xin,  // [N, D]
                                const float* x,      // [N, G, D]
                                const float* pre,    // [N, G]
                                int64_t N, int64_t G, int64_t D);
  void (*mhc_expand_forward)(float* out,           // [N, G, D]
                             const float* x,       // [N, G, D]
                             const float* mixing,  // [N, G, G]
                             const float* post,    // [N, G]
                             const float* o,       // [N, D]
                             int64_t N, int64_t G, int64_t D);
  void (*mhc_expand_backward)(float* d_x,           // [N, G, D] written
                              float* d_mixing,      // [N, G, G] written
                              float* d_post,        // [N, G] written
                              float* d_o,           // [N, D] written
                              const float* d_out,   // [N, G, D]
                              const float* x,       // [N, G, D]
                              const float* mixing,  // [N, G, G]
                              const float* post,    // [N, G]
                              const float* o,       // [N, D]
                              int64_t N, int64_t G, int64_t D);
  void (*mhc_streams_repeat)(float* out, const float* x, int64_t N, int64_t G, int64_t D);
  void (*mhc_streams_sum)(float* out, const float* x, int64_t N, int64_t G, int64_t D, bool accumulate);

  // adamw.h: the fused AdamW step, and the sum of squares (in double) of the global gradient norm.
  void (*adamw_update)(float* param,       // [count]
                       const float* grad,  // [count]
                       float* m,           // [count]
                       float* v,           // [count]
                       int64_t count, const AdamWStep& step, bool apply_weight_decay);
  double (*sum_of_squares)(const float* values,  // [count]
                           int64_t count);
};

// The backend whose kernels run ops on devices of `device_kind` (a topology's, e.g. "cpu", "h100"). NVIDIA
// kinds (a100, h100, h200, b200) get the cuda table: its kernels where this build has CUDA, else the cpu
// functions in their slots (planning only: device_check says why it cannot run); its scratch sizes and
// activation dtype are the cpu kernels' in both builds, so a plan does not depend on the build. Other
// accelerator kinds are planned with the cpu kernels but stored as their backend will store them:
// activations in the compute dtype, no bf16 rounding scratch.
const KernelBackend& kernel_backend_for_device(const std::string& device_kind);

// Device kinds the cuda backend runs.
bool nvidia_device_kind(const std::string& device_kind);

}  // namespace meshtrain::kernels
