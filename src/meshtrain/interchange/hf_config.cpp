// hf_config.h's mapping: a reader whose errors name config.json's keys, one importer per model_type and one
// exporter per decoder_block. The defaults assumed for absent keys are transformers' class defaults
// (checked against 4.51.3, 4.57.1 and 5.25.0); sizes and counts have no default here, since a default taken
// from DeepSeek-V3 or Qwen3-8B would build a model the weights do not fit.
#include "meshtrain/interchange/hf_config.h"

#include <charconv>
#include <cstdint>
#include <fstream>
#include <limits>
#include <sstream>
#include <utility>

#include "meshtrain/core/durable_file.h"
#include "meshtrain/core/error.h"

namespace meshtrain {
namespace {

using Json = nlohmann::json;

const char* const kSupportedTypes = "qwen3, qwen3_moe, deepseek_v3 or gpt2";
const char* const kExportHint = "export-hf needs a model Hugging Face can represent";
// The fix of a refusal without a better one: the difference is the model's, not the file's.
const char* const kImportHint =
    "meshtrain imports a checkpoint only when it computes the same model as transformers";
const char* const kTypeHint = "write the value as transformers' save_pretrained does";
// transformers' RotaryEmbeddingConfigMixin.default_theta, and the rope_theta default of every 4.x class here.
constexpr double kHfDefaultRopeTheta = 10000.0;

// The shortest text that reads back as the same double (config values parse with strtod).
std::string number_text(double value) {
  char text[64];
  const auto result = std::to_chars(text, text + sizeof(text), value);
  return std::string(text, result.ptr);
}
std::string int_text(int64_t value) {
  return std::to_string(value);
}
std::string bool_text(bool value) {
  return value ? "true" : "false";
}

// One JSON object of config.json (the file, or a nested object such as rope_parameters): typed reads whose
// errors name the file and the key, with the value found as JSON.
class HfObject {
 public:
  HfObject(const Json& object, std::string path, std::string prefix = "")
      : object_(&object), path_(std::move(path)), prefix_(std::move(prefix)) {}

  const Json& json() const { return *object_; }
  std::string key_name(const std::string& key) const { return prefix_ + key; }
  std::string where(const std::string& key) const { return path_ + ": key '" + key_name(key) + "'"; }
  [[noreturn]] void refuse(const std::string& key, const std::string& expected, const Json& found,
                           const std::string& hint = "") const {
    fail(where(key), expected, found.dump(), hint.empty() ? kImportHint : hint);
  }
  HfObject child(const std::string& key) const {
    return HfObject(object_->at(key), path_, key_name(key) + ".");
  }

  // nullptr when absent; null counts as present here (callers that give null a meaning ask for it).
  const Json* find(const std::string& key) const {
    const auto found = object_->find(key);
    return found == object_->end() ? nullptr : &*found;
  }
  bool has_value(const std::string& key) const {
    const Json* value = find(key);
    return value != nullptr && !value->is_null();
  }

  // A size or count: absent or null is an error naming the key (no default of transformers' fits).
  int64_t required_int(const std::string& key, const std::string& model_type) const {
    const Json* value = find(key);
    if (value == nullptr || value->is_null()) {
      fail(where(key), "an integer (model_type " + model_type + " needs it)",
           value == nullptr ? "no such key" : "null",
           "config.json as save_pretrained writes it has every key; add '" + key_name(key) + "'");
    }
    return as_int(key, *value);
  }
  int64_t required_positive(const std::string& key, const std::string& model_type) const {
    const int64_t value = required_int(key, model_type);
    if (value <= 0) refuse(key, "a positive integer", *find(key), "sizes and counts are at least 1");
    return value;
  }
  int64_t int_or(const std::string& key, int64_t fallback) const {
    return has_value(key) ? as_int(key, *find(key)) : fallback;
  }
  double number_or(const std::string& key, double fallback) const {
    if (!has_value(key)) return fallback;
    const Json& value = *find(key);
    if (!value.is_number()) refuse(key, "a number", value, kTypeHint);
    return value.get<double>();
  }
  bool bool_or(const std::string& key, bool fallback) const {
    if (!has_value(key)) return fallback;
    const Json& value = *find(key);
    if (!value.is_boolean()) refuse(key, "true or false", value, kTypeHint);
    return value.get<bool>();
  }
  std::string string_or(const std::string& key, const std::string& fallback) const {
    if (!has_value(key)) return fallback;
    const Json& value = *find(key);
    if (!value.is_string()) refuse(key, "a string", value, kTypeHint);
    return value.get<std::string>();
  }

  // A flag the engine supports only at one value (absent: transformers' default `fallback`).
  void require_bool(const std::string& key, bool fallback, bool supported, const std::string& why) const {
    if (bool_or(key, fallback) != supported) refuse(key, bool_text(supported) + " (" + why + ")", *find(key));
  }

 private:
  int64_t as_int(const std::string& key, const Json& value) const {
    if (value.is_number_unsigned() &&
        value.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      refuse(key, "an integer that fits int64", value, kTypeHint);
    }
    if (!value.is_number_integer()) refuse(key, "an integer", value, kTypeHint);
    return value.get<int64_t>();
  }

  const Json* object_;  // a pointer, so that an HfObject can be reassigned to a nested one
  std::string path_, prefix_;
};

// The model-shape overrides, in hf_model_shape_keys() order. A key a family does not use keeps its base.yaml
// default, so the preset's value never leaks in; "" marks the keys every importer must set.
class Overrides {
 public:
  Overrides() : values_(canonical()) {}

