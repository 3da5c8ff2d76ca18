// Expert parallelism: the routed experts split over mesh.expert (logical axis `experts`), P ranks of E_l
// experts each. Assignments travel to their experts' rank and back in fixed blocks of B_c rows per rank pair
// (dispatch, then return for the combine), by all_to_all over expert; and the routing counts the balance loss
// needs are summed over every rank holding tokens. The MoE layer's expert collectives are declared here.
// Legend: N tokens, k experts per token, M assignments (N k), D width, E routed experts, P expert ranks,
// E_l experts per rank, B_c rows per block, R_l rows received.
#pragma once

#include <string>
#include <vector>

#include "meshtrain/model/spec_builder.h"

namespace meshtrain {

// P: the ranks the routed experts split over (1: every expert on every rank).
int64_t expert_ranks(const SpecBuilder& builder);

// Expert parallelism's buffers of one MoE layer (P expert ranks of E_l experts, blocks of B_c rows): the
// token side's block layout and the expert side's order of the rows it received.
struct ExpertDispatch {
  int64_t ranks = 1, block_rows = 0, local_experts = 0;  // P, B_c, E_l
  BufferId send_sorted = kNoBuffer;        // [P B_c] int32: each block row's assignment, -1 padding
  BufferId send_position = kNoBuffer;      // [M] int32: each assignment's block row, -1 when dropped
  BufferId local_offsets = kNoBuffer;      // [E_l + 1] int32: the local experts' row segments
  BufferId local_sorted = kNoBuffer;       // [P B_c] int32: each local row's received row, -1 past R_l
  BufferId received_position = kNoBuffer;  // [P B_c] int32: each received row's local row, -1 padding
  Shape blocks;                            // [P B_c, D]: what each all_to_all moves
};

// Token side, then expert side: the blocks laid out and sent with their per-expert counts, and the received
// rows ordered expert-major into sorted_x [P B_c, D] (its first R_l rows).
ExpertDispatch add_expert_dispatch(SpecBuilder& builder, const std::string& moe, BufferId x, BufferId offsets,
                                   BufferId sorted, BufferId sorted_x, int64_t k, int64_t E, int64_t P,
                                   int64_t block_rows);

// The experts' output rows [P B_c, D] back in each token rank's block layout: returns the rows the combine
// reads (with dispatch.send_position).
BufferId add_expert_return(SpecBuilder& builder, const std::string& moe, const ExpertDispatch& d,
                           BufferId expert_out);

// Backward of add_expert_return: the combine's block-layout gradient [P B_c, D] sent to the expert ranks and
// ordered as the experts' output rows (d_expert_out, its first R_l rows written).
std::vector<OpDecl> expert_return_backward(SpecBuilder& builder, const std::string& moe,
                                           const ExpertDispatch& d, BufferId d_combined,
                                           BufferId d_expert_out);

// Backward of add_expert_dispatch: the experts' input gradient rows back in the senders' block layout, sent
// to the token ranks and summed into their tokens (d_x written).
std::vector<OpDecl> expert_dispatch_backward(SpecBuilder& builder, const std::string& moe,
                                             const ExpertDispatch& d, BufferId d_sorted_x, BufferId d_x,
                                             int64_t k);

// A count every rank holds for its own tokens, summed over the ranks of every token axis (data, fsdp,
// context, expert) in that order: the whole micro-batch's count on every rank, whatever the mesh.
std::vector<OpDecl> token_axes_all_reduce(const SpecBuilder& builder, const std::string& name,
                                          BufferId buffer);

}  // namespace meshtrain
