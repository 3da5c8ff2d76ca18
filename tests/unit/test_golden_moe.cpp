// Golden mixture-of-experts models: logits, loss and every gradient of a tiny DeepSeek-V3 (multi-head latent
// attention, a dense first layer, then sigmoid routing with the selection bias and 4 groups keeping 2, one
// shared expert) and a tiny Qwen3-MoE (softmax routing, top-2 normalised) against float64 PyTorch
// re-expressions of Hugging Face's modeling code (tests/reference/deepseek_golden/make_golden.py), loaded
// through the Hugging Face mapping (interchange/hf_names.h: per-expert file tensors onto the stacked experts,
// interleaved rotary columns permuted).
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "golden_files.h"
#include "gradcheck.h"
#include "meshtrain/core/error.h"
#include "meshtrain/interchange/hf_names.h"
#include "meshtrain/io/safetensors.h"
#include "meshtrain/kernels/cpu/cross_entropy.h"
#include "meshtrain/runtime/engine.h"

namespace meshtrain {
namespace {

const std::string kGoldenDir = std::string(MESHTRAIN_SOURCE_DIR) + "/tests/reference/deepseek_golden/";

// Qwen3-MoE's dense layers (mlp_only_layers) as the engine has them: the leading first_num_dense_layers.
int64_t leading_dense_layers(const nlohmann::json& hf) {
  const std::vector<int64_t> dense = hf.at("mlp_only_layers").get<std::vector<int64_t>>();
  for (size_t i = 0; i < dense.size(); ++i)
    MT_CHECK(dense[i] == static_cast<int64_t>(i), "mlp_only_layers are the leading layers");
  MT_CHECK(hf.at("decoder_sparse_step").get<int64_t>() == 1, "every other layer has experts");
  return static_cast<int64_t>(dense.size());
}

// The engine config equivalent to the fixture's Hugging Face config.json (DeepseekV3 or Qwen3Moe).
Config config_from_hf(const std::string& path, int64_t batch, int64_t length) {
  const nlohmann::json hf = nlohmann::json::parse(std::ifstream(path));
  const auto key = [&](const char* name) { return hf.at(name).dump(); };
  std::vector<std::string> overrides = {
      "base_emb_dim=" + key("hidden_size"),
      "base_mlp_dim=" + key("intermediate_size"),
      "base_num_decoder_layers=" + key("num_hidden_layers"),
      "base_num_query_heads=" + key("num_attention_heads"),
      "base_num_kv_heads=" + key("num_key_value_heads"),
      "vocab_size=" + key("vocab_size"),
      "normalization_layer_epsilon=" + key("rms_norm_eps"),
      "rope_max_timescale=" + key("rope_theta"),
      "logits_via_embedding=" + key("tie_word_embeddings"),
      "num_experts_per_tok=" + key("num_experts_per_tok"),
      "base_moe_mlp_dim=" + key("moe_intermediate_size"),
      "norm_topk_prob=" + key("norm_topk_prob"),
      "load_balance_loss_weight=0",  // HF's causal-LM loss without the router auxiliary loss
      "capacity_factor=0",           // dropless, as HF
      "per_device_batch_size=" + std::to_string(batch),
      "max_target_length=" + std::to_string(length)};
  if (hf.at("model_type") == "deepseek_v3") {
    const int64_t qk_head_dim =
        hf.at("qk_nope_head_dim").get<int64_t>() + hf.at("qk_rope_head_dim").get<int64_t>();
    overrides.insert(
        overrides.end(),
        {"head_dim=" + std::to_string(qk_head_dim),
         "q_lora_rank=" + (hf.at("q_lora_rank").is_null() ? std::string("0") : key("q_lora_rank")),
         "kv_lora_rank=" + key("kv_lora_rank"), "qk_nope_head_dim=" + key("qk_nope_head_dim"),
         "qk_rope_head_dim=" + key("qk_rope_head_dim"), "v_head_dim=" + key("v_head_dim"),
         "first_num_dense_layers=" + key("first_k_dense_replace"), "num_experts=" + key("n_routed_experts"),
         "shared_experts=" + key("n_shared_experts"), "routed_score_func=sigmoid", "routed_bias=true",
         "routed_scaling_factor=" + key("routed_scaling_factor"), "n_routing_groups=" + key("n_group"),
         "topk_routing_group=" + key("topk_group")});
    return load_config("deepseek-tiny", overrides);
  }
  overrides.insert(overrides.end(), {"head_dim=" + key("head_dim"), "num_experts=" + key("num_experts"),
                                     "first_num_dense_layers=" + std::to_string(leading_dense_layers(hf)),
                                     "shared_experts=0", "routed_score_func=softmax", "routed_bias=false",
                                     "n_routing_groups=1", "topk_routing_group=1"});
  return load_config("qwen3-tiny", overrides);
}

using testing::golden_batch;
using testing::read_all;

const ParameterDecl& parameter_of(const ModelSpec& spec, BufferId value) {
  for (const ParameterDecl& parameter : spec.parameters) {
    if (parameter.value == value) return parameter;
  }
  MT_CHECK(false, "a mapping entry names a parameter of the spec");
  return spec.parameters.front();
}

// The file tensor's elements gathered from an engine buffer laid out like the entry's parameter.
std::vector<float> in_file_layout(const HfTensorMapping& entry, const float* engine, float scale) {
  const int64_t rows = std::max<int64_t>(entry.hf_rows, 1);
  std::vector<float> values(static_cast<size_t>(rows * entry.hf_cols));
  for (int64_t row = 0; row < rows; ++row) {
    for (int64_t col = 0; col < entry.hf_cols; ++col) {
      values[static_cast<size_t>(row * entry.hf_cols + col)] =
          engine[engine_element(entry, row, col)] * scale;
    }
  }
  return values;
}

void check_variant(const std::string& variant) {
  const SafetensorsFile weights = SafetensorsFile::open(kGoldenDir + variant + "/model.safetensors");
  const SafetensorsFile golden = SafetensorsFile::open(kGoldenDir + variant + "/golden.safetensors");
  const std::vector<int64_t> token_shape = golden.find("inputs")->shape;
  const int64_t B = token_shape[0], S = token_shape[1], N = B * S;
  Engine engine(config_from_hf(kGoldenDir + variant + "/config.json", B, S));
  const ModelSpec& spec = engine.spec();
  ASSERT_FALSE(spec.config.logits_via_embedding);
  load_hf_weights(weights, spec, [&](BufferId id) { return engine.view(id).f32(); });
  const std::vector<HfTensorMapping> mapping = hf_mapping(spec);
  // Every file tensor is mapped, once.
  EXPECT_EQ(mapping.size(), weights.entries().size());

  const Batch batch = golden_batch(golden);
  engine.set_poison_temporaries(true);

  // Logits from the forward-only kernel (the training kernel's backward reuses the final hidden's memory).
  const LossSums eval_sums = engine.eval(batch);
  const ModelDims& m = spec.dims;
  BufferId unembedding = kNoBuffer;
  for (const ParameterDecl& parameter : spec.parameters) {
    if (spec.buffer(parameter.value).name == "decoder/logits_dense/kernel") unembedding = parameter.value;
  }
  ASSERT_NE(unembedding, kNoBuffer);
  std::vector<float> logits(static_cast<size_t>(N * m.V));
  kernels::unembed_logits(logits.data(), engine.view(spec.final_hidden).f32(), engine.view(unembedding).f32(),
                          kernels::UnembedLayout::kernel_DV, N, m.D, m.V, m.V_valid);
  const double logits_error = testing::relative_error(logits, read_all(golden, "logits"));
  testing::report_error(variant + " logits", logits_error, 1e-5);
  EXPECT_LT(logits_error, 1e-5);

  const LossSums sums = engine.fwd_bwd(batch);
  EXPECT_EQ(sums.loss_sum, eval_sums.loss_sum);  // the same forward

  // float32 end to end against a float64 reference: a few ulps of accumulated rounding.
  const double golden_loss = static_cast<double>(read_all(golden, "loss")[0]);
  const double loss_error =
      std::fabs(sums.loss_sum / static_cast<double>(sums.valid_count) - golden_loss) / golden_loss;
  testing::report_error(variant + " loss", loss_error, 2e-6);
  EXPECT_LT(loss_error, 2e-6);
  EXPECT_EQ(sums.valid_count, N);

  // The engine's gradients are of the loss SUM (the step divides by the global count); the golden's of the
  // mean. The selection bias has none: it must still be the file's after the step's forward and backward.
  int64_t biases = 0;
  for (const HfTensorMapping& entry : mapping) {
    const ParameterDecl& parameter = parameter_of(spec, entry.parameter);
    if (!entry.differentiable) {
      ++biases;
      EXPECT_EQ(golden.find("grad." + entry.hf_name), nullptr) << entry.hf_name;
      EXPECT_EQ(in_file_layout(entry, engine.view(parameter.value).f32(), 1.0f),
                read_all(weights, entry.hf_name))
          << entry.hf_name;
      continue;
    }
    const std::vector<float> actual =
        in_file_layout(entry, engine.view(parameter.gradient).f32(), 1.0f / static_cast<float>(N));
    const double error = testing::relative_error(actual, read_all(golden, "grad." + entry.hf_name));
    testing::report_error(variant + " grad " + entry.hf_name, error, 1e-5);
    EXPECT_LT(error, 1e-5) << entry.hf_name;
  }
  EXPECT_EQ(biases, spec.config.routed_bias ? m.L - spec.config.first_num_dense_layers : 0);
}

// A DeepSeek-V3 checkpoint's selection bias has nowhere to go without routed_bias: an error naming the key.
TEST(GoldenMoe, DeepSeekV3CheckpointNeedsRoutedBias) {
  Config config = config_from_hf(kGoldenDir + "deepseek_v3/config.json", 2, 12);
  config.routed_bias = false;
  Engine engine(config);
  const SafetensorsFile weights = SafetensorsFile::open(kGoldenDir + "deepseek_v3/model.safetensors");
  try {
    load_hf_weights(weights, engine.spec(), [&](BufferId id) { return engine.view(id).f32(); });
    ADD_FAILURE() << "loaded a checkpoint's selection bias into a model without one";
  } catch (const MeshError& error) {
    EXPECT_NE(std::string(error.what()).find("model.layers.1.mlp.gate.e_score_correction_bias"),
              std::string::npos)
        << error.what();
    EXPECT_NE(std::string(error.what()).find("routed_bias=true"), std::string::npos) << error.what();
  }
}

TEST(GoldenMoe, DeepSeekV3MatchesPyTorch) {
  check_variant("deepseek_v3");
}
// Queries projected directly (HF q_lora_rank null: q_proj; the engine's q_lora_rank 0, self_attention/query).
TEST(GoldenMoe, DeepSeekV3DirectQueriesMatchPyTorch) {
  check_variant("deepseek_v3_direct_q");
}
TEST(GoldenMoe, Qwen3MoeMatchesPyTorch) {
  check_variant("qwen3_moe");
}
// A dense first layer (HF mlp_only_layers [0]; the engine's first_num_dense_layers 1).
TEST(GoldenMoe, Qwen3MoeWithADenseFirstLayerMatchesPyTorch) {
  check_variant("qwen3_moe_dense_first");
}

}  // namespace
}  // namespace meshtrain