  static std::vector<std::pair<std::string, std::string>> canonical() {
    return {{"decoder_block", ""},
            {"base_emb_dim", ""},
            {"base_num_query_heads", ""},
            {"base_num_kv_heads", ""},
            {"head_dim", ""},
            {"base_mlp_dim", ""},
            {"base_num_decoder_layers", ""},
            {"vocab_size", ""},
            {"max_position_embeddings", "0"},  // learned positions only (gpt2)
            {"logits_via_embedding", ""},
            {"normalization_layer_epsilon", ""},
            {"rope_max_timescale", number_text(1e6)},
            {"attention_type", "global"},
            {"q_lora_rank", "0"},
            {"kv_lora_rank", "512"},
            {"qk_nope_head_dim", "128"},
            {"qk_rope_head_dim", "64"},
            {"v_head_dim", "128"},
            {"num_experts", "0"},
            {"num_experts_per_tok", "1"},
            {"base_moe_mlp_dim", "0"},
            {"first_num_dense_layers", "0"},
            {"shared_experts", "0"},
            {"routed_score_func", "softmax"},
            {"routed_bias", "false"},
            {"routed_scaling_factor", number_text(1.0)},
            {"norm_topk_prob", "false"},
            {"n_routing_groups", "1"},
            {"topk_routing_group", "1"},
            {"capacity_factor", number_text(0.0)},  // Hugging Face's MoE blocks are dropless
            {"engram_layers", "[]"},
            {"mhc_expansion_rate", "1"}};
  }

  void set(const std::string& key, const std::string& value) {
    for (auto& [name, text] : values_) {
      if (name == key) {
        text = value;
        return;
      }
    }
    MT_CHECK(false, "hf_config sets only hf_model_shape_keys(): " + key);
  }

  std::vector<std::string> lines() const {
    std::vector<std::string> out;
    for (const auto& [name, text] : values_) {
      MT_CHECK(!text.empty(), "every importer sets " + name);
      out.push_back(name + "=" + text);
    }
    return out;
  }

