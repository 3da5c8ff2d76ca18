// The Hugging Face name table and loader (hf_names.h).
#include "meshtrain/interchange/hf_names.h"

#include <algorithm>
#include <set>
#include <utility>

#include "meshtrain/core/error.h"

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
    // Mixture of experts (model/layers/moe.h; DeepseekV3MoE / Qwen3MoeSparseMoeBlock). The routed experts
    // are stacked in the engine: kRoutedExperts.
    {"moe/gate/kernel", "mlp.gate.weight", true},
    {"moe/gate/selection_bias", "mlp.gate.e_score_correction_bias", false},
    {"moe/shared_experts/wi_0/kernel", "mlp.shared_experts.gate_proj.weight", true},
    {"moe/shared_experts/wi_1/kernel", "mlp.shared_experts.up_proj.weight", true},
    {"moe/shared_experts/wo/kernel", "mlp.shared_experts.down_proj.weight", true},
};

// Stacked routed experts: engine suffix -> the per-expert file suffix (after "mlp.experts.{e}."); the
// engine's [E, D, F_e] (wi_0, wi_1) or [E, F_e, D] (wo), the file's [F_e, D] or [D, F_e].
struct StackedName {
  const char* engine;
  const char* hf;
};
constexpr StackedName kRoutedExperts[] = {{"moe/routed_experts/wi_0", "gate_proj.weight"},
                                          {"moe/routed_experts/wi_1", "up_proj.weight"},
                                          {"moe/routed_experts/wo", "down_proj.weight"}};

const std::string kLayerPrefix = "decoder/layers_";

// GPT-2 (GPT2LMHeadModel, whose tensors sit under "transformer."): engine suffix -> Hugging Face suffix
// (after "transformer.h.N."). Conv1D weights are [in, out] like the engine's kernels; the attention's query,
// key and value are one fused c_attn tensor (kGpt2Fused).
constexpr LayerName kGpt2LayerNames[] = {
    {"pre_self_attention_layer_norm/scale", "ln_1.weight", false},
    {"pre_self_attention_layer_norm/bias", "ln_1.bias", false},
    {"self_attention/out/kernel", "attn.c_proj.weight", false},
    {"self_attention/out/bias", "attn.c_proj.bias", false},
    {"post_self_attention_layer_norm/scale", "ln_2.weight", false},
    {"post_self_attention_layer_norm/bias", "ln_2.bias", false},
    {"mlp/wi/kernel", "mlp.c_fc.weight", false},
    {"mlp/wi/bias", "mlp.c_fc.bias", false},
    {"mlp/wo/kernel", "mlp.c_proj.weight", false},
    {"mlp/wo/bias", "mlp.c_proj.bias", false},
};
// Engine suffix -> (fused file suffix, which third of its columns).
struct FusedName {
  const char* engine;
  const char* hf;
  int64_t block;
};
constexpr FusedName kGpt2Fused[] = {
    {"self_attention/query/kernel", "attn.c_attn.weight", 0},
    {"self_attention/key/kernel", "attn.c_attn.weight", 1},
    {"self_attention/value/kernel", "attn.c_attn.weight", 2},
    {"self_attention/query/bias", "attn.c_attn.bias", 0},
    {"self_attention/key/bias", "attn.c_attn.bias", 1},
    {"self_attention/value/bias", "attn.c_attn.bias", 2},
};

// "decoder/layers_12/self_attention/out/kernel" -> {"12", "self_attention/out/kernel"}; {"", name}
// outside the layers.
std::pair<std::string, std::string> split_layer(const std::string& engine_name) {
  if (!engine_name.starts_with(kLayerPrefix)) return {"", engine_name};
  const size_t slash = engine_name.find('/', kLayerPrefix.size());
  MT_CHECK(slash != std::string::npos, "layer parameter names have a suffix: " + engine_name);
  return {engine_name.substr(kLayerPrefix.size(), slash - kLayerPrefix.size()),
          engine_name.substr(slash + 1)};
}

const LayerName* layer_name(const std::string& rest) {
  for (const LayerName& name : kLayerNames) {
    if (rest == name.engine) return &name;
  }
  return nullptr;
}

