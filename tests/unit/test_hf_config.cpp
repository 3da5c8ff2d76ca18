// Hugging Face config.json <-> meshtrain config keys (interchange/hf_config.h): each family from the files
// transformers' save_pretrained writes (4.51.3, 4.57.1 and 5.25.0, pasted verbatim), key by key; the special
// token ids and recipe keys beside the shape; every refusal's message; and config -> config.json -> config
// for each preset family.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iomanip>
#include <map>
#include <set>
#include <sstream>

#include "error_text.h"
#include "meshtrain/config/config.h"
#include "meshtrain/interchange/hf_config.h"
#include "meshtrain/model/spec.h"

namespace meshtrain {
namespace {

using testing::error_of;
using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;  // what the export returns

const char* const kPath = "/models/tiny/config.json";

// transformers 4.51.3: Qwen3Config(...) shaped as Qwen/Qwen3-0.6B (torch_dtype, top-level rope_theta,
// sliding_window 4096 with use_sliding_window false).
const char* const kQwen3V451 = R"json({
  "architectures": [
    "Qwen3ForCausalLM"
  ],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151645,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 1024,
  "initializer_range": 0.02,
  "intermediate_size": 3072,
  "max_position_embeddings": 40960,
  "max_window_layers": 28,
  "model_type": "qwen3",
  "num_attention_heads": 16,
  "num_hidden_layers": 28,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000.0,
  "sliding_window": 4096,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.51.3",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
}
)json";

// transformers 4.57.1: qwen3-tiny's shapes (dtype, layer_types, rope_scaling null).
const char* const kQwen3V457 = R"json({
  "architectures": [
    "Qwen3ForCausalLM"
  ],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "dtype": "bfloat16",
  "head_dim": 64,
  "hidden_act": "silu",
  "hidden_size": 384,
  "initializer_range": 0.02,
  "intermediate_size": 1024,
  "layer_types": [
    "full_attention",
    "full_attention",
    "full_attention",
    "full_attention",
    "full_attention",
    "full_attention"
  ],
  "max_position_embeddings": 128,
  "max_window_layers": 28,
  "model_type": "qwen3",
  "num_attention_heads": 6,
  "num_hidden_layers": 6,
  "num_key_value_heads": 2,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000.0,
  "sliding_window": null,
  "tie_word_embeddings": true,
  "transformers_version": "4.57.1",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 8192
}
)json";

// transformers 5.25.0: the same model (rope_parameters, null token ids).
const char* const kQwen3V525 = R"json({
  "architectures": [
    "Qwen3ForCausalLM"
  ],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": null,
  "dtype": "bfloat16",
  "eos_token_id": null,
  "head_dim": 64,
  "hidden_act": "silu",
  "hidden_size": 384,
  "initializer_range": 0.02,
  "intermediate_size": 1024,
  "layer_types": [
    "full_attention",
    "full_attention",
    "full_attention",
    "full_attention",
    "full_attention",
    "full_attention"
  ],
  "max_position_embeddings": 128,
  "max_window_layers": 28,
  "model_type": "qwen3",
  "num_attention_heads": 6,
  "num_hidden_layers": 6,
  "num_key_value_heads": 2,
  "pad_token_id": null,
  "rms_norm_eps": 1e-06,
  "rope_parameters": {
    "rope_theta": 1000000.0,
    "rope_type": "default"
  },
  "sliding_window": null,
  "tie_word_embeddings": true,
  "transformers_version": "5.25.0",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 8192
}
)json";

// transformers 4.51.3: Qwen3MoeConfig(...) shaped as Qwen/Qwen3-30B-A3B.
const char* const kQwen3MoeV451 = R"json({
  "architectures": [
    "Qwen3MoeForCausalLM"
  ],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "decoder_sparse_step": 1,
  "eos_token_id": 151645,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 6144,
  "max_position_embeddings": 40960,
  "max_window_layers": 48,
  "mlp_only_layers": [],
  "model_type": "qwen3_moe",
  "moe_intermediate_size": 768,
  "norm_topk_prob": true,
  "num_attention_heads": 32,
  "num_experts": 128,
  "num_experts_per_tok": 8,
  "num_hidden_layers": 48,
  "num_key_value_heads": 4,
  "output_router_logits": false,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000.0,
  "router_aux_loss_coef": 0.001,
  "sliding_window": null,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.51.3",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
}
)json";

// transformers 5.25.0: a small Qwen3-MoE with a dense first layer (num_local_experts).
const char* const kQwen3MoeV525 = R"json({
  "architectures": [
    "Qwen3MoeForCausalLM"
  ],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": null,
  "decoder_sparse_step": 1,
  "eos_token_id": null,
  "head_dim": 64,
  "hidden_act": "silu",
  "hidden_size": 384,
  "initializer_range": 0.02,
  "intermediate_size": 1024,
  "max_position_embeddings": 128,
  "mlp_only_layers": [
    0
  ],
  "model_type": "qwen3_moe",
  "moe_intermediate_size": 256,
  "norm_topk_prob": false,
  "num_attention_heads": 6,
  "num_experts_per_tok": 2,
  "num_hidden_layers": 6,
  "num_key_value_heads": 2,
  "num_local_experts": 8,
  "output_router_logits": false,
  "pad_token_id": null,
  "rms_norm_eps": 1e-06,
  "rope_parameters": {
    "rope_theta": 1000000.0,
    "rope_type": "default"
  },
  "router_aux_loss_coef": 0.001,
  "sliding_window": null,
  "tie_word_embeddings": false,
  "transformers_version": "5.25.0",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 8192
}
)json";

// transformers 5.25.0: Qwen3MoeConfig() (no head_dim key: the attention uses hidden_size / heads).
const char* const kQwen3MoeDefaultV525 = R"json({
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": null,
  "decoder_sparse_step": 1,
  "eos_token_id": null,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 6144,
  "max_position_embeddings": 32768,
  "mlp_only_layers": [],
  "model_type": "qwen3_moe",
  "moe_intermediate_size": 768,
  "norm_topk_prob": false,
  "num_attention_heads": 32,
  "num_experts_per_tok": 8,
  "num_hidden_layers": 24,
  "num_key_value_heads": 4,
  "num_local_experts": 128,
  "output_router_logits": false,
  "pad_token_id": null,
  "rms_norm_eps": 1e-06,
  "rope_parameters": {
    "rope_theta": 10000.0,
    "rope_type": "default"
  },
  "router_aux_loss_coef": 0.001,
  "sliding_window": null,
  "tie_word_embeddings": false,
  "transformers_version": "5.25.0",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
}
)json";

// transformers 4.57.1: DeepseekV3Config(...) with deepseek-tiny's shapes.
const char* const kDeepseekV457 = R"json({
  "architectures": [
    "DeepseekV3ForCausalLM"
  ],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 0,
  "eos_token_id": 1,
  "first_k_dense_replace": 1,
  "head_dim": 16,
  "hidden_act": "silu",
  "hidden_size": 384,
  "initializer_range": 0.02,
  "intermediate_size": 1024,
  "kv_lora_rank": 64,
  "max_position_embeddings": 128,
  "model_type": "deepseek_v3",
  "moe_intermediate_size": 256,
  "n_group": 1,
  "n_routed_experts": 8,
  "n_shared_experts": 1,
  "norm_topk_prob": true,
  "num_attention_heads": 6,
  "num_experts_per_tok": 2,
  "num_hidden_layers": 6,
  "num_key_value_heads": 6,
  "pretraining_tp": 1,
  "q_lora_rank": 192,
  "qk_head_dim": 48,
  "qk_nope_head_dim": 32,
  "qk_rope_head_dim": 16,
  "rms_norm_eps": 1e-06,
  "rope_interleave": true,
  "rope_scaling": null,
  "rope_theta": 10000.0,
  "routed_scaling_factor": 1.0,
  "tie_word_embeddings": false,
  "topk_group": 1,
  "transformers_version": "4.57.1",
  "use_cache": true,
  "v_head_dim": 32,
  "vocab_size": 8192
}
)json";

