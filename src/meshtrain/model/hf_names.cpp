#include "meshtrain/model/hf_names.h"

#include <map>

#include "meshtrain/core/error.h"
#include "meshtrain/model/families.h"

namespace meshtrain {
namespace {

// Engine name suffix (after "decoder/layers_N/") -> Hugging Face suffix (after "model.layers.N."),
// transposed?
struct LayerName {
  const char* engine;
  const char* hf;
  bool transpose;
};
constexpr LayerName kLayerNames[] = {
    {"pre_self_attention_layer_norm/scale", "input_layernorm.weight", false},
    {"post_self_attention_layer_norm/scale", "post_attention_layernorm.weight", false},
    {"self_attention/query/kernel", "self_attn.q_proj.weight", true},
    {"self_attention/key/kernel", "self_attn.k_proj.weight", true},
    {"self_attention/value/kernel", "self_attn.v_proj.weight", true},
    {"self_attention/out/kernel", "self_attn.o_proj.weight", true},
    {"self_attention/query_norm/scale", "self_attn.q_norm.weight", false},
    {"self_attention/key_norm/scale", "self_attn.k_norm.weight", false},
    // Multi-head latent attention (model/layers/mla.h; Hugging Face DeepseekV3Attention). Their rotary
    // columns are interleaved in the file: hf_rope_column_order says where each engine column comes from.
    {"self_attention/wq_a/kernel", "self_attn.q_a_proj.weight", true},
    {"self_attention/q_norm/scale", "self_attn.q_a_layernorm.weight", false},
    {"self_attention/wq_b/kernel", "self_attn.q_b_proj.weight", true},
    {"self_attention/wkv_a/kernel", "self_attn.kv_a_proj_with_mqa.weight", true},
    {"self_attention/kv_norm/scale", "self_attn.kv_a_layernorm.weight", false},
    {"self_attention/wkv_b/kernel", "self_attn.kv_b_proj.weight", true},
    {"mlp/wi_0/kernel", "mlp.gate_proj.weight", true},
    {"mlp/wi_1/kernel", "mlp.up_proj.weight", true},
    {"mlp/wo/kernel", "mlp.down_proj.weight", true},
};

std::string hf_name_of(const std::string& engine_name) {
  if (engine_name == "token_embedder/embedding") return "model.embed_tokens.weight";
  if (engine_name == "decoder/decoder_norm/scale") return "model.norm.weight";
  if (engine_name == "decoder/logits_dense/kernel") return "lm_head.weight";
  const std::string prefix = "decoder/layers_";
  if (engine_name.starts_with(prefix)) {
    const size_t slash = engine_name.find('/', prefix.size());
    const std::string layer = engine_name.substr(prefix.size(), slash - prefix.size());
    const std::string rest = engine_name.substr(slash + 1);
    for (const LayerName& name : kLayerNames) {
      if (rest == name.engine) return "model.layers." + layer + "." + name.hf;
    }
  }
  MT_CHECK(false, "no Hugging Face name for parameter " + engine_name);
  return "";
}

bool is_transposed(const std::string& engine_name) {
  if (engine_name == "decoder/logits_dense/kernel") return true;
  for (const LayerName& name : kLayerNames) {
    if (engine_name.ends_with(name.engine)) return name.transpose;
  }
  return false;
}

}  // namespace

std::string hugging_face_name(const std::string& engine_name) {
  return hf_name_of(engine_name);
}

std::vector<int64_t> hf_rope_column_order(int64_t rope_dim) {
  MT_CHECK(rope_dim % 2 == 0, "rotary widths are even");
  std::vector<int64_t> order(static_cast<size_t>(rope_dim));
  for (int64_t i = 0; i < rope_dim / 2; ++i) {
    order[static_cast<size_t>(i)] = 2 * i;                     // pair i's first element
    order[static_cast<size_t>(i + rope_dim / 2)] = 2 * i + 1;  // and its second
  }
  return order;
}

std::vector<HfTensorMapping> qwen3_hf_mapping(const ModelSpec& spec) {
  MT_CHECK(family_of(spec.config).hugging_face_mapping, "the Hugging Face mapping covers qwen3 only");
  std::vector<HfTensorMapping> mapping;
  for (const ParameterDecl& parameter : spec.parameters) {
    const BufferDecl& buffer = spec.buffer(parameter.value);
    HfTensorMapping entry{hf_name_of(buffer.name), parameter.value, is_transposed(buffer.name), 0, 0};
    const int64_t first = buffer.shape.dims.front();
    const int64_t elements = buffer.shape.elements();
    if (buffer.shape.dims.size() == 1) {
      entry.hf_cols = first;
    } else if (buffer.name == "token_embedder/embedding") {
      entry.hf_rows = spec.dims.V_valid;  // the file holds the tokenizer's rows, not the padding
      entry.hf_cols = spec.dims.D;
    } else if (buffer.name == "decoder/logits_dense/kernel") {
      entry.hf_rows = spec.dims.V_valid;
      entry.hf_cols = spec.dims.D;
    } else {
      // Kernels: [in..., out...]; the input part is the first axis except for the attention output ([H, d,
      // D]).
      const bool input_is_heads = buffer.name.ends_with("self_attention/out/kernel");
      const int64_t in = input_is_heads ? buffer.shape.dims[0] * buffer.shape.dims[1] : first;
      entry.hf_rows = elements / in;  // out
      entry.hf_cols = in;
    }
    mapping.push_back(entry);
  }
  return mapping;
}

void load_hf_qwen3(const SafetensorsFile& file, const ModelSpec& spec,
                   const std::function<float*(BufferId)>& parameter_data) {
  for (const HfTensorMapping& entry : qwen3_hf_mapping(spec)) {
    const std::vector<int64_t> hf_shape = entry.hf_rows == 0
                                              ? std::vector<int64_t>{entry.hf_cols}
                                              : std::vector<int64_t>{entry.hf_rows, entry.hf_cols};
    float* destination = parameter_data(entry.parameter);
    if (!entry.transpose) {
      file.read_f32(entry.hf_name, hf_shape, destination);
      continue;
    }
    std::vector<float> staged(static_cast<size_t>(entry.hf_rows * entry.hf_cols));
    file.read_f32(entry.hf_name, hf_shape, staged.data());
    // Engine [in, out] from file [out, in]; for the unembedding the engine's out axis is the padded vocab.
    const int64_t engine_out = spec.buffer(entry.parameter).shape.elements() / entry.hf_cols;
    for (int64_t out = 0; out < entry.hf_rows; ++out) {
      for (int64_t in = 0; in < entry.hf_cols; ++in) {
        destination[in * engine_out + out] = staged[static_cast<size_t>(out * entry.hf_cols + in)];
      }
    }
  }
}

}  // namespace meshtrain