const StackedName* routed_experts_name(const std::string& engine_name) {
  const std::string rest = split_layer(engine_name).second;
  for (const StackedName& name : kRoutedExperts) {
    if (rest == name.engine) return &name;
  }
  return nullptr;
}

std::string hf_name_of(const std::string& engine_name) {
  if (engine_name == "token_embedder/embedding") return "model.embed_tokens.weight";
  if (engine_name == "decoder/decoder_norm/scale") return "model.norm.weight";
  if (engine_name == "decoder/logits_dense/kernel") return "lm_head.weight";
  const auto [layer, rest] = split_layer(engine_name);
  const LayerName* name = layer.empty() ? nullptr : layer_name(rest);
  MT_CHECK(name != nullptr, "no single Hugging Face name for parameter " + engine_name);
  return "model.layers." + layer + "." + name->hf;
}

bool is_transposed(const std::string& engine_name) {
  if (engine_name == "decoder/logits_dense/kernel") return true;
  const auto [layer, rest] = split_layer(engine_name);
  const LayerName* name = layer.empty() ? nullptr : layer_name(rest);
  return name != nullptr && name->transpose;
}

// The file-row -> engine-out permutation (HfTensorMapping::engine_row) of a multi-head latent attention
// projection whose outputs are `groups` blocks of `width` columns, the last `rope` of each rotary
// (interleaved in the file, rotate-half in the engine); the other columns keep their place.
std::vector<int64_t> rotary_engine_rows(int64_t groups, int64_t width, int64_t rope) {
  const std::vector<int64_t> order = hf_rope_column_order(rope);  // engine column j <- file column order[j]
  std::vector<int64_t> engine_row(static_cast<size_t>(groups * width));
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t j = 0; j < width; ++j) {
      const int64_t file_column =
          j < width - rope ? j : width - rope + order[static_cast<size_t>(j - width + rope)];
      engine_row[static_cast<size_t>(g * width + file_column)] = g * width + j;
    }
  }
  return engine_row;
}

}  // namespace

int64_t engine_element(const HfTensorMapping& entry, int64_t row, int64_t col) {
  const int64_t out = entry.engine_row.empty() ? row : entry.engine_row[static_cast<size_t>(row)];
  return entry.engine_offset + (entry.transpose ? col * entry.engine_out + out : out * entry.hf_cols + col);
}

namespace {

// Calls copy(engine index, file index) for every element of the block, the engine index relative to
// engine_begin (checked against the span).
template <class Copy>
void for_each_block_element(const HfTensorMapping& entry, int64_t engine_begin, int64_t engine_span,
                            const Copy& copy) {
  const int64_t rows = std::max<int64_t>(entry.hf_rows, 1);
  for (int64_t row = 0; row < rows; ++row) {
    for (int64_t col = 0; col < entry.hf_cols; ++col) {
      const int64_t at = engine_element(entry, row, col) - engine_begin;
      MT_CHECK(at >= 0 && at < engine_span, "a mapping entry stays inside its span of " + entry.hf_name);
      copy(static_cast<size_t>(at), static_cast<size_t>(file_element(entry, row, col)));
    }
  }
}

}  // namespace

void hf_block_to_engine(const HfTensorMapping& entry, const float* file, float* engine, int64_t engine_begin,
                        int64_t engine_span) {
  for_each_block_element(entry, engine_begin, engine_span,
                         [&](size_t to, size_t from) { engine[to] = file[from]; });
}

void hf_block_to_file(const HfTensorMapping& entry, const float* engine, int64_t engine_begin,
                      int64_t engine_span, float* file) {
  for_each_block_element(entry, engine_begin, engine_span,
                         [&](size_t from, size_t to) { file[to] = engine[from]; });
}

int64_t file_element(const HfTensorMapping& entry, int64_t row, int64_t col) {
  const int64_t columns = entry.hf_total_cols > 0 ? entry.hf_total_cols : entry.hf_cols;
  return row * columns + entry.hf_col_begin + col;
}