// transformers 5.25.0: the same model (rope_parameters, num_nextn_predict_layers).
const char* const kDeepseekV525 = R"json({
  "architectures": [
    "DeepseekV3ForCausalLM"
  ],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 0,
  "eos_token_id": 1,
  "first_k_dense_replace": 1,
  "head_dim": 16,
  "hidden_act": "silu",
  "hidden_size": 384,
  "initializer_range": 0.02,
  "intermediate_size": 1024,
  "kv_lora_rank": 64,
  "max_position_embeddings": 128,
  "model_type": "deepseek_v3",
  "moe_intermediate_size": 256,
  "n_group": 1,
  "n_routed_experts": 8,
  "n_shared_experts": 1,
  "norm_topk_prob": true,
  "num_attention_heads": 6,
  "num_experts_per_tok": 2,
  "num_hidden_layers": 6,
  "num_key_value_heads": 6,
  "num_nextn_predict_layers": 1,
  "output_router_logits": false,
  "pad_token_id": null,
  "pretraining_tp": 1,
  "q_lora_rank": 192,
  "qk_head_dim": 48,
  "qk_nope_head_dim": 32,
  "qk_rope_head_dim": 16,
  "rms_norm_eps": 1e-06,
  "rope_interleave": true,
  "rope_parameters": {
    "rope_theta": 10000.0,
    "rope_type": "default"
  },
  "routed_scaling_factor": 1.0,
  "tie_word_embeddings": false,
  "topk_group": 1,
  "transformers_version": "5.25.0",
  "use_cache": true,
  "v_head_dim": 32,
  "vocab_size": 8192
}
)json";

// transformers 4.57.1: GPT2Config() (GPT-2 124M).
const char* const kGpt2V457 = R"json({
  "activation_function": "gelu_new",
  "architectures": [
    "GPT2LMHeadModel"
  ],
  "attn_pdrop": 0.1,
  "bos_token_id": 50256,
  "embd_pdrop": 0.1,
  "eos_token_id": 50256,
  "initializer_range": 0.02,
  "layer_norm_epsilon": 1e-05,
  "model_type": "gpt2",
  "n_embd": 768,
  "n_head": 12,
  "n_inner": null,
  "n_layer": 12,
  "n_positions": 1024,
  "reorder_and_upcast_attn": false,
  "resid_pdrop": 0.1,
  "scale_attn_by_inverse_layer_idx": false,
  "scale_attn_weights": true,
  "summary_activation": null,
  "summary_first_dropout": 0.1,
  "summary_proj_to_labels": true,
  "summary_type": "cls_index",
  "summary_use_proj": true,
  "transformers_version": "4.57.1",
  "use_cache": true,
  "vocab_size": 50257
}
)json";

// transformers 5.25.0: the same.
const char* const kGpt2V525 = R"json({
  "activation_function": "gelu_new",
  "add_cross_attention": false,
  "architectures": [
    "GPT2LMHeadModel"
  ],
  "attn_pdrop": 0.1,
  "bos_token_id": 50256,
  "embd_pdrop": 0.1,
  "eos_token_id": 50256,
  "initializer_range": 0.02,
  "layer_norm_epsilon": 1e-05,
  "model_type": "gpt2",
  "n_embd": 768,
  "n_head": 12,
  "n_inner": null,
  "n_layer": 12,
  "n_positions": 1024,
  "pad_token_id": null,
  "reorder_and_upcast_attn": false,
  "resid_pdrop": 0.1,
  "scale_attn_by_inverse_layer_idx": false,
  "scale_attn_weights": true,
  "summary_activation": null,
  "summary_first_dropout": 0.1,
  "summary_proj_to_labels": true,
  "summary_type": "cls_index",
  "summary_use_proj": true,
  "tie_word_embeddings": true,
  "transformers_version": "5.25.0",
  "use_cache": true,
  "vocab_size": 50257
}
)json";

// DeepSeek's own config.json for deepseek-ai/DeepSeek-V3 (trust_remote_code keys: topk_method, scoring_func,
// moe_layer_freq, ...; FP8 weights, YaRN), trimmed of auto_map.
const char* const kDeepseekV3Hub = R"json({
  "architectures": ["DeepseekV3ForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "aux_loss_alpha": 0.001,
  "bos_token_id": 0,
  "eos_token_id": 1,
  "ep_size": 1,
  "first_k_dense_replace": 3,
  "hidden_act": "silu",
  "hidden_size": 7168,
  "initializer_range": 0.02,
  "intermediate_size": 18432,
  "kv_lora_rank": 512,
  "max_position_embeddings": 163840,
  "model_type": "deepseek_v3",
  "moe_intermediate_size": 2048,
  "moe_layer_freq": 1,
  "n_group": 8,
  "n_routed_experts": 256,
  "n_shared_experts": 1,
  "norm_topk_prob": true,
  "num_attention_heads": 128,
  "num_experts_per_tok": 8,
  "num_hidden_layers": 61,
  "num_key_value_heads": 128,
  "num_nextn_predict_layers": 1,
  "q_lora_rank": 1536,
  "qk_nope_head_dim": 128,
  "qk_rope_head_dim": 64,
  "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                          "weight_block_size": [128, 128]},
  "rms_norm_eps": 1e-06,
  "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                   "original_max_position_embeddings": 4096, "type": "yarn"},
  "rope_theta": 10000,
  "routed_scaling_factor": 2.5,
  "scoring_func": "sigmoid",
  "seq_aux": true,
  "tie_word_embeddings": false,
  "topk_group": 4,
  "topk_method": "noaux_tc",
  "torch_dtype": "bfloat16",
  "transformers_version": "4.33.1",
  "use_cache": true,
  "v_head_dim": 128,
  "vocab_size": 129280
})json";

// The overrides as key -> value; each key once.
std::map<std::string, std::string> keys_of(const HfModelConfig& imported) {
  std::map<std::string, std::string> keys;
  for (const std::string& line : imported.overrides) {
    const size_t equals = line.find('=');
    EXPECT_NE(equals, std::string::npos) << line;
    EXPECT_TRUE(keys.emplace(line.substr(0, equals), line.substr(equals + 1)).second) << "twice: " << line;
  }
  return keys;
}

// The overrides less the special token ids, which the 4.x and 5.x files of one model state differently (5.x
// writes null where 4.x had no key).
std::vector<std::string> without_token_ids(const HfModelConfig& imported) {
  std::vector<std::string> lines = imported.overrides;
  std::erase_if(lines, [](const std::string& line) { return line.starts_with("hf_"); });
  return lines;
}

HfModelConfig import_text(const std::string& text) {
  return hf_config_to_meshtrain(Json::parse(text), kPath);
}

Config load(const HfModelConfig& imported) {
  return load_config(imported.preset, imported.overrides);
}

std::string text_of(double value) {
  std::ostringstream out;
  out << std::setprecision(17) << value;
  return out.str();
}

