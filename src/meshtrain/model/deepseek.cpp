// DeepSeek-V2/V3 decoder (Hugging Face DeepseekV3ForCausalLM semantics): multi-head latent attention, and
// feed-forward layers that are dense SwiGLU MLPs for the first first_num_dense_layers layers (every layer
// when num_experts is 0) and mixture-of-experts blocks after them (model/layers/moe.h). The reference
// system's additions: an Engram block at the start of each layer engram_layers names (model/layers/engram.h),
// and with mhc_expansion_rate > 1 the residual widened to G streams, every sublayer an mHC site
// (model/layers/mhc.h).
#include <algorithm>
#include <cmath>

#include "meshtrain/core/error.h"
#include "meshtrain/model/families.h"
#include "meshtrain/model/layers/attention.h"
#include "meshtrain/model/layers/embedding.h"
#include "meshtrain/model/layers/engram.h"
#include "meshtrain/model/layers/mhc.h"
#include "meshtrain/model/layers/mla.h"
#include "meshtrain/model/layers/mlp.h"
#include "meshtrain/model/layers/moe.h"

namespace meshtrain {
void build_deepseek(SpecBuilder& builder) {
  const ModelDims& m = builder.dims();
  const ModelOptions& options = builder.spec().options;
  // Positions, norm and MLP kind are the family row's (families.cpp).
  const DecoderFamily& family = family_of(DecoderBlock::deepseek);
  const BufferId d_residual =
      builder.gradient_scratch("scratch/d_residual", token_shape(m, {{"embed", m.D}}));
  // Residual output projections start smaller so the stream's variance does not grow with depth.
  const double out_std = 0.02 / std::sqrt(2.0 * static_cast<double>(m.L));
  const bool mhc = m.G > 1;
  for_each_chunk(builder, [&](const LayerChunk& chunk) {
    const EmbeddingLayer embedding =
        chunk.with_embedding ? add_embedding(builder, false, d_residual) : EmbeddingLayer{};
    // The residual streams and their gradient: [B, S, G, D] under mHC (one scratch for every chunk), else the
    // plain residual.
    const BufferId d_streams =
        mhc ? builder.gradient_scratch("scratch/d_streams", stream_shape(m)) : d_residual;
    BufferId streams = embedding.residual;
    if (mhc && chunk.with_embedding)
      streams = add_mhc_entry(builder, embedding.residual, d_residual, d_streams);
    if (!chunk.with_embedding)
      streams = add_chunk_input(builder, mhc ? stream_shape(m) : token_shape(m, {{"embed", m.D}}), d_streams);
    // A sublayer on the streams: an mHC site around it, or the block itself adding its own residual.
    const auto sublayer = [&](const std::string& site, const auto& add_block) {
      if (!mhc) return add_block(streams, d_streams, true);
      return add_mhc_site(builder, site, streams, d_streams,
                          [&](BufferId xin, BufferId d_io) { return add_block(xin, d_io, false); });
    };
    // Engram layers are numbered in engram_layers order (ascending), those before the chunk included.
    size_t engram_index =
        static_cast<size_t>(std::count_if(options.engram.layers.begin(), options.engram.layers.end(),
                                          [&](int64_t layer) { return layer < chunk.first_layer; }));
    for (int64_t layer = chunk.first_layer; layer <= chunk.last_layer; ++layer) {
      const std::string prefix = "decoder/layers_" + std::to_string(layer);
      if (options.engram.at(layer)) {
        streams = add_engram_block(builder, prefix, engram_index++, streams, d_streams);
      }
      streams = sublayer(prefix + "/mhc_attention", [&](BufferId in, BufferId d_in, bool residual) {
        if (options.attention_type == AttentionType::mla) {
          return add_mla_block(builder, prefix, in, d_in, {family.norm, out_std, residual});
        }
        return add_attention_block(builder, prefix, in, d_in,
                                   {family.norm, false, true, false, out_std, residual});
      });
      streams = sublayer(prefix + "/mhc_mlp", [&](BufferId in, BufferId d_in, bool residual) {
        if (options.moe.at(layer)) {
          return add_moe_block(builder, prefix, in, d_in, {options.moe, out_std, residual});
        }
        return add_mlp_block(builder, prefix, in, d_in, {family.norm, family.mlp, false, out_std, residual});
      });
    }
    if (!chunk.with_head) {
      add_chunk_end(builder, streams, d_streams);
    } else {
      const BufferId residual = mhc ? add_mhc_exit(builder, streams, d_streams, d_residual) : streams;
      const bool tied = options.tied_embeddings;
      add_final_norm_and_loss(builder, family.norm, residual,
                              tied ? tied_unembedding(builder, embedding) : kNoBuffer, d_residual);
    }
  });
}

}  // namespace meshtrain
