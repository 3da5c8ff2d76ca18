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

// One entry per engine parameter of a qwen3 spec.
std::vector<HfTensorMapping> qwen3_hf_mapping(const ModelSpec& spec);

// Loads Hugging Face weights into the parameters (`parameter_data` returns a parameter's float32 storage).
// Missing or mis-shaped tensors are errors naming the file and tensor; padding rows of the embedding
// (vocabulary padded to a multiple of 128) are left as they are.
void load_hf_qwen3(const SafetensorsFile& file, const ModelSpec& spec,
                   const std::function<float*(BufferId)>& parameter_data);

}  // namespace meshtrain
