// Hugging Face tensor names <-> the engine's parameter names (shared/specs/layers-and-checkpoints.md), for
// every family: Qwen3 and Qwen3-MoE (decoder_block=qwen3, num_experts
// > 0), DeepSeek-V3 (decoder_block=deepseek: multi-head latent attention, dense and MoE feed-forward) and
// GPT-2. Hugging Face stores linear weights [out, in]; the engine stores kernels [in, out], so those
// transpose (GPT-2's Conv1D weights are already [in, out]). A mixture-of-experts layer's routed experts are
// one tensor per expert in the file (mlp.experts.{e}.gate_proj.weight [F_e, D], ...) and one stacked tensor
// in the engine (moe/routed_experts/wi_0 [E, D, F_e], ...): each file tensor maps onto slice e of the
// stacked one. GPT-2's fused attn.c_attn ([D, 3D] and its bias [3D]) is the engine's query, key and value
// side by side: three entries, each a block of the file tensor's columns.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "meshtrain/io/safetensors.h"
#include "meshtrain/model/spec.h"

namespace meshtrain {

// A block of one file tensor and where its elements live in an engine parameter.
struct HfTensorMapping {
  std::string hf_name;             // "model.layers.0.self_attn.q_proj.weight"
  BufferId parameter = kNoBuffer;  // the engine's parameter value buffer
  bool transpose = false;          // [out, in] in the file, [in, out] in the engine
  int64_t hf_rows = 0;             // the block: [hf_rows, hf_cols] (or [hf_cols] when hf_rows == 0)
  int64_t hf_cols = 0;
  // The block's first column in the file tensor and the file tensor's columns: a block of a fused tensor
  // (GPT-2's c_attn: query, key and value columns side by side); 0, 0: the block is the whole tensor.
  int64_t hf_col_begin = 0;
  int64_t hf_total_cols = 0;
  // Where the tensor starts in the parameter (elements): e * D * F_e for expert e's slice of a stacked
  // [E, D, F_e] / [E, F_e, D] parameter, else 0.
  int64_t engine_offset = 0;
  // A transposed tensor's engine row length (the engine's out axis; the unembedding's is the padded
  // vocabulary, so it can exceed hf_rows). Unused when not transposed.
  int64_t engine_out = 0;
  // The engine out index of each file row (multi-head latent attention's rotary columns, see
  // hf_rope_column_order); empty: the identity.
  std::vector<int64_t> engine_row;
  // False for DeepSeek-V3's selection bias (e_score_correction_bias): a buffer in Hugging Face, updated by
  // the balancing rule, never by a gradient.
  bool differentiable = true;
};

// The engine element (offset into the parameter's float storage) that holds the block's element [row, col]
// (row 0 for a 1-D tensor).
int64_t engine_element(const HfTensorMapping& entry, int64_t row, int64_t col);
// The file tensor's element (offset in its row-major storage) of the block's element [row, col].
int64_t file_element(const HfTensorMapping& entry, int64_t row, int64_t col);
// The file tensor's shape: [hf_rows, columns] or [columns].
std::vector<int64_t> file_shape(const HfTensorMapping& entry);
// Copies the block's elements between the file tensor's row-major storage and `engine`, which holds the
// parameter's elements [engine_begin, engine_begin + engine_span): into the engine, or out to the file.
void hf_block_to_engine(const HfTensorMapping& entry, const float* file, float* engine, int64_t engine_begin,
                        int64_t engine_span);
void hf_block_to_file(const HfTensorMapping& entry, const float* engine, int64_t engine_begin,
                      int64_t engine_span, float* file);

// The Hugging Face tensor name of an engine parameter ("decoder/layers_0/self_attention/wkv_a/kernel" ->
// "model.layers.0.self_attn.kv_a_proj_with_mqa.weight"), for the parameters that are one file tensor
// (not the stacked routed experts, which are E of them: see hf_mapping).
std::string hugging_face_name(const std::string& engine_name);

// Multi-head latent attention's rotary columns (the last qk_rope_head_dim outputs of each head of q_b_proj /
// q_proj, and of kv_a_proj_with_mqa). Hugging Face DeepSeek checkpoints (rope_interleave) keep rotary pair i
// in adjacent columns 2i, 2i + 1 and de-interleave before a rotate-half RoPE; the engine's RoPE kernel is
// rotate-half on pairs (i, i + rope_dim / 2), so importing permutes those columns instead: engine column j
// of a rotary part is the file's column order[j] ([0, 2, 4, ..., 1, 3, 5, ...]). Then the engine's q and k
// equal Hugging Face's after its de-interleave, so q . k (and the model) are the same. Chosen over an
// interleaved kernel variant: one permutation at import, no second RoPE kernel per backend.
std::vector<int64_t> hf_rope_column_order(int64_t rope_dim);

// One entry per file tensor of the spec's model (one per engine parameter, E per stacked routed-expert
// parameter), in the spec's parameter order, of a per-layer spec (scan_layers=false: Hugging Face names
// layers one by one).
std::vector<HfTensorMapping> hf_mapping(const ModelSpec& spec);

// Loads Hugging Face weights into the parameters (`parameter_data` returns a parameter's float32 storage).
// Missing or mis-shaped tensors are errors naming the file and tensor; padding rows of the embedding
// (vocabulary padded to a multiple of 128) are left as they are.
void load_hf_weights(const SafetensorsFile& file, const ModelSpec& spec,
                     const std::function<float*(BufferId)>& parameter_data);

}  // namespace meshtrain