 private:
  std::vector<std::pair<std::string, std::string>> values_;
};

// ---- Import: what every family shares ------------------------------------------------------------------

void refuse_quantized(const HfObject& hf) {
  if (hf.has_value("quantization_config")) {
    hf.refuse(
        "quantization_config", "no quantization_config (float32, bfloat16 or float16 weights)",
        *hf.find("quantization_config"),
        "dequantize the checkpoint first (e.g. load it in transformers and save_pretrained it in bfloat16)");
  }
}

// `architectures`, when present, names the causal-LM class: another head (sequence classification, a bare
// base model) has weights this mapping does not describe.
void check_architectures(const HfObject& hf, const std::string& causal_lm) {
  if (!hf.has_value("architectures")) return;
  const Json& list = *hf.find("architectures");
  if (!list.is_array()) hf.refuse("architectures", "a list of class names", list);
  for (const Json& name : list) {
    if (!name.is_string() || name.get<std::string>() != causal_lm) {
      hf.refuse("architectures", "[\"" + causal_lm + "\"] (a causal language model)", list,
                "import a " + causal_lm + " checkpoint");
    }
  }
}

// The weights' dtype as the file states it: `dtype` (transformers >= 4.56 and 5.x) or `torch_dtype` (older).
std::string weight_dtype_of(const HfObject& hf) {
  const std::string dtype = hf.string_or("dtype", "");
  const std::string torch_dtype = hf.string_or("torch_dtype", "");
  if (!dtype.empty() && !torch_dtype.empty() && dtype != torch_dtype) {
    hf.refuse("torch_dtype", "the same dtype as key 'dtype' (\"" + dtype + "\")", *hf.find("torch_dtype"),
              "keep one of the two keys");
  }
  const std::string key = dtype.empty() ? "torch_dtype" : "dtype";
  const std::string value = dtype.empty() ? torch_dtype : dtype;
  if (!value.empty() && value != "float32" && value != "bfloat16" && value != "float16" &&
      value != "float64") {
    hf.refuse(key, "float32, bfloat16, float16 or float64 (what the importer reads)", *hf.find(key));
  }
  return value;
}

void require_swiglu_activation(const HfObject& hf) {
  // transformers' ACT2FN: "silu" and "swish" are both SiLU.
  const std::string act = hf.string_or("hidden_act", "silu");
  if (act != "silu" && act != "swish") {
    hf.refuse("hidden_act", "\"silu\" (meshtrain's MLP is SwiGLU)", *hf.find("hidden_act"));
  }
}

double positive_epsilon(const HfObject& hf, const std::string& key, double fallback) {
  const double epsilon = hf.number_or(key, fallback);
  if (!(epsilon > 0.0)) hf.refuse(key, "a positive number", *hf.find(key));
  return epsilon;
}

// RoPE parameters: a flat object, or (5.x) one object per layer type of which only full_attention is
// meshtrain's. Only plain RoPE ("default") over the whole head is supported.
void check_rope_object(const HfObject& rope) {
  const std::string type_key = rope.has_value("rope_type") ? "rope_type" : "type";  // "type": older files
  const std::string type = rope.string_or(type_key, "default");
  if (type != "default") {
    rope.refuse(
        type_key,
        "\"default\" (plain RoPE: meshtrain implements no YaRN, linear, dynamic, llama3 or other scaling)",
        *rope.find(type_key), "import a checkpoint without RoPE scaling");
  }
  if (rope.number_or("partial_rotary_factor", 1.0) != 1.0) {
    rope.refuse("partial_rotary_factor", "1.0 (RoPE over the whole head)",
                *rope.find("partial_rotary_factor"));
  }
}

// RoPE theta: rope_parameters.rope_theta (5.x), rope_scaling.rope_theta, or top-level rope_theta (4.x);
// transformers' default 10000 when none is given. Any scaling is refused. A file whose 4.x and 5.x values
// disagree would load as two models, so it is refused too.
double rope_theta_of(const HfObject& hf) {
  double theta = kHfDefaultRopeTheta;
  std::string theta_key;
  const auto take = [&](const HfObject& scope) {
    if (!scope.has_value("rope_theta")) return;
    const double value = scope.number_or("rope_theta", 0.0);
    if (!theta_key.empty() && value != theta) {
      scope.refuse("rope_theta", "the same theta as key '" + theta_key + "' (" + number_text(theta) + ")",
                   *scope.find("rope_theta"), "keep one theta; transformers 4.x and 5.x read different keys");
    }
    theta = value;
    theta_key = scope.key_name("rope_theta");
  };
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    if (!hf.has_value(key)) continue;
    if (!hf.find(key)->is_object()) hf.refuse(key, "an object or null", *hf.find(key));
    HfObject rope = hf.child(key);
    if (rope.find("full_attention") != nullptr && rope.find("full_attention")->is_object()) {
      rope = rope.child("full_attention");
    }
    for (const auto& [name, value] : rope.json().items()) {
      if (value.is_object()) {
        rope.refuse(name, "RoPE parameters of full_attention layers only (meshtrain has no sliding window)",
                    value);
      }
    }
    check_rope_object(rope);
    take(rope);
  }
  if (hf.number_or("partial_rotary_factor", 1.0) != 1.0) {
    hf.refuse("partial_rotary_factor", "1.0 (RoPE over the whole head)", *hf.find("partial_rotary_factor"));
  }
  take(hf);
  if (!(theta > 0.0)) hf.refuse(theta_key, "a positive RoPE theta", theta);
  return theta;
}

// ---- Import: one function per model_type ----------------------------------------------------------------

// Qwen3Attention with GQA and QK-norm, pre-norm RMSNorm, SwiGLU (Qwen3Config; also Qwen3MoeConfig's dense
// part). `head_dim_default`: what transformers uses when the key is absent.
void import_qwen3_common(const HfObject& hf, const std::string& model_type, int64_t head_dim_default,
                         Overrides& out) {
  const int64_t hidden = hf.required_positive("hidden_size", model_type);
  const int64_t heads = hf.required_positive("num_attention_heads", model_type);
  // Null means "as many as the query heads" (transformers' backward compatibility); absent would be the
  // class default (32 / 4), which only fits the model it came from.
  int64_t kv_heads = heads;
  if (hf.find("num_key_value_heads") == nullptr || !hf.find("num_key_value_heads")->is_null()) {
    kv_heads = hf.required_positive("num_key_value_heads", model_type);
  }
  if (heads % kv_heads != 0) {
    hf.refuse("num_key_value_heads", "a divisor of num_attention_heads (" + int_text(heads) + ")",
              *hf.find("num_key_value_heads"),
              "grouped-query attention shares each kv head among H/K query heads");
  }
  int64_t head_dim = head_dim_default;
  if (hf.find("head_dim") != nullptr) {
    head_dim = hf.find("head_dim")->is_null() ? hidden / heads : hf.required_positive("head_dim", model_type);
  }
  if (head_dim <= 0)
    hf.refuse("hidden_size", "at least num_attention_heads (head_dim = hidden_size / heads)", hidden);

  require_swiglu_activation(hf);
  hf.require_bool("attention_bias", false, false, "meshtrain's attention has no q / k / v / o biases");
  hf.require_bool("use_sliding_window", false, false, "meshtrain's attention is global causal attention");
  if (hf.has_value("layer_types")) {
    const Json& types = *hf.find("layer_types");
    if (!types.is_array()) hf.refuse("layer_types", "a list of layer types", types);
    for (const Json& type : types) {
      if (type != "full_attention") {
        hf.refuse("layer_types", "\"full_attention\" for every layer (meshtrain has no sliding window)",
                  type);
      }
    }
  }

  out.set("decoder_block", "qwen3");
  out.set("base_emb_dim", int_text(hidden));
  out.set("base_num_query_heads", int_text(heads));
  out.set("base_num_kv_heads", int_text(kv_heads));
  out.set("head_dim", int_text(head_dim));
  out.set("base_mlp_dim", int_text(hf.required_positive("intermediate_size", model_type)));
  out.set("base_num_decoder_layers", int_text(hf.required_positive("num_hidden_layers", model_type)));
  out.set("vocab_size", int_text(hf.required_positive("vocab_size", model_type)));
  out.set("logits_via_embedding", bool_text(hf.bool_or("tie_word_embeddings", false)));
  out.set("normalization_layer_epsilon", number_text(positive_epsilon(hf, "rms_norm_eps", 1e-6)));
  out.set("rope_max_timescale", number_text(rope_theta_of(hf)));
}

void import_qwen3(const HfObject& hf, Overrides& out) {
  check_architectures(hf, "Qwen3ForCausalLM");
  import_qwen3_common(hf, "qwen3", 128, out);  // Qwen3Config.head_dim defaults to 128, not hidden / heads
}

// Qwen3MoeSparseMoeBlock: softmax over the experts, top-k, optional renormalisation, no shared expert, no
// groups, no scaling; layers in mlp_only_layers keep Qwen3MoeMLP of intermediate_size.
void import_qwen3_moe(const HfObject& hf, Overrides& out) {
  const std::string type = "qwen3_moe";
  check_architectures(hf, "Qwen3MoeForCausalLM");
  const int64_t hidden = hf.required_positive("hidden_size", type);
  const int64_t heads = hf.required_positive("num_attention_heads", type);
  // Qwen3MoeConfig has no head_dim attribute: the attention falls back to hidden_size // heads.
  import_qwen3_common(hf, type, hidden / heads, out);
  const int64_t layers = hf.required_positive("num_hidden_layers", type);

  // 5.x saves num_experts as num_local_experts (attribute_map); 4.x as num_experts.
  const bool local = hf.find("num_local_experts") != nullptr;
  const std::string experts_key = local ? "num_local_experts" : "num_experts";
  const int64_t experts = hf.required_int(experts_key, type);
  if (experts < 0) hf.refuse(experts_key, "0 (dense) or more experts", *hf.find(experts_key));
  if (local && hf.find("num_experts") != nullptr && hf.required_int("num_experts", type) != experts) {
    hf.refuse("num_experts", "the same count as key 'num_local_experts' (" + int_text(experts) + ")",
              *hf.find("num_experts"), "keep one of the two keys");
  }
  if (experts == 0) return;  // every layer a Qwen3MoeMLP: the dense keys already say so

  const int64_t top_k = hf.required_positive("num_experts_per_tok", type);
  if (top_k > experts) {
    hf.refuse("num_experts_per_tok", "at most " + experts_key + " (" + int_text(experts) + ")",
              *hf.find("num_experts_per_tok"));
  }
  if (hf.int_or("decoder_sparse_step", 1) != 1) {
    hf.refuse("decoder_sparse_step", "1 (every layer after the mlp_only_layers a mixture of experts)",
              *hf.find("decoder_sparse_step"),
              "meshtrain's MoE layers are all the layers after the dense ones");
  }
  // mlp_only_layers must be the leading layers [0, 1, ..., k - 1]: meshtrain's first_num_dense_layers = k.
  int64_t dense_layers = 0;
  if (hf.has_value("mlp_only_layers")) {
    const Json& list = *hf.find("mlp_only_layers");
    const std::string expected =
        "the leading layers [0, 1, ..., k - 1] with k <= num_hidden_layers (" + int_text(layers) + ")";
    if (!list.is_array()) hf.refuse("mlp_only_layers", expected, list);
    for (const Json& layer : list) {
      if (!layer.is_number_integer() || layer.get<int64_t>() != dense_layers || dense_layers >= layers) {
        hf.refuse("mlp_only_layers", expected, list, "meshtrain keeps dense MLPs only in the first layers");
      }
      ++dense_layers;
    }
  }
  // router_aux_loss_coef is not mapped: transformers adds it to the loss only with output_router_logits
  // (false in every released Qwen3-MoE config), and then over all layers' tokens pooled in one term, which
  // no per-layer load_balance_loss_weight reproduces. Training with a balance loss is the run's choice.
  out.set("num_experts", int_text(experts));
  out.set("num_experts_per_tok", int_text(top_k));
  out.set("base_moe_mlp_dim", int_text(hf.required_positive("moe_intermediate_size", type)));
  out.set("first_num_dense_layers", int_text(dense_layers));
  out.set("norm_topk_prob", bool_text(hf.bool_or("norm_topk_prob", false)));
}

// DeepseekV3ForCausalLM: multi-head latent attention (rope_interleave), dense DeepseekV3MLP in the first
// first_k_dense_replace layers, then DeepseekV3MoE (DeepseekV3TopkRouter: sigmoid scores, the
// e_score_correction_bias for the choice only, n_group groups scored by their top-2 sum, topk_group kept,
// top-k, optional renormalisation, x routed_scaling_factor) plus n_shared_experts shared experts.
void import_deepseek_v3(const HfObject& hf, Overrides& out) {
  const std::string type = "deepseek_v3";
  check_architectures(hf, "DeepseekV3ForCausalLM");
  const int64_t layers = hf.required_positive("num_hidden_layers", type);
  const int64_t heads = hf.required_positive("num_attention_heads", type);
  // MLA expands one key / value per query head; transformers' attention needs num_key_value_heads equal to
  // the heads too (it repeats keys by heads / kv heads).
  if (hf.has_value("num_key_value_heads") && hf.required_int("num_key_value_heads", type) != heads) {
    hf.refuse("num_key_value_heads",
              "num_attention_heads (" + int_text(heads) + "): multi-head latent attention",
              *hf.find("num_key_value_heads"));
  }
  require_swiglu_activation(hf);
  hf.require_bool("attention_bias", false, false, "meshtrain's MLA projections have no biases");
  // The weight import permutes the rotary columns from the interleaved layout (interchange/hf_names.h).
  hf.require_bool("rope_interleave", true, true, "the importer converts interleaved rotary columns");
  // DeepSeek's own config.json (trust_remote_code) names the routing; transformers' class always does this.
  if (hf.string_or("scoring_func", "sigmoid") != "sigmoid") {
    hf.refuse("scoring_func", "\"sigmoid\" (DeepSeek-V3 routing)", *hf.find("scoring_func"));
  }
  if (hf.string_or("topk_method", "noaux_tc") != "noaux_tc") {
    hf.refuse("topk_method", "\"noaux_tc\" (DeepSeek-V3's group-limited routing with the correction bias)",
              *hf.find("topk_method"), "DeepSeek-V2's greedy routing is not DeepseekV3ForCausalLM's");
  }
  if (hf.int_or("moe_layer_freq", 1) != 1) {
    hf.refuse("moe_layer_freq", "1 (every layer after first_k_dense_replace a mixture of experts)",
              *hf.find("moe_layer_freq"));
  }
  // num_nextn_predict_layers (multi-token prediction) is not read here: those modules sit after the
  // num_hidden_layers layers, and the weight import skips their tensors as transformers' causal LM does.
  const int64_t qk_nope = hf.required_positive("qk_nope_head_dim", type);
  const int64_t qk_rope = hf.required_positive("qk_rope_head_dim", type);
  const Json* q_rank = hf.find("q_lora_rank");
  const int64_t q_lora_rank =
      q_rank != nullptr && q_rank->is_null() ? 0 : hf.required_positive("q_lora_rank", type);  // null: q_proj

  out.set("decoder_block", "deepseek");
  out.set("attention_type", "mla");
  out.set("base_emb_dim", int_text(hf.required_positive("hidden_size", type)));
  out.set("base_num_query_heads", int_text(heads));
  out.set("base_num_kv_heads", int_text(heads));
  out.set("head_dim", int_text(qk_nope + qk_rope));  // not read under mla; the deepseek presets' convention
  out.set("q_lora_rank", int_text(q_lora_rank));
  out.set("kv_lora_rank", int_text(hf.required_positive("kv_lora_rank", type)));
  out.set("qk_nope_head_dim", int_text(qk_nope));
  out.set("qk_rope_head_dim", int_text(qk_rope));
  out.set("v_head_dim", int_text(hf.required_positive("v_head_dim", type)));
  out.set("base_mlp_dim", int_text(hf.required_positive("intermediate_size", type)));
  out.set("base_num_decoder_layers", int_text(layers));
  out.set("vocab_size", int_text(hf.required_positive("vocab_size", type)));
  out.set("logits_via_embedding", bool_text(hf.bool_or("tie_word_embeddings", false)));
  out.set("normalization_layer_epsilon", number_text(positive_epsilon(hf, "rms_norm_eps", 1e-6)));
  out.set("rope_max_timescale", number_text(rope_theta_of(hf)));

  const int64_t experts = hf.required_int("n_routed_experts", type);
  if (experts < 0) hf.refuse("n_routed_experts", "0 or more routed experts", *hf.find("n_routed_experts"));
  const int64_t dense_layers = hf.required_int("first_k_dense_replace", type);
  if (dense_layers < 0)
    hf.refuse("first_k_dense_replace", "0 or more layers", *hf.find("first_k_dense_replace"));
  if (experts == 0 || dense_layers >= layers) return;  // every layer a dense DeepseekV3MLP

  const int64_t top_k = hf.required_positive("num_experts_per_tok", type);
  const int64_t groups = hf.required_positive("n_group", type);
  const int64_t groups_kept = hf.required_positive("topk_group", type);
  if (experts % groups != 0) {
    hf.refuse("n_group", "a divisor of n_routed_experts (" + int_text(experts) + ")", *hf.find("n_group"));
  }
  if (groups_kept > groups) {
    hf.refuse("topk_group", "at most n_group (" + int_text(groups) + ")", *hf.find("topk_group"));
  }
  if (top_k > groups_kept * (experts / groups)) {
    hf.refuse("num_experts_per_tok",
              "at most the experts of the kept groups, topk_group x n_routed_experts / n_group = " +
                  int_text(groups_kept * (experts / groups)),
              *hf.find("num_experts_per_tok"));
  }
  const int64_t shared = hf.required_int("n_shared_experts", type);
  if (shared < 0) hf.refuse("n_shared_experts", "0 or more shared experts", *hf.find("n_shared_experts"));
  out.set("num_experts", int_text(experts));
  out.set("num_experts_per_tok", int_text(top_k));
  out.set("base_moe_mlp_dim", int_text(hf.required_positive("moe_intermediate_size", type)));
  out.set("first_num_dense_layers", int_text(dense_layers));
  out.set("shared_experts", int_text(shared));
  out.set("routed_score_func", "sigmoid");
  out.set("routed_bias", "true");  // e_score_correction_bias
  out.set("routed_scaling_factor", number_text(hf.number_or("routed_scaling_factor", 2.5)));
  out.set("norm_topk_prob", bool_text(hf.bool_or("norm_topk_prob", true)));
  out.set("n_routing_groups", int_text(groups));
  out.set("topk_routing_group", int_text(groups_kept));
}

// GPT2LMHeadModel: LayerNorm, multi-head attention with biases, GELU (tanh) MLP, learned positions, tied
// embeddings. Returns n_positions (the learned table bounds the sequence length).
int64_t import_gpt2(const HfObject& hf, Overrides& out) {
  const std::string type = "gpt2";
  check_architectures(hf, "GPT2LMHeadModel");
  const int64_t width = hf.required_positive("n_embd", type);
  const int64_t heads = hf.required_positive("n_head", type);
  if (width % heads != 0) {
    hf.refuse("n_head", "a divisor of n_embd (" + int_text(width) + ")", *hf.find("n_head"));
  }
  const int64_t positions = hf.required_positive("n_positions", type);
  const int64_t inner = hf.has_value("n_inner") ? hf.required_positive("n_inner", type) : 4 * width;
  // gelu_new, gelu_pytorch_tanh and gelu_fast are all 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))),
  // meshtrain's GELU; "gelu" is the erf form.
  const std::string act = hf.string_or("activation_function", "gelu_new");
  if (act != "gelu_new" && act != "gelu_pytorch_tanh" && act != "gelu_fast") {
    hf.refuse("activation_function",
              "gelu_new, gelu_pytorch_tanh or gelu_fast (meshtrain's GELU is the tanh approximation)",
              *hf.find("activation_function"));
  }
  hf.require_bool("scale_attn_weights", true, true, "meshtrain scales attention scores by 1/sqrt(head_dim)");
  hf.require_bool("scale_attn_by_inverse_layer_idx", false, false,
                  "meshtrain does not scale attention by 1 / (layer + 1)");
  hf.require_bool("add_cross_attention", false, false,
                  "meshtrain's GPT-2 is a decoder without cross-attention");
  hf.require_bool("tie_word_embeddings", true, true, "meshtrain's GPT-2 unembedding is the embedding table");
  // reorder_and_upcast_attn is read but allowed: it only computes the same scores in float32 with the scale
  // folded into the matmul, which is what meshtrain does anyway.
  hf.bool_or("reorder_and_upcast_attn", false);

  out.set("decoder_block", "gpt2");
  out.set("base_emb_dim", int_text(width));
  out.set("base_num_query_heads", int_text(heads));
  out.set("base_num_kv_heads", int_text(heads));
  out.set("head_dim", int_text(width / heads));
  out.set("base_mlp_dim", int_text(inner));
  out.set("base_num_decoder_layers", int_text(hf.required_positive("n_layer", type)));
  out.set("vocab_size", int_text(hf.required_positive("vocab_size", type)));
  out.set("max_position_embeddings", int_text(positions));
  out.set("logits_via_embedding", "true");
  out.set("normalization_layer_epsilon", number_text(positive_epsilon(hf, "layer_norm_epsilon", 1e-5)));
  return positions;
}

// config.json's bos / eos / pad token id as hf_<key> records it: the id, "null", or "absent" (transformers
// then fills in its class default, which the export must leave it to do again).
std::string special_token_id(const HfObject& hf, const std::string& key, int64_t vocab_size) {
  const Json* value = hf.find(key);
  if (value == nullptr) return "absent";
  if (value->is_null()) return "null";
  const std::string expected = "a token id in [0, vocab_size = " + int_text(vocab_size) + ") or null";
  if (!value->is_number_integer()) hf.refuse(key, expected, *value, kTypeHint);
  // A parsed non-negative integer is unsigned (up to 2^64 - 1), a negative one signed.
  const bool in_vocabulary = value->is_number_unsigned()
                                 ? value->get<uint64_t>() < static_cast<uint64_t>(vocab_size)
                                 : value->get<int64_t>() >= 0 && value->get<int64_t>() < vocab_size;
  if (!in_vocabulary) {
    hf.refuse(key, expected, *value,
              "the id must name a row of the model's vocabulary (null: the model has no such token)");
  }
  return int_text(value->get<int64_t>());
}

// DeepSeek-V3's selection bias moves by 0.001 a step over the paper's first 14.3T tokens (arXiv 2412.19437,
// section 4.2, "bias update speed"); the other families have no selection bias.
constexpr double kDeepseekV3BiasUpdateRate = 0.001;

// ---- Export ---------------------------------------------------------------------------------------------

[[noreturn]] void refuse_export(const std::string& key, const std::string& expected, const std::string& found,
                                const std::string& why) {
  fail("config key '" + key + "'", expected, found, std::string(kExportHint) + ": " + why);
}

std::string list_text(const std::vector<int64_t>& values) {
  std::string text = "[";
  for (size_t i = 0; i < values.size(); ++i) text += (i ? ", " : "") + int_text(values[i]);
  return text + "]";
}

// Keys every exported config.json carries: RoPE theta where both transformers 4.x (top-level) and 5.x
// (rope_parameters) look, the dtype under both names, the special token ids as imported or known.
void add_rope(nlohmann::ordered_json& hf, const Config& c) {
  hf["rope_theta"] = c.rope_max_timescale;
  hf["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", c.rope_max_timescale}};
  // The trained context: vLLM and llama.cpp take it as the model's length (meshtrain's RoPE has no limit).
  hf["max_position_embeddings"] = c.max_target_length;
}
// A special token id as the imported config.json had it (hf_<key>: an id, null, or absent), else what
// meshtrain knows (`known`).
void add_special_token_id(nlohmann::ordered_json& hf, const std::string& key, const std::string& recorded,
                          std::optional<int64_t> known) {
  if (recorded.empty()) {
    if (known) hf[key] = *known;
  } else if (recorded == "null") {
    hf[key] = nullptr;
  } else if (recorded != "absent") {
    hf[key] = std::stoll(recorded);  // load_config checked it is an id
  }
}
void add_common_tail(nlohmann::ordered_json& hf, const Config& c, const std::string& dtype,
                     const HfSpecialTokens& tokens) {
  add_special_token_id(hf, "bos_token_id", c.hf_bos_token_id, tokens.bos_token_id);
  add_special_token_id(hf, "eos_token_id", c.hf_eos_token_id, tokens.eos_token_id);
  add_special_token_id(hf, "pad_token_id", c.hf_pad_token_id, std::nullopt);
  hf["initializer_range"] = 0.02;  // meshtrain's init std
  hf["use_cache"] = true;
  hf["dtype"] = dtype;
  hf["torch_dtype"] = dtype;
}

