// Decoder families: each declares its layers into a SpecBuilder whose inputs already exist.
#pragma once

#include "meshtrain/model/spec_builder.h"

namespace meshtrain {

// Qwen3: pre-norm RMSNorm, per-head QK-norm before RoPE, GQA, SwiGLU, tied or untied unembedding.
void build_qwen3(SpecBuilder& builder);
// GPT-2: LayerNorm, GELU, learned positions, biases, tied embeddings.
void build_gpt2(SpecBuilder& builder);

}  // namespace meshtrain
