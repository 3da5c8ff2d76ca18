// The MLP block of a pre-norm decoder layer: residual_out = residual_in + MLP(norm(residual_in)), where the
// MLP is SwiGLU (Qwen3: down(silu(gate(x)) * up(x))) or GELU (GPT-2: wo(gelu(wi(x) + bi)) + bo).
// Legend: B batch, S sequence, D width, F MLP width.
#pragma once

#include <string>

#include "meshtrain/model/layers/norm.h"

namespace meshtrain {

enum class MlpKind { swiglu, gelu };

struct MlpBlockOptions {
  NormKind norm = NormKind::rms;
  MlpKind kind = MlpKind::swiglu;
  bool bias = false;
  double out_init_std = 0.02;  // false: the block is an mHC site's sublayer F (model/layers/mhc.h): it
                               // returns F(norm(x)) without
  // adding x, and its backward turns d_residual into dL/dx in place (written, not added).
  bool adds_residual = true;
};

// activated = silu(gate_out) * up_out (the dense MLP's and the shared experts' gate), stored as
// SpecBuilder::matmul_input since the down projection is its only reader. The forward op goes to the
// builder; the backward op writes d_gate and d_up from d_activated (it reads gate_out and up_out, never
// activated). Ops `name`/swiglu_forward and `name`/swiglu_backward, the output `name`/activated.
struct GatedActivation {
  BufferId out = kNoBuffer;  // [B, S, F]
  OpDecl backward;
};
GatedActivation add_swiglu(SpecBuilder& builder, const std::string& name, BufferId gate_out, BufferId up_out,
                           const Shape& hidden_shape, BufferId d_activated, BufferId d_gate, BufferId d_up);

// Returns residual_out [B, S, D]; the backward group turns d_residual into dL/d residual_in in place.
BufferId add_mlp_block(SpecBuilder& builder, const std::string& prefix, BufferId residual_in,
                       BufferId d_residual, const MlpBlockOptions& options);

}  // namespace meshtrain