void require_attention(const Config& c, AttentionType type, const std::string& why) {
  if (c.attention_type != type) {
    refuse_export("attention_type", attention_type_name(type), attention_type_name(c.attention_type), why);
  }
}

nlohmann::ordered_json export_qwen3(const Config& c) {
  require_attention(c, AttentionType::global, "Qwen3 has no multi-head latent attention");
  const bool moe = c.num_experts > 0;
  if (moe) {
    const std::string why = "Qwen3-MoE routes by softmax without bias, groups, scaling or shared experts";
    if (c.routed_score_func != RoutedScoreFunc::softmax) {
      refuse_export("routed_score_func", "softmax", routed_score_func_name(c.routed_score_func), why);
    }
    if (c.routed_bias) refuse_export("routed_bias", "false", "true", why);
    if (c.shared_experts != 0) refuse_export("shared_experts", "0", int_text(c.shared_experts), why);
    if (c.n_routing_groups != 1) refuse_export("n_routing_groups", "1", int_text(c.n_routing_groups), why);
    if (c.routed_scaling_factor != 1.0) {
      refuse_export("routed_scaling_factor", "1.0", number_text(c.routed_scaling_factor), why);
    }
  }
  const int64_t head_dim = c.head_dim > 0 ? c.head_dim : c.base_emb_dim / c.base_num_query_heads;
  nlohmann::ordered_json hf;
  hf["architectures"] = {moe ? "Qwen3MoeForCausalLM" : "Qwen3ForCausalLM"};
  hf["model_type"] = moe ? "qwen3_moe" : "qwen3";
  hf["hidden_size"] = c.base_emb_dim;
  hf["intermediate_size"] = c.base_mlp_dim;
  hf["num_hidden_layers"] = c.base_num_decoder_layers;
  hf["num_attention_heads"] = c.base_num_query_heads;
  hf["num_key_value_heads"] = c.base_num_kv_heads;
  hf["head_dim"] = head_dim;
  hf["vocab_size"] = c.vocab_size;
  hf["hidden_act"] = "silu";
  hf["rms_norm_eps"] = c.normalization_layer_epsilon;
  add_rope(hf, c);
  hf["attention_bias"] = false;
  hf["attention_dropout"] = 0.0;
  hf["use_sliding_window"] = false;
  hf["sliding_window"] = nullptr;
  // Every layer full attention, for readers that decide by max_window_layers or by layer_types.
  hf["max_window_layers"] = c.base_num_decoder_layers;
  hf["layer_types"] =
      std::vector<std::string>(static_cast<size_t>(c.base_num_decoder_layers), "full_attention");
  hf["tie_word_embeddings"] = c.logits_via_embedding;
  if (moe) {
    std::vector<int64_t> dense_layers;
    for (int64_t layer = 0; layer < c.first_num_dense_layers; ++layer) dense_layers.push_back(layer);
    hf["num_experts"] = c.num_experts;  // 5.x reads it through attribute_map as num_local_experts
    hf["num_experts_per_tok"] = c.num_experts_per_tok;
    hf["moe_intermediate_size"] = c.base_moe_mlp_dim;
    hf["norm_topk_prob"] = c.norm_topk_prob;
    hf["decoder_sparse_step"] = 1;
    hf["mlp_only_layers"] = dense_layers;
    // No router auxiliary loss in transformers' loss (see import_qwen3_moe).
    hf["output_router_logits"] = false;
  }
  return hf;
}