// Every key of hf_model_shape_keys() as the loaded Config holds it (parsed values: "1e-06" and "1.0e-6"
// compare equal).
std::map<std::string, std::string> shape_of(const Config& c) {
  std::string engram = "[";
  for (int64_t layer : c.engram_layers) engram += std::to_string(layer) + ",";
  const std::map<std::string, std::string> shape = {
      {"decoder_block", decoder_block_name(c.decoder_block)},
      {"base_emb_dim", std::to_string(c.base_emb_dim)},
      {"base_num_query_heads", std::to_string(c.base_num_query_heads)},
      {"base_num_kv_heads", std::to_string(c.base_num_kv_heads)},
      {"head_dim", std::to_string(c.head_dim)},
      {"base_mlp_dim", std::to_string(c.base_mlp_dim)},
      {"base_num_decoder_layers", std::to_string(c.base_num_decoder_layers)},
      {"vocab_size", std::to_string(c.vocab_size)},
      {"max_position_embeddings", std::to_string(c.max_position_embeddings)},
      {"logits_via_embedding", c.logits_via_embedding ? "true" : "false"},
      {"normalization_layer_epsilon", text_of(c.normalization_layer_epsilon)},
      {"rope_max_timescale", text_of(c.rope_max_timescale)},
      {"attention_type", attention_type_name(c.attention_type)},
      {"q_lora_rank", std::to_string(c.q_lora_rank)},
      {"kv_lora_rank", std::to_string(c.kv_lora_rank)},
      {"qk_nope_head_dim", std::to_string(c.qk_nope_head_dim)},
      {"qk_rope_head_dim", std::to_string(c.qk_rope_head_dim)},
      {"v_head_dim", std::to_string(c.v_head_dim)},
      {"num_experts", std::to_string(c.num_experts)},
      {"num_experts_per_tok", std::to_string(c.num_experts_per_tok)},
      {"base_moe_mlp_dim", std::to_string(c.base_moe_mlp_dim)},
      {"first_num_dense_layers", std::to_string(c.first_num_dense_layers)},
      {"shared_experts", std::to_string(c.shared_experts)},
      {"routed_score_func", routed_score_func_name(c.routed_score_func)},
      {"routed_bias", c.routed_bias ? "true" : "false"},
      {"routed_scaling_factor", text_of(c.routed_scaling_factor)},
      {"norm_topk_prob", c.norm_topk_prob ? "true" : "false"},
      {"n_routing_groups", std::to_string(c.n_routing_groups)},
      {"topk_routing_group", std::to_string(c.topk_routing_group)},
      {"capacity_factor", text_of(c.capacity_factor)},
      {"engram_layers", engram + "]"},
      {"mhc_expansion_rate", std::to_string(c.mhc_expansion_rate)}};
  // A key added to the import needs its line here.
  EXPECT_EQ(shape.size(), hf_model_shape_keys().size());
  for (const std::string& key : hf_model_shape_keys()) EXPECT_EQ(shape.count(key), 1u) << key;
  return shape;
}

// The import sets exactly the model-shape keys, the model's recipe and special token ids (and gpt2 its
// sequence length), and they build a model.
void expect_complete(const HfModelConfig& imported) {
  std::set<std::string> expected(hf_model_shape_keys().begin(), hf_model_shape_keys().end());
  expected.insert({"routed_bias_update_rate", "hf_bos_token_id", "hf_eos_token_id", "hf_pad_token_id"});
  if (imported.model_type == "gpt2") expected.insert("max_target_length");
  std::set<std::string> found;
  for (const auto& [key, value] : keys_of(imported)) found.insert(key);
  EXPECT_EQ(found, expected);
  EXPECT_GT(build_model_spec(load(imported)).parameter_count(), 0);
}

TEST(HfConfig, ShapeKeysAreConfigKeysOnce) {
  const std::vector<std::string> known = config_key_names();
  std::set<std::string> seen;
  for (const std::string& key : hf_model_shape_keys()) {
    EXPECT_NE(std::find(known.begin(), known.end(), key), known.end()) << key;
    EXPECT_TRUE(seen.insert(key).second) << key;
  }
}

TEST(HfConfig, Qwen3FromTransformers451IsQwen3_06B) {
  const HfModelConfig imported = import_text(kQwen3V451);
  EXPECT_EQ(imported.model_type, "qwen3");
  EXPECT_EQ(imported.preset, "qwen3-tiny");
  EXPECT_EQ(imported.weight_dtype, "bfloat16");  // torch_dtype
  const auto keys = keys_of(imported);
  EXPECT_EQ(keys.at("decoder_block"), "qwen3");
  EXPECT_EQ(keys.at("base_emb_dim"), "1024");
  EXPECT_EQ(keys.at("base_num_query_heads"), "16");
  EXPECT_EQ(keys.at("base_num_kv_heads"), "8");
  EXPECT_EQ(keys.at("head_dim"), "128");  // not hidden / heads = 64
  EXPECT_EQ(keys.at("base_mlp_dim"), "3072");
  EXPECT_EQ(keys.at("base_num_decoder_layers"), "28");
  EXPECT_EQ(keys.at("vocab_size"), "151936");
  EXPECT_EQ(keys.at("logits_via_embedding"), "true");
  EXPECT_EQ(keys.at("normalization_layer_epsilon"), "1e-06");
  EXPECT_EQ(keys.at("rope_max_timescale"), "1e+06");
  EXPECT_EQ(keys.at("max_position_embeddings"), "0");
  EXPECT_EQ(keys.at("num_experts"), "0");
  EXPECT_EQ(keys.at("attention_type"), "global");
  EXPECT_EQ(keys.at("hf_bos_token_id"), "151643");
  EXPECT_EQ(keys.at("hf_eos_token_id"), "151645");  // <|im_end|>, not the tokenizer's <|endoftext|>
  EXPECT_EQ(keys.at("hf_pad_token_id"), "absent");
  EXPECT_EQ(keys.at("routed_bias_update_rate"), "0");
  expect_complete(imported);
  // The public Qwen3-0.6B: the same shape as the preset, and its 596,049,920 parameters.
  const Config config = load(imported);
  EXPECT_EQ(shape_of(config), shape_of(load_config("qwen3-0.6b", {})));
  EXPECT_EQ(build_model_spec(config).parameter_count(), 596049920);
}

TEST(HfConfig, Qwen3From4xAnd5xFormsIsQwen3Tiny) {
  const HfModelConfig v4 = import_text(kQwen3V457);
  const HfModelConfig v5 = import_text(kQwen3V525);
  EXPECT_EQ(without_token_ids(v4), without_token_ids(v5));
  EXPECT_EQ(v4.weight_dtype, "bfloat16");  // dtype
  EXPECT_EQ(v5.weight_dtype, "bfloat16");
  const auto keys = keys_of(v5);
  EXPECT_EQ(keys.at("base_emb_dim"), "384");
  EXPECT_EQ(keys.at("base_num_query_heads"), "6");
  EXPECT_EQ(keys.at("base_num_kv_heads"), "2");
  EXPECT_EQ(keys.at("head_dim"), "64");
  EXPECT_EQ(keys.at("base_mlp_dim"), "1024");
  EXPECT_EQ(keys.at("base_num_decoder_layers"), "6");
  EXPECT_EQ(keys.at("vocab_size"), "8192");
  EXPECT_EQ(keys.at("rope_max_timescale"), "1e+06");  // from rope_parameters
  expect_complete(v5);
  EXPECT_EQ(shape_of(load(v5)), shape_of(load_config("qwen3-tiny", {})));
}

