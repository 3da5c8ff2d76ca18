// Multi-head latent attention (DeepSeek-V2/V3; Hugging Face DeepseekV3Attention without YaRN) as the
// attention block of a pre-norm decoder layer, forward ops declared in order and the backward group beside
// them; in a decode spec the same ops at one token, attention through the layer's key / value caches.
//
//   x = norm(residual_in)                                                       [N, D]
//   q = q_lora_rank > 0 ? RMSNorm(x @ wq_a) @ wq_b : x @ query                  [N, H, nope + rope]
//   [c_kv | k_rope] = x @ wkv_a                                                 [N, r_kv + rope]
//   [k_nope | v] = RMSNorm(c_kv) @ wkv_b                                        [N, H, nope + v_dim]
//   RoPE (rotate-half) on q's last `rope` columns per head and on k_rope (one head, shared by all);
//   k = [k_nope | k_rope broadcast over the heads];  o = Attn(q, k, v) scaled 1 / sqrt(nope + rope)
//   residual_out = residual_in + o @ out                                        [N, D]
//
// The core is the existing attention kernel with K = H kv heads of width dq = nope + rope: v is zero-padded
// from v_dim to dq and the output's first v_dim columns are kept (its other columns are exactly zero). That
// costs (dq - v_dim) / v_dim more in the core's P @ V product and in the v, output and their gradient
// buffers (DeepSeek-V3: dq 192, v_dim 128, +50%), plus the copies; a kernel taking a separate value width
// would remove it. The YaRN mscale on the softmax scale is not implemented.
//
// RoPE layout: Hugging Face DeepSeek checkpoints (rope_interleave) hold each rotary pair as adjacent
// columns; the engine keeps rotate-half (pair i = columns i and i + rope / 2), and a checkpoint's rotary
// columns are permuted at import (hf_rope_column_order in interchange/hf_names.h), which gives the same q .
// k. Tensor parallel: heads split over mesh.tensor (wq_b / query and wkv_b column-parallel, out
// row-parallel), the down projections wq_a, wkv_a and their norms replicated; the gradients leaving the heads
// for them (of RMSNorm(c_q), of RMSNorm(c_kv), of the shared k_rope, and d_normed of a direct query) are
// all-reduced over tensor. Context parallel: the core is attention.cpp's (model/parallel/context_attention.h,
// all_gather or ring) over the expanded k and padded v; RoPE reads each token's original position.
//
// Parameters (Hugging Face names in interchange/hf_names.cpp): pre_self_attention_layer_norm/scale;
// self_attention/ wq_a/kernel [D, r_q], q_norm/scale [r_q], wq_b/kernel [r_q, H, dq] (or query/kernel
// [D, H, dq] when q_lora_rank = 0), wkv_a/kernel [D, r_kv + rope], kv_norm/scale [r_kv],
// wkv_b/kernel [r_kv, H, nope + v_dim], out/kernel [H, v_dim, D].
// Legend: B batch, S sequence, N tokens, D width, H heads, r_q / r_kv the query / key-value ranks, nope /
// rope the query-key head widths without / with RoPE, dq = nope + rope, v_dim the value head width, T
// cache rows.
#pragma once

#include <string>

#include "meshtrain/model/layers/norm.h"

namespace meshtrain {

struct MlaBlockOptions {
  NormKind norm = NormKind::rms;  // the pre-norm (the low-rank norms are always RMSNorm)
  double out_init_std = 0.02;     // false: the block is an mHC site's sublayer F (model/layers/mhc.h): it
                                  // returns F(norm(x)) without
  // adding x, and its backward turns d_residual into dL/dx in place (written, not added).
  bool adds_residual = true;
};

// Returns residual_out [B, S, D]. The backward group reads d_residual (dL/d residual_out) and leaves
// dL/d residual_in in it (the residual path adds in place). Widths come from the config's MLA keys.
BufferId add_mla_block(SpecBuilder& builder, const std::string& prefix, BufferId residual_in,
                       BufferId d_residual, const MlaBlockOptions& options);

}  // namespace meshtrain
