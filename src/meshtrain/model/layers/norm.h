// Pre-norm layers (RMSNorm for Qwen3, LayerNorm for GPT-2) as spec ops, forward and backward side by side.
// Legend: R rows normalised independently (tokens, or tokens x heads for QK-norm), W normalised width.
#pragma once

#include <string>

#include "meshtrain/model/spec_builder.h"

namespace meshtrain {

enum class NormKind { rms, layer };

struct NormLayer {
  BufferId out = kNoBuffer;  // [.., W] normalised and scaled
  OpDecl backward;           // dL/d out -> dL/d x (written or added, see add_norm) and weight gradients
};

// Who reads a norm's output: anything (float32 storage), or only dense matmuls (add_linear), which lets it
// be stored as SpecBuilder::matmul_input (bf16 under dtype=bfloat16 on the cpu, rounded as it is written).
enum class NormReaders { any, matmuls_only };

// out = norm(x) over rows of width `width`. The backward op reads `d_out` and writes `d_x`
// (adds into it when accumulate_dx: a pre-norm's input gradient joins the residual stream's). The backward
// reads x and the saved statistics, never out.
NormLayer add_norm(SpecBuilder& builder, const std::string& prefix, NormKind kind, BufferId x,
                   const Shape& out_shape, int64_t rows, int64_t width, BufferId d_out, BufferId d_x,
                   bool accumulate_dx, NormReaders readers = NormReaders::any);

// RMSNorm with a scale per residual stream (Engram's query, key and conv norms): x [N, G, D] as G rows of
// width D per token, stream g scaled by its own [D] row of the [G, D] scale. Same d_x semantics.
NormLayer add_stream_norm(SpecBuilder& builder, const std::string& prefix, BufferId x, const Shape& out_shape,
                          int64_t tokens, int64_t streams, int64_t width, BufferId d_out, BufferId d_x,
                          bool accumulate_dx);

}  // namespace meshtrain