TEST(HfConfig, Qwen3AbsentKeysTakeTransformersDefaults) {
  Json hf = Json::parse(kQwen3V457);
  for (const char* key : {"head_dim", "tie_word_embeddings", "rope_theta", "rope_scaling", "rms_norm_eps",
                          "hidden_act", "attention_bias", "use_sliding_window", "layer_types", "dtype"}) {
    hf.erase(key);
  }
  const HfModelConfig imported = hf_config_to_meshtrain(hf, kPath);
  const auto keys = keys_of(imported);
  EXPECT_EQ(keys.at("head_dim"), "128");  // Qwen3Config.head_dim = 128
  EXPECT_EQ(keys.at("logits_via_embedding"), "false");
  EXPECT_EQ(keys.at("rope_max_timescale"), "10000");
  EXPECT_EQ(keys.at("normalization_layer_epsilon"), "1e-06");
  EXPECT_EQ(imported.weight_dtype, "");
  // Null head_dim and kv heads: hidden_size / heads, and as many kv heads as query heads.
  hf["head_dim"] = nullptr;
  hf["num_key_value_heads"] = nullptr;
  const auto derived = keys_of(hf_config_to_meshtrain(hf, kPath));
  EXPECT_EQ(derived.at("head_dim"), "64");
  EXPECT_EQ(derived.at("base_num_kv_heads"), "6");
  // rope_theta inside an older rope_scaling of type default, and 5.x's per-layer-type nesting.
  hf["rope_scaling"] = {{"type", "default"}, {"rope_theta", 5e5}};
  EXPECT_EQ(keys_of(hf_config_to_meshtrain(hf, kPath)).at("rope_max_timescale"), "5e+05");
  hf.erase("rope_scaling");
  hf["rope_parameters"] = {{"full_attention", {{"rope_type", "default"}, {"rope_theta", 2e6}}}};
  EXPECT_EQ(keys_of(hf_config_to_meshtrain(hf, kPath)).at("rope_max_timescale"), "2e+06");
}

TEST(HfConfig, Qwen3MoeFromTransformers451IsQwen3_30B_A3B) {
  const HfModelConfig imported = import_text(kQwen3MoeV451);
  EXPECT_EQ(imported.model_type, "qwen3_moe");
  EXPECT_EQ(imported.preset, "qwen3-tiny");
  const auto keys = keys_of(imported);
  EXPECT_EQ(keys.at("decoder_block"), "qwen3");
  EXPECT_EQ(keys.at("num_experts"), "128");
  EXPECT_EQ(keys.at("num_experts_per_tok"), "8");
  EXPECT_EQ(keys.at("base_moe_mlp_dim"), "768");
  EXPECT_EQ(keys.at("base_mlp_dim"), "6144");
  EXPECT_EQ(keys.at("first_num_dense_layers"), "0");
  EXPECT_EQ(keys.at("norm_topk_prob"), "true");
  EXPECT_EQ(keys.at("head_dim"), "128");
  EXPECT_EQ(keys.at("shared_experts"), "0");
  EXPECT_EQ(keys.at("routed_score_func"), "softmax");
  EXPECT_EQ(keys.at("routed_bias"), "false");
  EXPECT_EQ(keys.at("routed_scaling_factor"), "1");
  EXPECT_EQ(keys.at("n_routing_groups"), "1");
  EXPECT_EQ(keys.at("capacity_factor"), "0");
  EXPECT_EQ(keys.at("logits_via_embedding"), "false");
  EXPECT_EQ(keys.count("load_balance_loss_weight"), 0u);  // router_aux_loss_coef is not mapped
  EXPECT_EQ(shape_of(load(imported)), shape_of(load_config("qwen3-30b-a3b", {})));
}

TEST(HfConfig, Qwen3MoeFrom5xForm) {
  const HfModelConfig imported = import_text(kQwen3MoeV525);
  const auto keys = keys_of(imported);
  EXPECT_EQ(keys.at("num_experts"), "8");  // num_local_experts
  EXPECT_EQ(keys.at("num_experts_per_tok"), "2");
  EXPECT_EQ(keys.at("base_moe_mlp_dim"), "256");
  EXPECT_EQ(keys.at("first_num_dense_layers"), "1");  // mlp_only_layers [0]
  EXPECT_EQ(keys.at("norm_topk_prob"), "false");
  EXPECT_EQ(keys.at("head_dim"), "64");
  EXPECT_EQ(keys.at("rope_max_timescale"), "1e+06");
  expect_complete(imported);
  // Qwen3MoeConfig has no head_dim attribute: absent, the attention's width is hidden_size / heads.
  const auto defaults = keys_of(import_text(kQwen3MoeDefaultV525));
  EXPECT_EQ(defaults.at("head_dim"), "64");  // 2048 / 32
  EXPECT_EQ(defaults.at("num_experts"), "128");
  EXPECT_EQ(defaults.at("rope_max_timescale"), "10000");
}

TEST(HfConfig, DeepseekV3From4xAnd5xFormsIsDeepseekTiny) {
  const HfModelConfig v4 = import_text(kDeepseekV457);
  const HfModelConfig v5 = import_text(kDeepseekV525);
  EXPECT_EQ(without_token_ids(v4), without_token_ids(v5));
  EXPECT_EQ(v5.model_type, "deepseek_v3");
  EXPECT_EQ(v5.preset, "deepseek-tiny");
  EXPECT_EQ(v5.weight_dtype, "");
  const auto keys = keys_of(v5);
  EXPECT_EQ(keys.at("hf_bos_token_id"), "0");
  EXPECT_EQ(keys.at("hf_eos_token_id"), "1");
  EXPECT_EQ(keys.at("hf_pad_token_id"), "null");
  EXPECT_EQ(keys_of(v4).at("hf_pad_token_id"), "absent");
  EXPECT_EQ(keys.at("decoder_block"), "deepseek");
  EXPECT_EQ(keys.at("attention_type"), "mla");
  EXPECT_EQ(keys.at("base_emb_dim"), "384");
  EXPECT_EQ(keys.at("base_num_query_heads"), "6");
  EXPECT_EQ(keys.at("base_num_kv_heads"), "6");
  EXPECT_EQ(keys.at("head_dim"), "48");  // qk_nope + qk_rope, not the file's head_dim (the rotary width)
  EXPECT_EQ(keys.at("q_lora_rank"), "192");
  EXPECT_EQ(keys.at("kv_lora_rank"), "64");
  EXPECT_EQ(keys.at("qk_nope_head_dim"), "32");
  EXPECT_EQ(keys.at("qk_rope_head_dim"), "16");
  EXPECT_EQ(keys.at("v_head_dim"), "32");
  EXPECT_EQ(keys.at("base_mlp_dim"), "1024");
  EXPECT_EQ(keys.at("base_moe_mlp_dim"), "256");
  EXPECT_EQ(keys.at("num_experts"), "8");
  EXPECT_EQ(keys.at("num_experts_per_tok"), "2");
  EXPECT_EQ(keys.at("shared_experts"), "1");
  EXPECT_EQ(keys.at("first_num_dense_layers"), "1");
  EXPECT_EQ(keys.at("routed_score_func"), "sigmoid");
  EXPECT_EQ(keys.at("routed_bias"), "true");
  EXPECT_EQ(keys.at("routed_scaling_factor"), "1");
  EXPECT_EQ(keys.at("norm_topk_prob"), "true");
  EXPECT_EQ(keys.at("n_routing_groups"), "1");
  EXPECT_EQ(keys.at("topk_routing_group"), "1");
  EXPECT_EQ(keys.at("rope_max_timescale"), "10000");
  EXPECT_EQ(keys.at("logits_via_embedding"), "false");
  expect_complete(v5);
  EXPECT_EQ(shape_of(load(v5)), shape_of(load_config("deepseek-tiny", {})));
}

