// The attention block of a pre-norm decoder layer: residual_out = residual_in +
// O(Attn(RoPE(QKNorm(QKV(norm(x)))))) with GQA, forward ops declared in order and the backward group beside
// them; in a decode spec the same ops at one token, attention through the layer's key / value caches.
// Legend: B batch, S sequence, D width, H query heads, K kv heads, d head width, T cache rows.
#pragma once

#include <string>

#include "meshtrain/model/layers/norm.h"

namespace meshtrain {

struct AttentionBlockOptions {
  NormKind norm = NormKind::rms;
  bool qk_norm = true;         // Qwen3: per-head RMSNorm on q and k before RoPE
  bool rope = true;            // Qwen3: rotate-half RoPE; GPT-2 uses learned positions instead
  bool bias = false;           // GPT-2: biases on every projection
  double out_init_std = 0.02;  // false: the block is an mHC site's sublayer F (model/layers/mhc.h): it
                               // returns F(norm(x)) without
  // adding x, and its backward turns d_residual into dL/dx in place (written, not added).
  bool adds_residual = true;
};

// Returns residual_out [B, S, D]. The backward group reads d_residual (dL/d residual_out) and leaves
// dL/d residual_in in it (the residual path adds in place).
BufferId add_attention_block(SpecBuilder& builder, const std::string& prefix, BufferId residual_in,
                             BufferId d_residual, const AttentionBlockOptions& options);

}  // namespace meshtrain