std::vector<int64_t> file_shape(const HfTensorMapping& entry) {
  const int64_t columns = entry.hf_total_cols > 0 ? entry.hf_total_cols : entry.hf_cols;
  if (entry.hf_rows == 0) return {columns};
  return {entry.hf_rows, columns};
}

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

namespace {

// GPT-2's entries: every tensor in the file's [in, out] order, the fused c_attn as three column blocks.
std::vector<HfTensorMapping> gpt2_mapping(const ModelSpec& spec) {
  std::vector<HfTensorMapping> mapping;
  for (const ParameterDecl& parameter : spec.parameters) {
    const BufferDecl& buffer = spec.buffer(parameter.value);
    const int64_t elements = buffer.shape.elements();
    HfTensorMapping entry;
    entry.parameter = parameter.value;
    if (buffer.name == "token_embedder/embedding") {
      entry.hf_name = "transformer.wte.weight";
      entry.hf_rows = spec.dims.V_valid;  // the file holds the tokenizer's rows, not the padding
      entry.hf_cols = spec.dims.D;
    } else if (buffer.name == "position_embedder/embedding") {
      entry.hf_name = "transformer.wpe.weight";
      entry.hf_rows = buffer.shape.dims.front();
      entry.hf_cols = spec.dims.D;
    } else if (buffer.name == "decoder/decoder_norm/scale" || buffer.name == "decoder/decoder_norm/bias") {
      entry.hf_name = buffer.name.ends_with("scale") ? "transformer.ln_f.weight" : "transformer.ln_f.bias";
      entry.hf_cols = elements;
    } else {
      const auto [layer, rest] = split_layer(buffer.name);
      MT_CHECK(!layer.empty(), "no Hugging Face GPT-2 name for parameter " + buffer.name);
      const std::string hf_prefix = "transformer.h." + layer + ".";
      const bool bias = rest.ends_with("/bias");
      const FusedName* fused = nullptr;
      for (const FusedName& name : kGpt2Fused) {
        if (rest == name.engine) fused = &name;
      }
      if (fused != nullptr) {
        entry.hf_name = hf_prefix + fused->hf;
        const int64_t width = bias ? elements : elements / buffer.shape.dims.front();  // this block's columns
        entry.hf_rows = bias ? 0 : buffer.shape.dims.front();
        entry.hf_cols = width;
        entry.hf_col_begin = fused->block * width;
        entry.hf_total_cols = 3 * width;
      } else {
        const LayerName* name = nullptr;
        for (const LayerName& candidate : kGpt2LayerNames) {
          if (rest == candidate.engine) name = &candidate;
        }
        MT_CHECK(name != nullptr, "no Hugging Face GPT-2 name for parameter " + buffer.name);
        entry.hf_name = hf_prefix + name->hf;
        if (buffer.shape.dims.size() == 1) {
          entry.hf_cols = elements;
        } else {
          // Kernels [in..., out...]: the attention output's input is its [H, d] heads.
          const bool input_is_heads = rest == "self_attention/out/kernel";
          const int64_t in =
              input_is_heads ? buffer.shape.dims[0] * buffer.shape.dims[1] : buffer.shape.dims[0];
          entry.hf_rows = in;
          entry.hf_cols = elements / in;
        }
      }
    }
    mapping.push_back(std::move(entry));
  }
  return mapping;
}

}  // namespace

