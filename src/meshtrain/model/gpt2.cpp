// GPT-2 decoder (OpenAI's architecture as llm.c and nanoGPT train it), for measuring against peers.
#include <cmath>

#include "meshtrain/model/families.h"
#include "meshtrain/model/layers/attention.h"
#include "meshtrain/model/layers/embedding.h"
#include "meshtrain/model/layers/mlp.h"

namespace meshtrain {

void build_gpt2(SpecBuilder& builder) {
  const ModelDims& m = builder.dims();
  // Positions, norm and MLP kind are the family row's (families.cpp).
  const DecoderFamily& family = family_of(DecoderBlock::gpt2);
  const bool rope = family.positions == PositionKind::rotary;
  const BufferId d_residual =
      builder.gradient_scratch("scratch/d_residual", token_shape(m, {{"embed", m.D}}));
  const double out_std = 0.02 / std::sqrt(2.0 * static_cast<double>(m.L));
  for_each_chunk(builder, [&](const LayerChunk& chunk) {
    const EmbeddingLayer embedding = add_chunk_start(builder, !rope, d_residual);
    BufferId residual = embedding.residual;
    for (int64_t layer = chunk.first_layer; layer <= chunk.last_layer; ++layer) {
      const std::string prefix = "decoder/layers_" + std::to_string(layer);
      residual = add_attention_block(builder, prefix, residual, d_residual,
                                     {family.norm, false, rope, true, out_std});
      residual =
          add_mlp_block(builder, prefix, residual, d_residual, {family.norm, family.mlp, true, out_std});
    }
    if (!chunk.with_head) {
      add_chunk_end(builder, residual, d_residual);
    } else {
      add_final_norm_and_loss(builder, family.norm, residual, tied_unembedding(builder, embedding),
                              d_residual);
    }
  });
}

}  // namespace meshtrain