nlohmann::ordered_json export_deepseek(const Config& c) {
  require_attention(c, AttentionType::mla, "DeepseekV3ForCausalLM has multi-head latent attention only");
  const bool moe = c.num_experts > 0 && c.first_num_dense_layers < c.base_num_decoder_layers;
  if (moe) {
    const std::string why = "DeepseekV3ForCausalLM routes by sigmoid scores";
    if (c.routed_score_func != RoutedScoreFunc::sigmoid) {
      refuse_export("routed_score_func", "sigmoid", routed_score_func_name(c.routed_score_func), why);
    }
    if (!c.routed_bias) {
      refuse_export("routed_bias", "true", "false",
                    "DeepseekV3ForCausalLM always holds an e_score_correction_bias per MoE layer, which this "
                    "model does not have");
    }
    // transformers scores a group by its two best experts (torch.topk(2)), so a group needs two.
    if (c.n_routing_groups > 1 && c.num_experts / c.n_routing_groups < 2) {
      refuse_export(
          "n_routing_groups", "at most num_experts / 2 (" + int_text(c.num_experts / 2) + ") groups",
          int_text(c.n_routing_groups), "DeepseekV3TopkRouter scores each group by its two best experts");
    }
  }
  nlohmann::ordered_json hf;
  hf["architectures"] = {"DeepseekV3ForCausalLM"};
  hf["model_type"] = "deepseek_v3";
  hf["hidden_size"] = c.base_emb_dim;
  hf["intermediate_size"] = c.base_mlp_dim;
  hf["moe_intermediate_size"] = c.base_moe_mlp_dim;
  hf["num_hidden_layers"] = c.base_num_decoder_layers;
  hf["num_attention_heads"] = c.base_num_query_heads;
  hf["num_key_value_heads"] = c.base_num_query_heads;
  // A dense model is a DeepseekV3 whose layers are all among the first_k_dense_replace.
  hf["n_routed_experts"] = moe ? c.num_experts : 0;
  hf["n_shared_experts"] = moe ? c.shared_experts : 0;
  hf["num_experts_per_tok"] = moe ? c.num_experts_per_tok : 1;
  hf["first_k_dense_replace"] = moe ? c.first_num_dense_layers : c.base_num_decoder_layers;
  hf["n_group"] = moe ? c.n_routing_groups : 1;
  hf["topk_group"] = moe ? c.topk_routing_group : 1;
  hf["routed_scaling_factor"] = c.routed_scaling_factor;
  hf["norm_topk_prob"] = c.norm_topk_prob;
  // DeepSeek's own names for what transformers' class always does: vLLM and llama.cpp read them (llama.cpp
  // assumes softmax scoring without them).
  hf["topk_method"] = "noaux_tc";
  hf["scoring_func"] = "sigmoid";
  hf["moe_layer_freq"] = 1;
  hf["num_nextn_predict_layers"] = 0;  // no multi-token-prediction modules
  if (c.q_lora_rank > 0) {
    hf["q_lora_rank"] = c.q_lora_rank;
  } else {
    hf["q_lora_rank"] = nullptr;  // q_proj instead of q_a_proj / q_b_proj
  }
  hf["kv_lora_rank"] = c.kv_lora_rank;
  hf["qk_nope_head_dim"] = c.qk_nope_head_dim;
  hf["qk_rope_head_dim"] = c.qk_rope_head_dim;
  hf["v_head_dim"] = c.v_head_dim;
  hf["qk_head_dim"] = c.qk_nope_head_dim + c.qk_rope_head_dim;
  hf["head_dim"] = c.qk_rope_head_dim;  // transformers sets head_dim to the rotary width
  // The exporter writes the rotary columns interleaved, the inverse of the import's permutation.
  hf["rope_interleave"] = true;
  hf["vocab_size"] = c.vocab_size;
  hf["hidden_act"] = "silu";
  hf["rms_norm_eps"] = c.normalization_layer_epsilon;
  add_rope(hf, c);
  hf["attention_bias"] = false;
  hf["attention_dropout"] = 0.0;
  hf["tie_word_embeddings"] = c.logits_via_embedding;
  return hf;
}

