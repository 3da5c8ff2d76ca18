// mHC hyper-connections (shared/specs/mhc.md) as spec ops, forward and backward side by side. The residual
// stream is G streams x [B, S, G, D]; every sublayer site (attention, dense MLP, MoE) wraps its sublayer F:
//   h      = RMSNorm(flatten(x)) @ [pre_alpha | post_alpha | res_alpha]     (over all G D values)
//   pre    = sigmoid(a_pre h_pre + pre_beta) + 1e-6;   post = 2 sigmoid(a_post h_post + post_beta)
//   M      = Sinkhorn(a_res h_res + res_beta)           (sinkhorn_iterations, doubly stochastic)
//   o      = F(sum_g pre_g x_g)                         (F applies its own pre-norm)
//   out_m  = sum_k M[k, m] x_k + post_m o
// Entry repeats the embedding into the G streams, exit sums them before the final norm.
// Legend: B batch, S sequence, N tokens, G residual streams, D width, C = 2G + G^2 coefficients per token.
#pragma once

#include <functional>
#include <string>

#include "meshtrain/model/spec_builder.h"

namespace meshtrain {

// A sublayer F on the site's input xin [B, S, D], declared with adds_residual = false: returns o [B, S, D];
// its backward group turns d_io (dL/d o) into dL/d xin in place.
using MhcSublayer = std::function<BufferId(BufferId xin, BufferId d_io)>;

// Returns the streams after the site [B, S, G, D]. The backward groups read d_streams (dL/d out) and leave
// dL/d streams_in in it.
BufferId add_mhc_site(SpecBuilder& builder, const std::string& prefix, BufferId streams_in,
                      BufferId d_streams, const MhcSublayer& sublayer);

// Entry: the embedding output [B, S, D] repeated into G streams (d_residual gets the streams' gradient sum).
BufferId add_mhc_entry(SpecBuilder& builder, BufferId residual, BufferId d_residual, BufferId d_streams);
// Exit: the streams' sum [B, S, D] (the final norm's input; d_streams gets d_residual in every stream).
BufferId add_mhc_exit(SpecBuilder& builder, BufferId streams, BufferId d_streams, BufferId d_residual);

}  // namespace meshtrain
