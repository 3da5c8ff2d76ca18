// Qwen3 decoder (Hugging Face Qwen3ForCausalLM semantics; golden-tested in tests/reference/qwen3_golden),
// and Qwen3-MoE (Qwen3MoeForCausalLM) when num_experts > 0: every layer after first_num_dense_layers a
// mixture of experts (model/layers/moe.h).
#include <cmath>

#include "meshtrain/model/families.h"
#include "meshtrain/model/layers/attention.h"
#include "meshtrain/model/layers/embedding.h"
#include "meshtrain/model/layers/mlp.h"
#include "meshtrain/model/layers/moe.h"

namespace meshtrain {

void build_qwen3(SpecBuilder& builder) {
  const ModelDims& m = builder.dims();
  const ModelOptions& options = builder.spec().options;
  // Positions, norm and MLP kind are the family row's (families.cpp).
  const DecoderFamily& family = family_of(DecoderBlock::qwen3);
  const bool rope = family.positions == PositionKind::rotary;
  const BufferId d_residual =
      builder.gradient_scratch("scratch/d_residual", token_shape(m, {{"embed", m.D}}));
  // Residual output projections start smaller so the stream's variance does not grow with depth.
  const double out_std = 0.02 / std::sqrt(2.0 * static_cast<double>(m.L));
  for_each_chunk(builder, [&](const LayerChunk& chunk) {
    const EmbeddingLayer embedding = add_chunk_start(builder, !rope, d_residual);
    BufferId residual = embedding.residual;
    for (int64_t layer = chunk.first_layer; layer <= chunk.last_layer; ++layer) {
      const std::string prefix = "decoder/layers_" + std::to_string(layer);
      residual = add_attention_block(builder, prefix, residual, d_residual,
                                     {family.norm, true, rope, false, out_std});
      if (options.moe.at(layer)) {
        residual = add_moe_block(builder, prefix, residual, d_residual, {options.moe, out_std});
      } else {
        residual =
            add_mlp_block(builder, prefix, residual, d_residual, {family.norm, family.mlp, false, out_std});
      }
    }
    if (!chunk.with_head) {
      add_chunk_end(builder, residual, d_residual);
    } else {
      const bool tied = options.tied_embeddings;
      add_final_norm_and_loss(builder, family.norm, residual,
                              tied ? tied_unembedding(builder, embedding) : kNoBuffer, d_residual);
    }
  });
}

}  // namespace meshtrain
