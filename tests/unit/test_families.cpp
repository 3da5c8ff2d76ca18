// The family table: one row per DecoderBlock, each consistent with the spec its builder declares; and each
// builder's layer chunks (a contiguous range of layers, with or without the embedding and the head).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <stdexcept>

#include "error_text.h"
#include "meshtrain/config/config.h"
#include "meshtrain/interchange/hf_names.h"
#include "meshtrain/kernels/backend.h"
#include "meshtrain/model/families.h"
#include "meshtrain/model/spec.h"

namespace meshtrain {
namespace {

using testing::error_of;

// A small config of each family (a new family needs its preset here).
Config family_config(DecoderBlock block, std::vector<std::string> overrides = {}) {
  static const std::map<DecoderBlock, std::string> kPresets = {{DecoderBlock::qwen3, "qwen3-tiny"},
                                                               {DecoderBlock::gpt2, "gpt2-124m"},
                                                               {DecoderBlock::deepseek, "deepseek-tiny"}};
  const bool layers_given = std::any_of(overrides.begin(), overrides.end(), [](const std::string& key) {
    return key.starts_with("base_num_decoder_layers=");
  });
  if (!layers_given) overrides.push_back("base_num_decoder_layers=2");
  overrides.insert(overrides.end(), {"per_device_batch_size=1", "max_target_length=16",
                                     "dataset_type=synthetic", "tokenizer_path="});
  return load_config(kPresets.at(block), overrides);
}

bool has_parameter(const ModelSpec& spec, const std::string& name) {
  return std::any_of(spec.parameters.begin(), spec.parameters.end(), [&](const ParameterDecl& parameter) {
    return spec.buffer(parameter.value).name == name;
  });
}

TEST(Families, OneRowPerDecoderBlockInItsOrder) {
  for (DecoderBlock block : kDecoderBlocks) {
    const DecoderFamily& family = family_of(block);
    EXPECT_EQ(family.block, block) << decoder_block_name(block);
    EXPECT_NE(family.build, nullptr) << decoder_block_name(block);
    EXPECT_EQ(&family_of(family_config(block)), &family) << decoder_block_name(block);
  }
}

TEST(Families, EachRowDescribesTheSpecItsBuilderDeclares) {
  for (DecoderBlock block : kDecoderBlocks) {
    SCOPED_TRACE(decoder_block_name(block));
    const DecoderFamily& family = family_of(block);
    const ModelSpec spec = build_model_spec(family_config(block));
    const bool learned = family.positions == PositionKind::learned;
    EXPECT_EQ(has_parameter(spec, "position_embedder/embedding"), learned);
    EXPECT_EQ(spec.dims.P > 0, learned);
    EXPECT_EQ(has_parameter(spec, "decoder/layers_0/pre_self_attention_layer_norm/bias"),
              family.norm == NormKind::layer);
    const bool swiglu = has_parameter(spec, "decoder/layers_0/mlp/wi_0/kernel");
    EXPECT_EQ(swiglu, family.mlp == MlpKind::swiglu);
    EXPECT_EQ(has_parameter(spec, "decoder/layers_0/mlp/wi/kernel"), family.mlp == MlpKind::gelu);
    EXPECT_EQ(family.mlp_input_matmuls(), swiglu ? 2 : 1);
  }
}

TEST(Families, RotaryFamiliesNeedAnEvenHeadDimAndLearnedOnesAPositionTable) {
  for (DecoderBlock block : kDecoderBlocks) {
    SCOPED_TRACE(decoder_block_name(block));
    const DecoderFamily& family = family_of(block);
    const Config config = family_config(block);
    if (family.positions == PositionKind::rotary) {
      // Multi-head latent attention rotates qk_rope_head_dim columns (head_dim is not read).
      const std::string rotated = config.attention_type == AttentionType::mla
                                      ? "qk_rope_head_dim=" + std::to_string(config.qk_rope_head_dim + 1)
                                      : "head_dim=" + std::to_string(config.head_dim + 1);
      const std::string message = error_of([&] { build_model_spec(family_config(block, {rotated})); });
      EXPECT_NE(message.find("even"), std::string::npos) << message;
    } else {
      const std::string message = error_of([&] {
        build_model_spec(family_config(
            block, {"max_position_embeddings=" + std::to_string(config.max_target_length - 1)}));
      });
      EXPECT_NE(message.find("max_position_embeddings"), std::string::npos) << message;
    }
  }
}

TEST(Families, AlwaysTiedFamiliesRefuseAnUntiedUnembedding) {
  for (DecoderBlock block : kDecoderBlocks) {
    SCOPED_TRACE(decoder_block_name(block));
    const Config untied = family_config(block, {"logits_via_embedding=false"});
    if (family_of(block).always_tied) {
      EXPECT_NE(error_of([&] { build_model_spec(untied); }).find("logits_via_embedding"), std::string::npos);
    } else {
      EXPECT_TRUE(has_parameter(build_model_spec(untied), "decoder/logits_dense/kernel"));
    }
  }
}

TEST(Families, TheHuggingFaceMappingCoversEveryFamily) {
  for (DecoderBlock block : kDecoderBlocks) {
    SCOPED_TRACE(decoder_block_name(block));
    const ModelSpec spec = build_model_spec(family_config(block));
    // One entry per parameter at least (the routed experts' E each): every parameter has a Hugging Face name.
    std::set<BufferId> mapped;
    for (const HfTensorMapping& entry : hf_mapping(spec)) mapped.insert(entry.parameter);
    EXPECT_EQ(mapped.size(), spec.parameters.size());
  }
}

// Layer chunks (a pipeline stage's part of the model): every parameter's canonical name, stacked layers
// member by member.
std::vector<std::string> canonical_names(const ModelSpec& spec) {
  std::vector<std::string> names;
  for (const ParameterDecl& parameter : spec.parameters) {
    if (parameter.members.empty()) names.push_back(parameter.canonical_name);
    for (const ParameterDecl::Member& member : parameter.members) names.push_back(member.canonical_name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

// The decoder layer a canonical name belongs to, or -1 (the embedding, the final norm, the unembedding).
int64_t layer_of(const std::string& name) {
  const std::string prefix = "decoder/layers_";
  if (!name.starts_with(prefix)) return -1;
  return std::stoll(name.substr(prefix.size(), name.find('/', prefix.size()) - prefix.size()));
}

bool embedding_name(const std::string& name) {
  return name.starts_with("token_embedder/") || name.starts_with("position_embedder/");
}

TEST(Families, AChunkHoldsExactlyItsLayersAndTheEmbeddingAndHeadItAsksFor) {
  const std::vector<std::pair<DecoderBlock, std::vector<std::string>>> models = {
      {DecoderBlock::qwen3, {"logits_via_embedding=false"}},
      {DecoderBlock::qwen3, {"logits_via_embedding=true"}},
      {DecoderBlock::gpt2, {}},
      {DecoderBlock::deepseek,
       {"num_experts=4", "num_experts_per_tok=2", "base_moe_mlp_dim=32", "first_num_dense_layers=1",
        "engram_layers=[0,1]", "engram_num_heads=2", "engram_head_dim=8", "engram_vocab_bases=[61,67]",
        "engram_kernel_size=3", "mhc_expansion_rate=4"}}};
  for (const auto& [block, overrides] : models) {
    const Config config = family_config(block, overrides);
    SCOPED_TRACE(decoder_block_name(block) + (config.logits_via_embedding ? std::string(" tied") : ""));
    const Mesh one_device;
    const kernels::KernelBackend& cpu = kernels::kernel_backend_for_device("cpu");
    const ModelSpec whole = build_model_spec(config);
    const std::vector<std::string> all = canonical_names(whole);
    ASSERT_EQ(whole.chunks.size(), 1u);
    ASSERT_EQ(whole.chunks.front().layers.last_layer, 1);
    // The first and last chunks of two stages, and both layers with neither end.
    const std::vector<LayerChunk> chunks = {{0, 0, true, false}, {1, 1, false, true}, {0, 1, false, false}};
    std::vector<std::string> joined;
    for (size_t c = 0; c < chunks.size(); ++c) {
      const LayerChunk& chunk = chunks[c];
      const ModelSpec spec = build_model_spec(config, one_device, cpu, {chunk});
      std::vector<std::string> expected;
      for (const std::string& name : all) {
        const int64_t layer = layer_of(name);
        const bool wanted = layer >= 0             ? layer >= chunk.first_layer && layer <= chunk.last_layer
                            : embedding_name(name) ? chunk.with_embedding
                                                   : chunk.with_head;
        if (wanted) expected.push_back(name);
      }
      // A tied head holds the embedding table too (the first and last pipeline chunks each hold it).
      if (chunk.with_head && !chunk.with_embedding && config.logits_via_embedding)
        expected.push_back("token_embedder/embedding");
      std::sort(expected.begin(), expected.end());
      const std::vector<std::string> names = canonical_names(spec);
      EXPECT_EQ(names, expected) << chunk.first_layer << ".." << chunk.last_layer;
      EXPECT_EQ(!spec.loss_forward.empty(), chunk.with_head);
      const bool reads_input =
          std::any_of(spec.buffers.begin(), spec.buffers.end(),
                      [](const BufferDecl& buffer) { return buffer.name == "chunk/input"; });
      EXPECT_EQ(reads_input, !chunk.with_embedding);
      if (c < 2) joined.insert(joined.end(), names.begin(), names.end());
    }
    // The first and last chunks together are the whole model (a tied table held by both).
    std::sort(joined.begin(), joined.end());
    joined.erase(std::unique(joined.begin(), joined.end()), joined.end());
    EXPECT_EQ(joined, all);
  }
}

TEST(Families, TheDefaultChunkIsTheWholeModelAndOthersAreChecked) {
  const Config config = family_config(DecoderBlock::qwen3);
  const ModelSpec whole = build_model_spec(config);
  const ModelSpec chunked = build_model_spec(config, Mesh{}, kernels::kernel_backend_for_device("cpu"),
                                             {LayerChunk{0, 1, true, true}});
  ASSERT_EQ(whole.buffers.size(), chunked.buffers.size());
  for (size_t i = 0; i < whole.buffers.size(); ++i) EXPECT_EQ(whole.buffers[i].name, chunked.buffers[i].name);
  ASSERT_EQ(whole.loss_backward.size(), chunked.loss_backward.size());
  for (size_t i = 0; i < whole.loss_backward.size(); ++i)
    EXPECT_EQ(whole.loss_backward[i].name, chunked.loss_backward[i].name);
  for (const LayerChunk& outside : {LayerChunk{1, 0, true, true}, LayerChunk{0, 2, true, true}}) {
    const std::string error = error_of(
        [&] { build_model_spec(config, Mesh{}, kernels::kernel_backend_for_device("cpu"), {outside}); });
    EXPECT_NE(error.find("layer chunk"), std::string::npos) << error;
  }
}

// A pipeline stage rank with virtual stages holds several chunks in one spec (here layers 0 and 2 of 4, the
// first with the embedding): each chunk's forward and backward ops are a contiguous range of the spec's
// lists, together every op once, each chunk's layers' ops and only theirs, and each chunk without the
// embedding reads its own input.
TEST(Families, SeveralChunksOfOneSpecEachHoldTheirOwnOps) {
  for (DecoderBlock block : kDecoderBlocks) {
    SCOPED_TRACE(decoder_block_name(block));
    const Config config = family_config(block, {"base_num_decoder_layers=4"});
    const ModelSpec spec = build_model_spec(config, Mesh{}, kernels::kernel_backend_for_device("cpu"),
                                            {LayerChunk{0, 0, true, false}, LayerChunk{2, 2, false, false}});
    ASSERT_EQ(spec.chunks.size(), 2u);
    const ChunkSection &first = spec.chunks[0], &second = spec.chunks[1];
    EXPECT_EQ(first.forward_begin, 0u);
    EXPECT_EQ(first.forward_end, second.forward_begin);
    EXPECT_EQ(second.forward_end, spec.forward.size());
    // Backward: the later chunk's first.
    EXPECT_EQ(second.backward_begin, 0u);
    EXPECT_EQ(second.backward_end, first.backward_begin);
    EXPECT_EQ(first.backward_end, spec.loss_backward.size());
    const auto layers_in = [](const std::vector<OpDecl>& ops, size_t begin, size_t end) {
      std::set<int64_t> layers;
      for (size_t i = begin; i < end; ++i) {
        const std::string& name = ops[i].name;
        const size_t at = name.find("layers_");
        if (at != std::string::npos) layers.insert(std::stoll(name.substr(at + 7)));
      }
      return layers;
    };
    EXPECT_EQ(layers_in(spec.forward, first.forward_begin, first.forward_end), std::set<int64_t>{0});
    EXPECT_EQ(layers_in(spec.forward, second.forward_begin, second.forward_end), std::set<int64_t>{2});
    EXPECT_EQ(layers_in(spec.loss_backward, first.backward_begin, first.backward_end), std::set<int64_t>{0});
    EXPECT_EQ(layers_in(spec.loss_backward, second.backward_begin, second.backward_end),
              std::set<int64_t>{2});
    EXPECT_EQ(first.boundary.input, kNoBuffer);
    ASSERT_NE(second.boundary.input, kNoBuffer);
    EXPECT_EQ(spec.buffer(second.boundary.input).name, "chunk_1/input");
    EXPECT_NE(first.boundary.output, kNoBuffer);
    EXPECT_NE(second.boundary.output, kNoBuffer);
    EXPECT_TRUE(spec.loss_forward.empty());
  }
}

}  // namespace
}  // namespace meshtrain