std::vector<HfTensorMapping> hf_mapping(const ModelSpec& spec) {
  const Config& c = spec.config;
  if (c.decoder_block == DecoderBlock::gpt2) return gpt2_mapping(spec);
  const bool mla = c.attention_type == AttentionType::mla;
  std::vector<HfTensorMapping> mapping;
  for (const ParameterDecl& parameter : spec.parameters) {
    const BufferDecl& buffer = spec.buffer(parameter.value);
    const std::vector<int64_t>& dims = buffer.shape.dims;
    if (const StackedName* stacked = routed_experts_name(buffer.name)) {
      MT_CHECK(dims.size() == 3, "routed experts are stacked [E, in, out]: " + buffer.name);
      const std::string layer = split_layer(buffer.name).first;
      for (int64_t e = 0; e < dims[0]; ++e) {
        // Expert e's [out, in] file tensor is slice e of the stacked [E, in, out] parameter.
        HfTensorMapping entry;
        entry.hf_name = "model.layers." + layer + ".mlp.experts." + std::to_string(e) + "." + stacked->hf;
        entry.parameter = parameter.value;
        entry.transpose = true;
        entry.hf_rows = dims[2];
        entry.hf_cols = dims[1];
        entry.engine_offset = e * dims[1] * dims[2];
        entry.engine_out = dims[2];
        mapping.push_back(std::move(entry));
      }
      continue;
    }
    HfTensorMapping entry;
    entry.hf_name = hf_name_of(buffer.name);
    entry.parameter = parameter.value;
    entry.transpose = is_transposed(buffer.name);
    entry.differentiable = !buffer.name.ends_with("moe/gate/selection_bias");
    const int64_t elements = buffer.shape.elements();
    if (dims.size() == 1) {
      entry.hf_cols = dims.front();
    } else if (buffer.name == "token_embedder/embedding" || buffer.name == "decoder/logits_dense/kernel") {
      entry.hf_rows = spec.dims.V_valid;  // the file holds the tokenizer's rows, not the padding
      entry.hf_cols = spec.dims.D;
    } else {
      // Kernels: [in..., out...]; the input part is the first axis except for the attention output ([H, d,
      // D]).
      const bool input_is_heads = buffer.name.ends_with("self_attention/out/kernel");
      const int64_t in = input_is_heads ? dims[0] * dims[1] : dims.front();
      entry.hf_rows = elements / in;  // out
      entry.hf_cols = in;
    }
    if (entry.transpose) entry.engine_out = elements / entry.hf_cols;
    if (mla) {
      const int64_t rope = c.qk_rope_head_dim, dq = c.qk_nope_head_dim + rope;
      if (buffer.name.ends_with("self_attention/wq_b/kernel") ||
          buffer.name.ends_with("self_attention/query/kernel")) {
        entry.engine_row = rotary_engine_rows(entry.hf_rows / dq, dq, rope);
      } else if (buffer.name.ends_with("self_attention/wkv_a/kernel")) {
        entry.engine_row = rotary_engine_rows(1, entry.hf_rows, rope);
      }
    }
    mapping.push_back(std::move(entry));
  }
  return mapping;
}

void load_hf_weights(const SafetensorsFile& file, const ModelSpec& spec,
                     const std::function<float*(BufferId)>& parameter_data) {
  const std::vector<HfTensorMapping> mapping = hf_mapping(spec);
  // A DeepSeek-V3 checkpoint's selection bias decides its routing: loading it into a model without one
  // would route differently, silently.
  std::set<std::string> mapped;
  for (const HfTensorMapping& entry : mapping) mapped.insert(entry.hf_name);
  for (const SafetensorsEntry& tensor : file.entries()) {
    if (tensor.name.ends_with(".mlp.gate.e_score_correction_bias") && !mapped.contains(tensor.name)) {
      fail(file.path() + ": " + tensor.name,
           "a model with routed_bias=true (a selection bias to load it into)",
           "routed_bias=false (or no mixture-of-experts layer " +
               tensor.name.substr(0, tensor.name.find(".mlp")) + ")",
           "set routed_bias=true (and num_experts, first_num_dense_layers as in the checkpoint's "
           "config.json)");
    }
  }
  for (const HfTensorMapping& entry : mapping) {
    const std::vector<int64_t> shape = file_shape(entry);
    float* destination = parameter_data(entry.parameter);
    if (!entry.transpose && entry.engine_row.empty() && entry.hf_total_cols == 0) {
      file.read_f32(entry.hf_name, shape, destination + entry.engine_offset);
      continue;
    }
    int64_t count = 1;
    for (int64_t size : shape) count *= size;
    std::vector<float> staged(static_cast<size_t>(count));
    file.read_f32(entry.hf_name, shape, staged.data());
    hf_block_to_engine(entry, staged.data(), destination, 0, spec.buffer(entry.parameter).shape.elements());
  }
}

}  // namespace meshtrain