nlohmann::ordered_json export_gpt2(const Config& c) {
  require_attention(c, AttentionType::global, "GPT-2 has no multi-head latent attention");
  const std::string why = "GPT2Attention is multi-head attention with head_dim = n_embd / n_head";
  if (c.base_num_kv_heads != c.base_num_query_heads) {
    refuse_export("base_num_kv_heads", "base_num_query_heads (" + int_text(c.base_num_query_heads) + ")",
                  int_text(c.base_num_kv_heads), why);
  }
  if (c.base_emb_dim % c.base_num_query_heads != 0 ||
      (c.head_dim != 0 && c.head_dim != c.base_emb_dim / c.base_num_query_heads)) {
    refuse_export("head_dim",
                  "base_emb_dim / base_num_query_heads (" + int_text(c.base_emb_dim) + " / " +
                      int_text(c.base_num_query_heads) + ")",
                  int_text(c.head_dim), why);
  }
  nlohmann::ordered_json hf;
  hf["architectures"] = {"GPT2LMHeadModel"};
  hf["model_type"] = "gpt2";
  hf["n_embd"] = c.base_emb_dim;
  hf["n_head"] = c.base_num_query_heads;
  hf["n_layer"] = c.base_num_decoder_layers;
  // null is GPT-2's own way of saying 4 n_embd (what transformers' configs for it write).
  hf["n_inner"] = c.base_mlp_dim == 4 * c.base_emb_dim ? nlohmann::ordered_json()
                                                       : nlohmann::ordered_json(c.base_mlp_dim);
  hf["n_positions"] = c.max_position_embeddings;
  hf["n_ctx"] = c.max_position_embeddings;  // the name of OpenAI's original configs
  hf["vocab_size"] = c.vocab_size;
  hf["activation_function"] = "gelu_new";
  hf["layer_norm_epsilon"] = c.normalization_layer_epsilon;
  hf["scale_attn_weights"] = true;
  hf["scale_attn_by_inverse_layer_idx"] = false;
  hf["reorder_and_upcast_attn"] = false;
  hf["add_cross_attention"] = false;
  // meshtrain trains without dropout; transformers' defaults (0.1) would change fine-tuning in HF.
  hf["attn_pdrop"] = 0.0;
  hf["embd_pdrop"] = 0.0;
  hf["resid_pdrop"] = 0.0;
  hf["tie_word_embeddings"] = true;
  return hf;
}

}  // namespace