TEST(HfConfig, DeepseekV3HubConfigNeedsBf16WeightsAndNoYarn) {
  Json hf = Json::parse(kDeepseekV3Hub);
  const std::string fp8 = error_of([&] { hf_config_to_meshtrain(hf, kPath); });
  EXPECT_NE(fp8.find(std::string(kPath) + ": key 'quantization_config'"), std::string::npos) << fp8;
  EXPECT_NE(fp8.find("fp8"), std::string::npos) << fp8;
  EXPECT_NE(fp8.find("dequantize"), std::string::npos) << fp8;
  hf.erase("quantization_config");
  const std::string yarn = error_of([&] { hf_config_to_meshtrain(hf, kPath); });
  EXPECT_NE(yarn.find("config.json: key 'rope_scaling.type'"), std::string::npos) << yarn;
  EXPECT_NE(yarn.find("\"yarn\""), std::string::npos) << yarn;
  EXPECT_NE(yarn.find("\"default\""), std::string::npos) << yarn;
  // Without YaRN it is deepseek-v3's shape; DeepSeek's own routing keys name what transformers does.
  hf["rope_scaling"] = nullptr;
  const HfModelConfig imported = hf_config_to_meshtrain(hf, kPath);
  EXPECT_EQ(imported.weight_dtype, "bfloat16");
  EXPECT_EQ(shape_of(load(imported)), shape_of(load_config("deepseek-v3", {})));
  // q_lora_rank null: queries projected directly.
  hf["q_lora_rank"] = nullptr;
  EXPECT_EQ(keys_of(hf_config_to_meshtrain(hf, kPath)).at("q_lora_rank"), "0");
}

TEST(HfConfig, DeepseekV3AllDenseLayersIsADenseModel) {
  Json hf = Json::parse(kDeepseekV457);
  hf["first_k_dense_replace"] = 6;
  const HfModelConfig imported = hf_config_to_meshtrain(hf, kPath);
  const auto keys = keys_of(imported);
  EXPECT_EQ(keys.at("num_experts"), "0");
  EXPECT_EQ(keys.at("first_num_dense_layers"), "0");
  EXPECT_EQ(keys.at("shared_experts"), "0");
  expect_complete(imported);
  hf["first_k_dense_replace"] = 1;
  hf["n_routed_experts"] = 0;
  EXPECT_EQ(keys_of(hf_config_to_meshtrain(hf, kPath)).at("num_experts"), "0");
}

TEST(HfConfig, Gpt2From4xAnd5xFormsIsGpt2_124M) {
  const HfModelConfig v4 = import_text(kGpt2V457);
  const HfModelConfig v5 = import_text(kGpt2V525);
  EXPECT_EQ(without_token_ids(v4), without_token_ids(v5));
  EXPECT_EQ(v5.model_type, "gpt2");
  EXPECT_EQ(v5.preset, "gpt2-124m");
  const auto keys = keys_of(v5);
  EXPECT_EQ(keys.at("decoder_block"), "gpt2");
  EXPECT_EQ(keys.at("base_emb_dim"), "768");
  EXPECT_EQ(keys.at("base_num_query_heads"), "12");
  EXPECT_EQ(keys.at("base_num_kv_heads"), "12");
  EXPECT_EQ(keys.at("head_dim"), "64");
  EXPECT_EQ(keys.at("base_mlp_dim"), "3072");  // n_inner null: 4 n_embd
  EXPECT_EQ(keys.at("base_num_decoder_layers"), "12");
  EXPECT_EQ(keys.at("vocab_size"), "50257");  // the real vocabulary; the engine pads the table to 50304
  EXPECT_EQ(keys.at("max_position_embeddings"), "1024");
  EXPECT_EQ(keys.at("max_target_length"), "1024");
  EXPECT_EQ(keys.at("logits_via_embedding"), "true");
  EXPECT_EQ(keys.at("normalization_layer_epsilon"), "1e-05");
  expect_complete(v5);
  EXPECT_EQ(shape_of(load(v5)), shape_of(load_config("gpt2-124m", {})));
  // A short position table bounds the sequence; n_inner, gelu_pytorch_tanh and the float32-upcast
  // attention (the same scores) are accepted.
  Json small = Json::parse(kGpt2V525);
  small["n_positions"] = 64;
  small["n_inner"] = 1000;
  small["activation_function"] = "gelu_pytorch_tanh";
  small["reorder_and_upcast_attn"] = true;
  const Config config = load(hf_config_to_meshtrain(small, kPath));
  EXPECT_EQ(config.max_target_length, 64);
  EXPECT_EQ(config.max_position_embeddings, 64);
  EXPECT_EQ(config.base_mlp_dim, 1000);
}

// ---- Refusals: each names config.json, the key and the value found ----------------------------------

struct Refusal {
  const char* name;
  const char* base;  // the JSON it starts from
  std::function<void(Json&)> edit;
  std::vector<std::string> says;  // substrings of the message (the key and the value at least)
};

