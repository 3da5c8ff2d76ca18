// Hugging Face Qwen3 tensor names <-> the engine's parameter names (shared/specs/layers-and-checkpoints.md).
// Hugging Face stores linear weights [out, in]; the engine stores kernels [in, out], so those transpose.
// The interchange issue extends this table into full import/export.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "meshtrain/io/safetensors.h"
#include "meshtrain/model/spec.h"

namespace meshtrain {

struct HfTensorMapping {
  std::string hf_name;     // "model.layers.0.self_attn.q_proj.weight"
  BufferId parameter;      // the engine's parameter value buffer
  bool transpose = false;  // [out, in] in the file, [in, out] in the engine
  int64_t hf_rows = 0;     // the file's shape: [hf_rows, hf_cols] (or [hf_cols] when hf_rows == 0)
  int64_t hf_cols = 0;
};

// The Hugging Face tensor name of an engine parameter ("decoder/layers_0/self_attention/wkv_a/kernel" ->
// "model.layers.0.self_attn.kv_a_proj_with_mqa.weight"), for the names the table maps (Qwen3's and
// DeepSeek's multi-head latent attention).
std::string hugging_face_name(const std::string& engine_name);

// Multi-head latent attention's rotary columns (the last qk_rope_head_dim outputs of each head of q_b_proj /
// q_proj, and of kv_a_proj_with_mqa). Hugging Face DeepSeek checkpoints (rope_interleave) keep rotary pair i
// in adjacent columns 2i, 2i + 1 and de-interleave before a rotate-half RoPE; the engine's RoPE kernel is
// rotate-half on pairs (i, i + rope_dim / 2), so importing permutes those columns instead: engine column j
// of a rotary part is the file's column order[j] ([0, 2, 4, ..., 1, 3, 5, ...]). Then the engine's q and k
// equal Hugging Face's after its de-interleave, so q . k (and the model) are the same. Chosen over an
// interleaved kernel variant: one permutation at import, no second RoPE kernel per backend.
std::vector<int64_t> hf_rope_column_order(int64_t rope_dim);

// One entry per engine parameter of a qwen3 spec.
std::vector<HfTensorMapping> qwen3_hf_mapping(const ModelSpec& spec);

// Loads Hugging Face weights into the parameters (`parameter_data` returns a parameter's float32 storage).
// Missing or mis-shaped tensors are errors naming the file and tensor; padding rows of the embedding
// (vocabulary padded to a multiple of 128) are left as they are.
void load_hf_qwen3(const SafetensorsFile& file, const ModelSpec& spec,
                   const std::function<float*(BufferId)>& parameter_data);

}  // namespace meshtrain