const std::vector<std::string>& hf_model_shape_keys() {
  static const std::vector<std::string> keys = [] {
    std::vector<std::string> names;
    for (const auto& [name, value] : Overrides::canonical()) names.push_back(name);
    return names;
  }();
  return keys;
}

HfModelConfig hf_config_to_meshtrain(const nlohmann::json& json, const std::string& path) {
  if (!json.is_object()) {
    fail(path, "a JSON object (a Hugging Face config.json)", std::string("a JSON ") + json.type_name());
  }
  const HfObject hf(json, path);
  if (!hf.has_value("model_type")) {
    fail(hf.where("model_type"), std::string("a model_type (") + kSupportedTypes + ")",
         hf.find("model_type") == nullptr ? "no such key" : "null",
         "import a Hugging Face transformers checkpoint");
  }
  HfModelConfig result;
  result.model_type = hf.string_or("model_type", "");
  const std::string& type = result.model_type;
  if (type != "qwen3" && type != "qwen3_moe" && type != "deepseek_v3" && type != "gpt2") {
    hf.refuse("model_type", kSupportedTypes, *hf.find("model_type"),
              "meshtrain imports Qwen3, Qwen3-MoE, DeepSeek-V3 and GPT-2 checkpoints");
  }
  refuse_quantized(hf);
  result.weight_dtype = weight_dtype_of(hf);
  Overrides out;
  std::vector<std::string> run_keys;
  if (type == "qwen3") {
    result.preset = "qwen3-tiny";
    import_qwen3(hf, out);
  } else if (type == "qwen3_moe") {
    result.preset = "qwen3-tiny";
    import_qwen3_moe(hf, out);
  } else if (type == "deepseek_v3") {
    result.preset = "deepseek-tiny";
    import_deepseek_v3(hf, out);
  } else {
    result.preset = "gpt2-124m";
    // GPT-2 is trained at its full context, and a sequence longer than the position table is an error.
    run_keys.push_back("max_target_length=" + int_text(import_gpt2(hf, out)));
  }
  result.overrides = out.lines();
  result.overrides.push_back("routed_bias_update_rate=" +
                             number_text(type == "deepseek_v3" ? kDeepseekV3BiasUpdateRate : 0.0));
  const int64_t vocab_size = hf.required_positive("vocab_size", type);
  for (const char* key : {"bos_token_id", "eos_token_id", "pad_token_id"})
    result.overrides.push_back(std::string("hf_") + key + "=" + special_token_id(hf, key, vocab_size));
  result.overrides.insert(result.overrides.end(), run_keys.begin(), run_keys.end());
  if (type == "deepseek_v3") result.prediction_layers = hf.int_or("num_nextn_predict_layers", 0);
  if (hf.has_value("max_position_embeddings"))
    result.max_position_embeddings = hf.int_or("max_position_embeddings", 0);
  return result;
}