TEST(HfConfig, RefusalsNameTheFileTheKeyAndTheValue) {
  const std::vector<Refusal> refusals = {
      {"unknown model_type",
       kQwen3V525,
       [](Json& j) { j["model_type"] = "llama"; },
       {"key 'model_type'", "\"llama\"", "qwen3, qwen3_moe, deepseek_v3 or gpt2"}},
      {"no model_type",
       kQwen3V525,
       [](Json& j) { j.erase("model_type"); },
       {"key 'model_type'", "no such key"}},
      {"missing size",
       kQwen3V525,
       [](Json& j) { j.erase("hidden_size"); },
       {"key 'hidden_size'", "no such key", "model_type qwen3 needs it"}},
      {"wrong type",
       kQwen3V525,
       [](Json& j) { j["hidden_size"] = "384"; },
       {"key 'hidden_size'", "an integer", "\"384\""}},
      {"zero size",
       kGpt2V525,
       [](Json& j) { j["n_layer"] = 0; },
       {"key 'n_layer'", "a positive integer", "found 0"}},
      {"missing kv heads",
       kQwen3V525,
       [](Json& j) { j.erase("num_key_value_heads"); },
       {"key 'num_key_value_heads'", "no such key"}},
      {"attention bias",
       kQwen3V525,
       [](Json& j) { j["attention_bias"] = true; },
       {"key 'attention_bias'", "found true", "expected false"}},
      {"sliding window",
       kQwen3V457,
       [](Json& j) { j["use_sliding_window"] = true; },
       {"key 'use_sliding_window'", "found true"}},
      {"sliding layer",
       kQwen3V525,
       [](Json& j) { j["layer_types"][5] = "sliding_attention"; },
       {"key 'layer_types'", "\"sliding_attention\"", "\"full_attention\""}},
      {"4.x YaRN",
       kQwen3V457,
       [](Json& j) {
         j["rope_scaling"] = {
             {"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32768}};
       },
       {"key 'rope_scaling.rope_type'", "\"yarn\"", "\"default\""}},
      {"old linear scaling",
       kQwen3V457,
       [](Json& j) {
         j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
       },
       {"key 'rope_scaling.type'", "\"linear\""}},
      {"5.x dynamic",
       kQwen3V525,
       [](Json& j) {
         j["rope_parameters"] = {{"rope_type", "dynamic"}, {"factor", 2.0}, {"rope_theta", 1e6}};
       },
       {"key 'rope_parameters.rope_type'", "\"dynamic\""}},
      {"two thetas",
       kQwen3V525,
       [](Json& j) { j["rope_theta"] = 10000.0; },
       {"key 'rope_theta'", "10000.0", "'rope_parameters.rope_theta' (1e+06)"}},
      {"partial rotary",
       kQwen3V525,
       [](Json& j) { j["rope_parameters"]["partial_rotary_factor"] = 0.5; },
       {"key 'rope_parameters.partial_rotary_factor'", "0.5"}},
      {"activation",
       kQwen3V525,
       [](Json& j) { j["hidden_act"] = "gelu"; },
       {"key 'hidden_act'", "\"gelu\"", "silu"}},
      {"kv heads",
       kQwen3V451,
       [](Json& j) { j["num_key_value_heads"] = 6; },
       {"key 'num_key_value_heads'", "found 6", "a divisor of num_attention_heads (16)"}},
      {"dtype",
       kQwen3V525,
       [](Json& j) { j["dtype"] = "float8_e4m3fn"; },
       {"key 'dtype'", "\"float8_e4m3fn\""}},
      {"two dtypes",
       kQwen3V525,
       [](Json& j) { j["torch_dtype"] = "float32"; },
       {"key 'torch_dtype'", "\"float32\"", "\"bfloat16\""}},
      {"other head",
       kQwen3V525,
       [](Json& j) { j["architectures"] = {"Qwen3ForSequenceClassification"}; },
       {"key 'architectures'", "Qwen3ForSequenceClassification", "Qwen3ForCausalLM"}},
      {"sparse step",
       kQwen3MoeV525,
       [](Json& j) { j["decoder_sparse_step"] = 2; },
       {"key 'decoder_sparse_step'", "found 2"}},
      {"dense layers not leading",
       kQwen3MoeV525,
       [](Json& j) {
         j["mlp_only_layers"] = {1, 3};
       },
       {"key 'mlp_only_layers'", "[1,3]", "[0, 1, ..., k - 1]"}},
      {"no experts key",
       kQwen3MoeV451,
       [](Json& j) { j.erase("num_experts"); },
       {"key 'num_experts'", "no such key"}},
      {"top-k over experts",
       kQwen3MoeV525,
       [](Json& j) { j["num_experts_per_tok"] = 9; },
       {"key 'num_experts_per_tok'", "found 9", "num_local_experts (8)"}},
      {"softmax routing",
       kDeepseekV525,
       [](Json& j) { j["scoring_func"] = "softmax"; },
       {"key 'scoring_func'", "\"softmax\"", "sigmoid"}},
      {"V2 routing",
       kDeepseekV525,
       [](Json& j) { j["topk_method"] = "greedy"; },
       {"key 'topk_method'", "\"greedy\""}},
      {"MLA kv heads",
       kDeepseekV525,
       [](Json& j) { j["num_key_value_heads"] = 1; },
       {"key 'num_key_value_heads'", "found 1", "num_attention_heads (6)"}},
      {"rotary layout",
       kDeepseekV525,
       [](Json& j) { j["rope_interleave"] = false; },
       {"key 'rope_interleave'", "found false"}},
      {"MLA bias",
       kDeepseekV457,
       [](Json& j) { j["attention_bias"] = true; },
       {"key 'attention_bias'", "found true"}},
      {"groups",
       kDeepseekV525,
       [](Json& j) { j["n_group"] = 3; },
       {"key 'n_group'", "found 3", "a divisor of n_routed_experts (8)"}},
      {"MoE every other layer",
       kDeepseekV525,
       [](Json& j) { j["moe_layer_freq"] = 2; },
       {"key 'moe_layer_freq'", "found 2"}},
      {"DeepSeek YaRN 5.x",
       kDeepseekV525,
       [](Json& j) {
         j["rope_parameters"] = {{"rope_type", "yarn"}, {"factor", 40}, {"rope_theta", 10000.0}};
       },
       {"key 'rope_parameters.rope_type'", "\"yarn\""}},
      {"erf GELU",
       kGpt2V525,
       [](Json& j) { j["activation_function"] = "gelu"; },
       {"key 'activation_function'", "\"gelu\"", "gelu_new"}},
      {"layer-scaled attention",
       kGpt2V525,
       [](Json& j) { j["scale_attn_by_inverse_layer_idx"] = true; },
       {"key 'scale_attn_by_inverse_layer_idx'", "found true"}},
      {"unscaled attention",
       kGpt2V525,
       [](Json& j) { j["scale_attn_weights"] = false; },
       {"key 'scale_attn_weights'", "found false"}},
      {"cross-attention",
       kGpt2V525,
       [](Json& j) { j["add_cross_attention"] = true; },
       {"key 'add_cross_attention'", "found true"}},
      {"untied GPT-2",
       kGpt2V525,
       [](Json& j) { j["tie_word_embeddings"] = false; },
       {"key 'tie_word_embeddings'", "found false"}},
      {"heads not dividing",
       kGpt2V457,
       [](Json& j) { j["n_head"] = 5; },
       {"key 'n_head'", "found 5", "a divisor of n_embd (768)"}},
      {"special token id as text",
       kGpt2V525,
       [](Json& j) { j["bos_token_id"] = "50256"; },
       {"key 'bos_token_id'", "a token id in [0, vocab_size = 50257) or null", "found \"50256\""}},
      {"special token id outside the vocabulary",
       kQwen3V525,
       [](Json& j) { j["eos_token_id"] = 8192; },
       {"key 'eos_token_id'", "a token id in [0, vocab_size = 8192) or null", "found 8192"}},
      {"negative special token id",
       kQwen3V525,
       [](Json& j) { j["pad_token_id"] = -1; },
       {"key 'pad_token_id'", "found -1"}},
      {"a list of special token ids",
       kDeepseekV525,
       [](Json& j) {
         j["eos_token_id"] = Json::array({1, 2});
       },
       {"key 'eos_token_id'", "found [1,2]"}},
  };
  for (const Refusal& refusal : refusals) {
    Json hf = Json::parse(refusal.base);
    refusal.edit(hf);
    const std::string message = error_of([&] { hf_config_to_meshtrain(hf, kPath); });
    EXPECT_EQ(message.rfind(std::string(kPath) + ": key '", 0), 0u) << refusal.name << ": " << message;
    for (const std::string& part : refusal.says) {
      EXPECT_NE(message.find(part), std::string::npos) << refusal.name << ": " << message;
    }
  }
}

TEST(HfConfig, ReadingTheFileNamesIt) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "meshtrain_hf_config_test";
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "config.json").string();
  std::filesystem::remove(path);
  const std::string missing = error_of([&] { read_hf_config(path); });
  EXPECT_EQ(missing.rfind(path + ": expected a readable Hugging Face config.json", 0), 0u) << missing;
  std::ofstream(path) << "{\"model_type\": \"qwen3\",";
  const std::string broken = error_of([&] { read_hf_config(path); });
  EXPECT_EQ(broken.rfind(path + ": expected valid JSON", 0), 0u) << broken;
  std::ofstream(path) << "[1, 2]";
  const std::string list = error_of([&] { read_hf_config(path); });
  EXPECT_NE(list.find("a JSON object"), std::string::npos) << list;
  EXPECT_NE(list.find("found a JSON array"), std::string::npos) << list;
  std::ofstream(path) << kQwen3V525;
  EXPECT_EQ(read_hf_config(path).overrides, import_text(kQwen3V525).overrides);
  std::filesystem::remove_all(dir);
}

// ---- Export ---------------------------------------------------------------------------------------------

// config -> config.json -> config: the model-shape keys come back unchanged.
void expect_round_trip(const Config& config, const std::string& label) {
  const OrderedJson exported = hf_config_from_meshtrain(config, "bfloat16");
  const HfModelConfig imported = hf_config_to_meshtrain(Json::parse(exported.dump()), "export/config.json");
  EXPECT_EQ(imported.weight_dtype, "bfloat16") << label;
  EXPECT_EQ(shape_of(load(imported)), shape_of(config)) << label << "\n" << exported.dump(2);
}

