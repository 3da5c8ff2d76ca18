// DeepSeek-V2/V3 decoder (Hugging Face DeepseekV3ForCausalLM semantics): multi-head latent attention, and
// feed-forward layers that are dense SwiGLU MLPs for the first first_num_dense_layers layers (every layer
// when num_experts is 0) and mixture-of-experts blocks after them (model/layers/moe.h).
#include <cmath>

#include "meshtrain/core/error.h"
#include "meshtrain/model/families.h"
#include "meshtrain/model/layers/attention.h"
#include "meshtrain/model/layers/embedding.h"
#include "meshtrain/model/layers/mla.h"
#include "meshtrain/model/layers/mlp.h"
#include "meshtrain/model/layers/moe.h"

namespace meshtrain {
void build_deepseek(SpecBuilder& builder) {
  const ModelDims& m = builder.dims();
  const Config& config = builder.spec().config;
  // Positions, norm and MLP kind are the family row's (families.cpp).
  const DecoderFamily& family = family_of(DecoderBlock::deepseek);
  const BufferId d_residual =
      builder.gradient_scratch("scratch/d_residual", token_shape(m, {{"embed", m.D}}));
  // Residual output projections start smaller so the stream's variance does not grow with depth.
  const double out_std = 0.02 / std::sqrt(2.0 * static_cast<double>(m.L));
  const EmbeddingLayer embedding = add_embedding(builder, false, d_residual);
  BufferId residual = embedding.residual;
  for (int64_t layer = 0; layer < m.L; ++layer) {
    const std::string prefix = "decoder/layers_" + std::to_string(layer);
    if (config.attention_type == AttentionType::mla) {
      residual = add_mla_block(builder, prefix, residual, d_residual, {family.norm, out_std});
    } else {
      residual = add_attention_block(builder, prefix, residual, d_residual,
                                     {family.norm, false, true, false, out_std});
    }
    if (moe_layer(config, layer)) {
      residual = add_moe_block(builder, prefix, residual, d_residual, moe_options(config, out_std));
    } else {
      residual =
          add_mlp_block(builder, prefix, residual, d_residual, {family.norm, family.mlp, false, out_std});
    }
  }
  const bool tied = config.logits_via_embedding;
  add_final_norm_and_loss(builder, family.norm, residual, tied ? embedding.table : kNoBuffer, d_residual);
}

}  // namespace meshtrain
