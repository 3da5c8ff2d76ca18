// The mixture-of-experts feed-forward block of a DeepSeek-style decoder layer:
//   residual_out = residual_in + shared(x) + sum over the token's chosen experts e of weight_e expert_e(x),
//   x = RMSNorm(residual_in),
// where every expert (routed or shared) is a SwiGLU MLP. The router (x @ W_gate, then moe_router: softmax or
// sigmoid scores, group-limited top-k, weights normalised and scaled) chooses k experts per token; the
// token-expert assignments are sorted by expert (moe_route_plan, dropless or capacity-limited), gathered
// into rows, run through the experts as grouped matmuls (one GEMM per expert segment: no per-token loop
// and no dense all-experts compute) and combined back with their weights. The shared experts are one dense
// SwiGLU of shared_experts x F_e width. An optional load-balance loss adds its gradient to the router's.
//
// Expert parallelism (mesh.expert = P > 1, logical axis `experts`): each rank holds E_l = E / P of the
// routed experts and routes its own tokens; its sorted rows travel to the experts' ranks in one block of B_c
// rows per rank (all_to_all over the expert axis, with the per-expert counts first), the experts run there on
// what every rank sent them, and the output rows travel back the same way for the combine. The backward
// passes the gradients along the same two all_to_alls in reverse.
// Legend: N tokens (B S), D width, E routed experts, k experts per token, F_e an expert's width, M = N k
// assignments (rows of the sorted buffers; R <= M of them are kept, R = offsets[E]), P expert ranks, E_l
// local experts, B_c rows per block.
#pragma once

#include <string>

#include "meshtrain/kernels/arguments.h"
#include "meshtrain/model/spec_builder.h"

namespace meshtrain {

// The config's MoE keys (ModelOptions::moe) and, per call, the family's init and residual.
struct MoeBlockOptions : MoeOptions {
  double out_init_std = 0.02;  // the experts' down projections
  // false: the block is an mHC site's sublayer F (model/layers/mhc.h): it returns F(norm(x)) without adding
  // x, and its backward turns d_residual into dL/dx in place (written, not added).
  bool adds_residual = true;
};

// Returns residual_out [B, S, D]; the backward group turns d_residual into dL/d residual_in in place.
BufferId add_moe_block(SpecBuilder& builder, const std::string& prefix, BufferId residual_in,
                       BufferId d_residual, const MoeBlockOptions& options);

// Assignments an expert keeps under capacity_factor (0: dropless, every assignment kept).
int64_t moe_expert_capacity(double capacity_factor, int64_t tokens, int64_t top_k, int64_t experts);
// Expert parallelism: the rows one rank sends another in each all_to_all (B_c), fixed so the bytes moved
// are the plan's: with a capacity, the receiving rank's E_l experts' capacity; dropless, the worst case
// (every token with min(k, E_l) of its experts there). `capacity` from moe_expert_capacity (0: dropless).
int64_t moe_dispatch_block_rows(int64_t capacity, int64_t tokens, int64_t top_k, int64_t local_experts);

}  // namespace meshtrain
