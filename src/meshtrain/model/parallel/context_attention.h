// Attention under context parallelism (mesh.context = C > 1, shared/specs/context-parallel.md): each rank
// holds L = S / C tokens of every row (in the reorder's order, with their original positions and segment
// ids) and its queries attend over the keys and values of the whole row. Two strategies
// (context_parallel_strategy):
//   all_gather: K / V, positions and segment ids gathered over context, one attention call over the whole
//               row; the backward reduce-scatters dK / dV.
//   ring:       the blocks of K / V pass around the context ranks, one attention call per block merged
//               exactly (online softmax), the next block's pass overlapping this block's compute; the
//               backward passes the blocks again with their dK / dV partial sums travelling beside them.
// Legend: B batch, L tokens per context rank (the spec's S), C context ranks, H query heads, K kv heads
// (this tensor rank's), d head width, X per-token int32 fields a ring block carries (positions, and segment
// ids when rows are packed: 1 or 2).
#pragma once

#include <array>
#include <string>
#include <vector>

#include "meshtrain/model/spec_builder.h"

namespace meshtrain {

// The attention core's buffers in the layer (after QK-norm and RoPE).
struct ContextAttentionBuffers {
  BufferId q = kNoBuffer, k = kNoBuffer, v = kNoBuffer;        // [B, L, H, d]; [B, L, K, d] each
  BufferId attended = kNoBuffer, lse = kNoBuffer;              // [B, L, H, d]; [B, H, L]
  BufferId d_attended = kNoBuffer;                             // [B, L, H, d], read by the backward
  BufferId d_q = kNoBuffer, d_k = kNoBuffer, d_v = kNoBuffer;  // written (=) by the backward
};

// The context ranks C each holding a part of every row (1: no context parallelism).
int64_t context_ranks(const SpecBuilder& builder);

// Declares the forward ops of `attention` (the layer's ".../self_attention") into the builder and returns
// its backward ops, in order. `flops`: the forward's attention FLOPs on this rank.
std::vector<OpDecl> add_context_attention(SpecBuilder& builder, const std::string& attention,
                                          const ContextAttentionBuffers& buffers, double flops);

// One ring attention call as the op runs it: this rank's block and the double buffers that travel.
struct RingAttentionArguments {
  int64_t B = 0, L = 0, H = 0, K = 0, d = 0;
  DType compute = DType::f32;              // bfloat16: the backend's bf16 attention kernels
  const float* q = nullptr;                // [B, L, H, d]
  const float *k = nullptr, *v = nullptr;  // [B, L, K, d] this rank's keys and values
  const int32_t* positions = nullptr;      // [B, L] original positions
  const int32_t* segment_ids = nullptr;    // [B, L] or null (one segment per row)
  float *out = nullptr, *lse = nullptr;    // [B, L, H, d]; [B, H, L]
  std::array<TensorView, 2> kv_blocks;     // [2, B, L, K, d] each: keys then values
  std::array<TensorView, 2> token_blocks;  // [X, B, L] each: positions then segment ids
  // Backward only.
  const float* dout = nullptr;                        // [B, L, H, d]
  float *dq = nullptr, *dk = nullptr, *dv = nullptr;  // [B, L, H, d]; [B, L, K, d] each, written (=)
  std::array<TensorView, 2> d_kv_blocks;              // [2, B, L, K, d] each: a block's dK / dV sums
  float* d_kv_step = nullptr;                         // [2, B, L, K, d]: this rank's share, one block
  float* scratch = nullptr;                           // [context_attention_backward_scratch_floats(B, L, H)]
};

// Step t of C computes against the block of rank (rank - t) mod C while the pass of the next block is in
// flight: C - 1 passes of K / V and of the token fields. Writes out and lse. Both functions compute a row
// at a time and call ring.progress() between rows.
void ring_attention_forward(const kernels::ContextRing& ring, const kernels::KernelBackend& kernels,
                            const RingAttentionArguments& a, const std::string& name);

// The same C steps again with dout: each step adds this rank's queries' share of dK / dV of the block in
// hand to the partial sums that arrived with it and passes them on (C passes: the last one brings every
// rank the complete dK / dV of its own block); dq sums over the steps. K / V and the token fields pass
// C - 1 times as in the forward; the dK / dV pass of step t - 1 is in flight during step t's compute.
void ring_attention_backward(const kernels::ContextRing& ring, const kernels::KernelBackend& kernels,
                             const RingAttentionArguments& a, const std::string& name);

// The plan's record of the bytes the next op passes between context ranks itself (ring attention's blocks,
// Engram's ShortConv halos): `passes` times `block`, a send_recv over the context axis the engine runs
// nothing for.
OpDecl context_passes(const SpecBuilder& builder, const std::string& name, BufferId block, int64_t passes);

}  // namespace meshtrain