HfModelConfig read_hf_config(const std::string& path) {
  const std::string text = read_file_text(path, "Hugging Face config.json");
  Json json;
  try {
    json = Json::parse(text);
  } catch (const Json::parse_error& error) {
    fail(path, "valid JSON", error.what());
  }
  return hf_config_to_meshtrain(json, path);
}

nlohmann::ordered_json hf_config_from_meshtrain(const Config& c, const std::string& dtype,
                                                const HfSpecialTokens& tokens) {
  if (dtype != "float32" && dtype != "bfloat16" && dtype != "float16") {
    fail("export dtype", "float32, bfloat16 or float16", "'" + dtype + "'",
         "the weights' dtype in config.json");
  }
  if (!c.engram_layers.empty()) {
    refuse_export("engram_layers", "[]", list_text(c.engram_layers), "transformers has no Engram memory");
  }
  if (c.mhc_expansion_rate != 1) {
    refuse_export("mhc_expansion_rate", "1", int_text(c.mhc_expansion_rate),
                  "transformers has no mHC hyper-connections");
  }
  // capacity_factor > 0 is exported: it drops tokens only in training, and Hugging Face runs the same
  // experts dropless, as MoE models are served.
  nlohmann::ordered_json hf;
  switch (c.decoder_block) {
    case DecoderBlock::qwen3:
      hf = export_qwen3(c);
      break;
    case DecoderBlock::deepseek:
      hf = export_deepseek(c);
      break;
    case DecoderBlock::gpt2:
      hf = export_gpt2(c);
      break;
  }
  add_common_tail(hf, c, dtype, tokens);
  if (c.decoder_block != DecoderBlock::gpt2 && tokens.max_position_embeddings &&
      *tokens.max_position_embeddings > c.max_target_length) {
    hf["max_position_embeddings"] = *tokens.max_position_embeddings;
  }
  return hf;
}

}  // namespace meshtrain
