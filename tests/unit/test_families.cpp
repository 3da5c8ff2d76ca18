// The family table: one row per DecoderBlock, each consistent with the spec its builder declares.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <stdexcept>

#include "error_text.h"
#include "meshtrain/config/config.h"
#include "meshtrain/interchange/hf_names.h"
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
  overrides.insert(overrides.end(), {"base_num_decoder_layers=2", "per_device_batch_size=1",
                                     "max_target_length=16", "dataset_type=synthetic", "tokenizer_path="});
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

}  // namespace
}  // namespace meshtrain