// bos / eos / pad as the file has them: an id, null, or absent (transformers then fills in its class
// default, so the export must leave the key out again); export writes back exactly that.
TEST(HfConfig, SpecialTokenIdsTravelAsTheFileHasThem) {
  Json hf = Json::parse(kGpt2V525);
  hf["bos_token_id"] = nullptr;
  hf["eos_token_id"] = 7;
  hf.erase("pad_token_id");
  const HfModelConfig imported = hf_config_to_meshtrain(hf, kPath);
  const auto keys = keys_of(imported);
  EXPECT_EQ(keys.at("hf_bos_token_id"), "null");
  EXPECT_EQ(keys.at("hf_eos_token_id"), "7");
  EXPECT_EQ(keys.at("hf_pad_token_id"), "absent");
  // What the checkpoint's tokenizer says (50256) never replaces what the file said.
  const OrderedJson exported = hf_config_from_meshtrain(load(imported), "float32", {50256, 50256});
  EXPECT_TRUE(exported.at("bos_token_id").is_null());
  EXPECT_EQ(exported.at("eos_token_id"), 7);
  EXPECT_FALSE(exported.contains("pad_token_id"));
  EXPECT_EQ(keys_of(hf_config_to_meshtrain(Json::parse(exported.dump()), kPath)), keys);
  // A model meshtrain trained (the keys ""): the tokenizer's end-of-text id, and no pad.
  const OrderedJson trained =
      hf_config_from_meshtrain(load_config("gpt2-124m", {}), "float32", {50256, 50256});
  EXPECT_EQ(trained.at("bos_token_id"), 50256);
  EXPECT_EQ(trained.at("eos_token_id"), 50256);
  EXPECT_FALSE(trained.contains("pad_token_id"));
}

// The model's recipe, not the tiny preset's: DeepSeek-V3 moves its selection bias by 0.001 a step (the
// deepseek-tiny preset's 0.01 is for a few hundred steps of a tiny model); the others have no bias.
TEST(HfConfig, ImportCarriesTheModelsBiasUpdateRate) {
  const Config deepseek = load(import_text(kDeepseekV525));
  EXPECT_EQ(deepseek.routed_bias_update_rate, 0.001);
  EXPECT_EQ(load_config("deepseek-tiny", {}).routed_bias_update_rate, 0.01);
  EXPECT_EQ(load(import_text(kQwen3MoeDefaultV525)).routed_bias_update_rate, 0.0);
}

TEST(HfConfig, ExportOfEachPresetFamilyMapsBack) {
  expect_round_trip(load_config("qwen3-tiny", {}), "qwen3-tiny");
  expect_round_trip(load_config("qwen3-0.6b", {}), "qwen3-0.6b");
  expect_round_trip(
      load_config("qwen3-tiny", {"num_experts=8", "num_experts_per_tok=2", "base_moe_mlp_dim=256",
                                 "first_num_dense_layers=1", "norm_topk_prob=true"}),
      "qwen3-tiny MoE");
  expect_round_trip(load_config("qwen3-30b-a3b", {}), "qwen3-30b-a3b");
  expect_round_trip(load_config("deepseek-tiny", {}), "deepseek-tiny");
  expect_round_trip(load_config("deepseek-tiny", {"q_lora_rank=0"}), "deepseek-tiny q_proj");
  expect_round_trip(load_config("deepseek-v3", {}), "deepseek-v3");
  expect_round_trip(load_config("gpt2-124m", {}), "gpt2-124m");
  expect_round_trip(load_config("gpt2-350m", {}), "gpt2-350m");
}

TEST(HfConfig, ExportQwen3KeyByKey) {
  const OrderedJson hf = hf_config_from_meshtrain(load_config("qwen3-tiny", {}), "float32", {151643, 151645});
  EXPECT_EQ(hf.at("architectures"), OrderedJson::array({"Qwen3ForCausalLM"}));
  EXPECT_EQ(hf.at("model_type"), "qwen3");
  EXPECT_EQ(hf.at("hidden_size"), 384);
  EXPECT_EQ(hf.at("intermediate_size"), 1024);
  EXPECT_EQ(hf.at("num_hidden_layers"), 6);
  EXPECT_EQ(hf.at("num_attention_heads"), 6);
  EXPECT_EQ(hf.at("num_key_value_heads"), 2);
  EXPECT_EQ(hf.at("head_dim"), 64);
  EXPECT_EQ(hf.at("vocab_size"), 8192);
  EXPECT_EQ(hf.at("hidden_act"), "silu");
  EXPECT_EQ(hf.at("rms_norm_eps"), 1e-6);
  EXPECT_EQ(hf.at("rope_theta"), 1e6);  // transformers 4.x
  EXPECT_EQ(hf.at("rope_parameters"), OrderedJson({{"rope_type", "default"}, {"rope_theta", 1e6}}));  // 5.x
  EXPECT_EQ(hf.at("max_position_embeddings"), 128);  // max_target_length
  EXPECT_EQ(hf.at("attention_bias"), false);
  EXPECT_EQ(hf.at("use_sliding_window"), false);
  EXPECT_EQ(hf.at("layer_types").size(), 6u);
  EXPECT_EQ(hf.at("tie_word_embeddings"), true);
  EXPECT_EQ(hf.at("use_cache"), true);
  EXPECT_EQ(hf.at("dtype"), "float32");
  EXPECT_EQ(hf.at("torch_dtype"), "float32");
  EXPECT_EQ(hf.at("bos_token_id"), 151643);
  EXPECT_EQ(hf.at("eos_token_id"), 151645);
  EXPECT_FALSE(hf.contains("num_experts"));
  // Token ids only when known.
  const OrderedJson plain = hf_config_from_meshtrain(load_config("qwen3-tiny", {}), "bfloat16");
  EXPECT_FALSE(plain.contains("bos_token_id"));
  EXPECT_FALSE(plain.contains("eos_token_id"));
}

TEST(HfConfig, ExportQwen3MoeKeyByKey) {
  const OrderedJson hf = hf_config_from_meshtrain(
      load_config("qwen3-tiny",
                  {"num_experts=8", "num_experts_per_tok=2", "base_moe_mlp_dim=256",
                   "first_num_dense_layers=2", "norm_topk_prob=true", "logits_via_embedding=false"}),
      "bfloat16");
  EXPECT_EQ(hf.at("architectures"), OrderedJson::array({"Qwen3MoeForCausalLM"}));
  EXPECT_EQ(hf.at("model_type"), "qwen3_moe");
  EXPECT_EQ(hf.at("num_experts"), 8);
  EXPECT_EQ(hf.at("num_experts_per_tok"), 2);
  EXPECT_EQ(hf.at("moe_intermediate_size"), 256);
  EXPECT_EQ(hf.at("intermediate_size"), 1024);
  EXPECT_EQ(hf.at("norm_topk_prob"), true);
  EXPECT_EQ(hf.at("decoder_sparse_step"), 1);
  EXPECT_EQ(hf.at("mlp_only_layers"), OrderedJson::array({0, 1}));
  EXPECT_EQ(hf.at("output_router_logits"), false);
  EXPECT_EQ(hf.at("tie_word_embeddings"), false);
}

