// The family table (see families.h): one row per DecoderBlock, in the enum's order.
#include "meshtrain/model/families.h"

#include "meshtrain/core/error.h"

namespace meshtrain {
namespace {

const std::array<DecoderFamily, kDecoderBlocks.size()> kFamilies = {{
    {DecoderBlock::qwen3, build_qwen3, PositionKind::rotary, NormKind::rms, MlpKind::swiglu, false},
    {DecoderBlock::gpt2, build_gpt2, PositionKind::learned, NormKind::layer, MlpKind::gelu, true},
    {DecoderBlock::deepseek, build_deepseek, PositionKind::rotary, NormKind::rms, MlpKind::swiglu, false},
}};

}  // namespace

const DecoderFamily& family_of(DecoderBlock block) {
  const DecoderFamily& family = kFamilies[static_cast<size_t>(block)];
  MT_CHECK(family.block == block, "the family table lists one row per DecoderBlock, in its order");
  return family;
}

const DecoderFamily& family_of(const Config& config) {
  return family_of(config.decoder_block);
}

BufferId add_chunk_input(SpecBuilder& builder, const Shape& shape, BufferId d_input) {
  ChunkBoundary& boundary = builder.chunk().boundary;
  const size_t k = builder.chunk_index();
  boundary.input = builder.input(k == 0 ? "chunk/input" : "chunk_" + std::to_string(k) + "/input",
                                 builder.storage_dtype(), shape);
  boundary.input_gradient = d_input;
  return boundary.input;
}

void add_chunk_end(SpecBuilder& builder, BufferId output, BufferId d_output) {
  builder.chunk().boundary.output = output;
  builder.chunk().boundary.output_gradient = d_output;
}

EmbeddingLayer add_chunk_start(SpecBuilder& builder, bool learned_positions, BufferId d_residual) {
  if (builder.chunk().layers.with_embedding) return add_embedding(builder, learned_positions, d_residual);
  return {add_chunk_input(builder, token_shape(builder.dims(), {{"embed", builder.dims().D}}), d_residual),
          kNoBuffer};
}

BufferId tied_unembedding(SpecBuilder& builder, const EmbeddingLayer& embedding) {
  if (embedding.table != kNoBuffer) return embedding.table;
  const BufferId earlier = builder.spec().embedding_table;  // an earlier chunk of this spec's
  return earlier != kNoBuffer ? earlier : add_embedding_table(builder);
}

}  // namespace meshtrain
