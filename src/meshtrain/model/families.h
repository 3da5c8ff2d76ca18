// Decoder families: one row per DecoderBlock saying what the family is (its builder and the facts the rest
// of the tree asks about it), and the builders, each declaring its layers into a SpecBuilder whose inputs
// already exist. A new family is one new row here and its builder.
#pragma once

#include "meshtrain/config/config.h"
#include "meshtrain/model/layers/embedding.h"
#include "meshtrain/model/layers/mlp.h"
#include "meshtrain/model/layers/norm.h"
#include "meshtrain/model/spec_builder.h"

namespace meshtrain {

// How token positions enter the model.
enum class PositionKind {
  rotary,   // RoPE inside attention: head_dim must be even (it rotates pairs of dimensions); no length limit
  learned,  // a [max_position_embeddings, D] table added to the embedding: the sequence ends at its rows
};

struct DecoderFamily {
  DecoderBlock block = DecoderBlock::qwen3;
  void (*build)(SpecBuilder& builder) = nullptr;
  PositionKind positions = PositionKind::rotary;
  NormKind norm = NormKind::rms;
  MlpKind mlp = MlpKind::swiglu;
  bool always_tied = false;  // the unembedding is the embedding table (logits_via_embedding=true)

  // Matmuls reading the MLP input (the standard FLOP count): SwiGLU has gate and up, GELU one.
  int64_t mlp_input_matmuls() const { return mlp == MlpKind::swiglu ? 2 : 1; }
};

// The row of `block`, and of the config's decoder_block.
const DecoderFamily& family_of(DecoderBlock block);
const DecoderFamily& family_of(const Config& config);

// Each builder declares the layers of each of the spec's chunks (ModelSpec::chunks), with the embedding and
// the head where a chunk holds them, chunk by chunk through for_each_chunk. A chunk without the embedding
// starts from the previous pipeline stage's activation: an input named "chunk/input" of `shape` (the
// residual, or under mHC its streams). `d_input`: the gradient buffer its backward leaves the input's
// gradient in.
BufferId add_chunk_input(SpecBuilder& builder, const Shape& shape, BufferId d_input);
// A chunk that ends before the head: its last residual (or streams) `output`, whose gradient its backward
// starts from in `d_output` (ModelSpec::boundary).
void add_chunk_end(SpecBuilder& builder, BufferId output, BufferId d_output);
// The residual entering the chunk's first layer: the embedding's output, or the chunk's input (no table).
EmbeddingLayer add_chunk_start(SpecBuilder& builder, bool learned_positions, BufferId d_residual);
// A tied head's unembedding: the embedding table, declared again in a chunk without the embedding.
BufferId tied_unembedding(SpecBuilder& builder, const EmbeddingLayer& embedding);

// Calls `declare(chunk)` for each of the spec's chunks in turn, recording where its ops lie
// (SpecBuilder::begin_chunk / end_chunk).
template <class Declare>
void for_each_chunk(SpecBuilder& builder, const Declare& declare) {
  for (size_t k = 0; k < builder.spec().chunks.size(); ++k) {
    builder.begin_chunk(k);
    declare(builder.chunk().layers);
    builder.end_chunk();
  }
}

// Qwen3: pre-norm RMSNorm, per-head QK-norm before RoPE, GQA, SwiGLU, tied or untied unembedding.
void build_qwen3(SpecBuilder& builder);
// GPT-2: LayerNorm, GELU, learned positions, biases, tied embeddings.
void build_gpt2(SpecBuilder& builder);
// DeepSeek-V2/V3: pre-norm RMSNorm, multi-head latent attention (attention_type=mla; global: GQA without
// QK-norm), dense SwiGLU MLPs (the MoE layer comes next), tied or untied unembedding.
void build_deepseek(SpecBuilder& builder);

}  // namespace meshtrain
