// Hugging Face config.json <-> meshtrain config keys, for `meshtrain import-hf` and `export-hf`: the
// model_types qwen3, qwen3_moe, deepseek_v3 and gpt2 (transformers' Qwen3Config, Qwen3MoeConfig,
// DeepseekV3Config, GPT2Config, 4.x and 5.x file forms). Anything the engine does not compute the way
// transformers does is refused, naming the file and key, never approximated.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "meshtrain/config/config.h"

namespace meshtrain {

// What a Hugging Face config.json says about the model, as meshtrain config overrides.
struct HfModelConfig {
  std::string model_type;  // "qwen3", "qwen3_moe", "deepseek_v3", "gpt2"
  // The preset the overrides are laid on: qwen3-tiny (qwen3, qwen3_moe), deepseek-tiny, gpt2-124m. It
  // brings the run keys (batch, steps, data); every model-shape key comes from the overrides.
  std::string preset;
  // "key=value" for every key of hf_model_shape_keys() (once each, in that order), then the model's own
  // recipe and identity keys: routed_bias_update_rate (DeepSeek-V3's 0.001, else 0: no selection bias) and
  // hf_bos_token_id, hf_eos_token_id, hf_pad_token_id (the id, null, or absent, as the file has them); for
  // gpt2 also max_target_length (the learned position table bounds it). load_config(preset, overrides)
  // builds the model the file describes whatever the preset's shape and recipe.
  std::vector<std::string> overrides;
  // What the file says the weights are (dtype, else torch_dtype): "float32", "bfloat16", "float16" or
  // "float64"; "" when it says nothing. Informational: the safetensors header is the authority.
  std::string weight_dtype;
  // What the import needs beyond the engine's keys: DeepSeek-V3's multi-token-prediction layers
  // (num_nextn_predict_layers: layers num_hidden_layers.. in the weights, which the import skips as
  // transformers' causal LM does), and the context length the model was trained for.
  int64_t prediction_layers = 0;
  std::optional<int64_t> max_position_embeddings;
};

// The model-shape keys the import always sets (shared/specs/config-keys.md's model shape plus the attention,
// MoE, Engram and mHC keys that change what the network computes). Beside them it sets the recipe and token
// id keys HfModelConfig::overrides names; run settings (batch, steps, data, learning rate,
// load_balance_loss_weight, max_target_length of RoPE models) are left to the preset (docs/interchange.md
// lists the decision key by key).
const std::vector<std::string>& hf_model_shape_keys();

// Maps a parsed config.json; `path` names the file in errors ("DIR/config.json: key 'attention_bias':
// expected false ..., found true (fix: ...)").
HfModelConfig hf_config_to_meshtrain(const nlohmann::json& hf, const std::string& path);
// Reads and parses `path`, then maps it (unreadable or malformed JSON is an error naming the file).
HfModelConfig read_hf_config(const std::string& path);

// What export-hf knows beyond the Config. bos / eos: the checkpoint's tokenizer's end-of-text id, written
// when the Config's hf_bos_token_id / hf_eos_token_id are "" (a model meshtrain trained, not imported).
struct HfSpecialTokens {
  std::optional<int64_t> bos_token_id, eos_token_id;
  // A model imported from Hugging Face: its own max_position_embeddings, exported when larger than the
  // context meshtrain trained it at (RoPE models; GPT-2's is its position table).
  std::optional<int64_t> max_position_embeddings = std::nullopt;
};

// The config.json of `config`'s model for transformers' from_pretrained (4.x and 5.x), vLLM and llama.cpp's
// convert_hf_to_gguf.py, with `dtype` ("float32", "bfloat16" or "float16": what the weights are written
// as) in both dtype and torch_dtype. A model Hugging Face cannot represent (Engram, mHC, routing the HF
// class does not have) is an error naming the config key.
nlohmann::ordered_json hf_config_from_meshtrain(const Config& config, const std::string& dtype,
                                                const HfSpecialTokens& tokens = {});

}  // namespace meshtrain