TEST(HfConfig, ExportDeepseekKeyByKey) {
  const OrderedJson hf = hf_config_from_meshtrain(load_config("deepseek-v3", {}), "bfloat16", {0, 1});
  EXPECT_EQ(hf.at("architectures"), OrderedJson::array({"DeepseekV3ForCausalLM"}));
  EXPECT_EQ(hf.at("model_type"), "deepseek_v3");
  EXPECT_EQ(hf.at("hidden_size"), 7168);
  EXPECT_EQ(hf.at("intermediate_size"), 18432);
  EXPECT_EQ(hf.at("moe_intermediate_size"), 2048);
  EXPECT_EQ(hf.at("num_hidden_layers"), 61);
  EXPECT_EQ(hf.at("num_attention_heads"), 128);
  EXPECT_EQ(hf.at("num_key_value_heads"), 128);
  EXPECT_EQ(hf.at("n_routed_experts"), 256);
  EXPECT_EQ(hf.at("n_shared_experts"), 1);
  EXPECT_EQ(hf.at("num_experts_per_tok"), 8);
  EXPECT_EQ(hf.at("first_k_dense_replace"), 3);
  EXPECT_EQ(hf.at("n_group"), 8);
  EXPECT_EQ(hf.at("topk_group"), 4);
  EXPECT_EQ(hf.at("routed_scaling_factor"), 2.5);
  EXPECT_EQ(hf.at("norm_topk_prob"), true);
  EXPECT_EQ(hf.at("topk_method"), "noaux_tc");
  EXPECT_EQ(hf.at("scoring_func"), "sigmoid");
  EXPECT_EQ(hf.at("moe_layer_freq"), 1);
  EXPECT_EQ(hf.at("num_nextn_predict_layers"), 0);
  EXPECT_EQ(hf.at("q_lora_rank"), 1536);
  EXPECT_EQ(hf.at("kv_lora_rank"), 512);
  EXPECT_EQ(hf.at("qk_nope_head_dim"), 128);
  EXPECT_EQ(hf.at("qk_rope_head_dim"), 64);
  EXPECT_EQ(hf.at("v_head_dim"), 128);
  EXPECT_EQ(hf.at("head_dim"), 64);
  EXPECT_EQ(hf.at("rope_interleave"), true);
  EXPECT_EQ(hf.at("vocab_size"), 129280);
  EXPECT_EQ(hf.at("rope_theta"), 10000.0);
  EXPECT_EQ(hf.at("rope_parameters").at("rope_type"), "default");
  EXPECT_EQ(hf.at("max_position_embeddings"), 4096);
  EXPECT_EQ(hf.at("tie_word_embeddings"), false);
  EXPECT_EQ(hf.at("bos_token_id"), 0);
  EXPECT_EQ(hf.at("eos_token_id"), 1);
  // q_lora_rank 0 is transformers' null (q_proj); a dense model has every layer among the dense ones.
  EXPECT_TRUE(hf_config_from_meshtrain(load_config("deepseek-tiny", {"q_lora_rank=0"}), "bfloat16")
                  .at("q_lora_rank")
                  .is_null());
  const OrderedJson dense =
      hf_config_from_meshtrain(load_config("deepseek-tiny", {"num_experts=0"}), "bfloat16");
  EXPECT_EQ(dense.at("first_k_dense_replace"), 6);
  EXPECT_EQ(dense.at("n_routed_experts"), 0);
  EXPECT_EQ(keys_of(hf_config_to_meshtrain(Json::parse(dense.dump()), kPath)).at("num_experts"), "0");
}

TEST(HfConfig, ExportGpt2KeyByKey) {
  const OrderedJson hf = hf_config_from_meshtrain(load_config("gpt2-124m", {}), "float16", {50256, 50256});
  EXPECT_EQ(hf.at("architectures"), OrderedJson::array({"GPT2LMHeadModel"}));
  EXPECT_EQ(hf.at("model_type"), "gpt2");
  EXPECT_EQ(hf.at("n_embd"), 768);
  EXPECT_EQ(hf.at("n_head"), 12);
  EXPECT_EQ(hf.at("n_layer"), 12);
  EXPECT_TRUE(hf.at("n_inner").is_null());  // 4 n_embd, written as GPT-2's configs write it
  EXPECT_EQ(hf.at("n_positions"), 1024);
  EXPECT_EQ(hf.at("vocab_size"), 50257);
  EXPECT_EQ(hf.at("activation_function"), "gelu_new");
  EXPECT_EQ(hf.at("layer_norm_epsilon"), 1e-5);
  EXPECT_EQ(hf.at("tie_word_embeddings"), true);
  EXPECT_EQ(hf.at("scale_attn_weights"), true);
  EXPECT_EQ(hf.at("resid_pdrop"), 0.0);
  EXPECT_EQ(hf.at("torch_dtype"), "float16");
  EXPECT_FALSE(hf.contains("rope_theta"));
}

TEST(HfConfig, ExportRefusesWhatHuggingFaceCannotRepresent) {
  struct Case {
    const char* preset;
    std::vector<std::string> overrides;
    std::vector<std::string> says;
  };
  const std::vector<Case> cases = {
      {"deepseek-custom-tiny", {}, {"config key 'engram_layers'", "found [1, 4]", "Engram"}},
      {"deepseek-tiny", {"mhc_expansion_rate=4"}, {"config key 'mhc_expansion_rate'", "found 4", "mHC"}},
      {"deepseek-tiny",
       {"routed_score_func=softmax", "routed_bias=false"},
       {"config key 'routed_score_func'", "expected sigmoid", "found softmax"}},
      {"deepseek-tiny",
       {"attention_type=global", "base_num_kv_heads=2", "head_dim=64"},
       {"config key 'attention_type'", "expected mla", "found global"}},
      {"deepseek-tiny",
       {"n_routing_groups=8", "topk_routing_group=4"},
       {"config key 'n_routing_groups'", "found 8", "two best experts"}},
      {"qwen3-tiny",
       {"num_experts=8", "base_moe_mlp_dim=64", "routed_score_func=sigmoid"},
       {"config key 'routed_score_func'", "expected softmax", "found sigmoid"}},
      {"qwen3-tiny",
       {"num_experts=8", "base_moe_mlp_dim=64", "shared_experts=1"},
       {"config key 'shared_experts'", "found 1"}},
      {"qwen3-tiny",
       {"num_experts=8", "base_moe_mlp_dim=64", "n_routing_groups=2"},
       {"config key 'n_routing_groups'", "found 2"}},
      {"qwen3-tiny",
       {"num_experts=8", "base_moe_mlp_dim=64", "routed_scaling_factor=2.5"},
       {"config key 'routed_scaling_factor'", "found 2.5"}},
      {"gpt2-124m",
       {"base_num_kv_heads=4"},
       {"config key 'base_num_kv_heads'", "found 4", "base_num_query_heads (12)"}},
  };
  for (const Case& c : cases) {
    const Config config = load_config(c.preset, c.overrides);
    const std::string message = error_of([&] { hf_config_from_meshtrain(config, "bfloat16"); });
    EXPECT_NE(message.find("export-hf needs a model Hugging Face can represent"), std::string::npos)
        << c.preset << ": " << message;
    for (const std::string& part : c.says) {
      EXPECT_NE(message.find(part), std::string::npos) << c.preset << ": " << message;
    }
  }
  const std::string dtype = error_of([] { hf_config_from_meshtrain(load_config("qwen3-tiny", {}), "int8"); });
  EXPECT_NE(dtype.find("export dtype"), std::string::npos) << dtype;
  EXPECT_NE(dtype.find("'int8'"), std::string::npos) << dtype;
  // A capacity is a training-time drop: the same experts run dropless in Hugging Face.
  EXPECT_NO_THROW(
      hf_config_from_meshtrain(load_config("deepseek-tiny", {"capacity_factor=1.25"}), "bfloat16"));
}

}  // namespace
}  // namespace meshtrain
