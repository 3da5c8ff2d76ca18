#include "meshtrain/model/parallel/expert_parallel.h"

#include "meshtrain/model/parallel/collective_ops.h"

namespace meshtrain {
namespace {

// Rows the local experts hold (local_offsets[E_local]), read for the host through the table's copy: the
// offsets may be device memory.
int64_t local_row_count(const OpContext& c, BufferId local_offsets, int64_t E_local) {
  int32_t rows = 0;
  c.kernels->memory_copy_out(&rows, c.i32(local_offsets) + E_local, sizeof(int32_t));
  return rows;
}

BufferId int32_activation(SpecBuilder& builder, const std::string& name, const Shape& shape) {
  return builder.as_int32(builder.activation(name, shape));
}

void add_all_to_all(SpecBuilder& builder, std::vector<OpDecl>* backward, const std::string& name,
                    BufferId send, BufferId receive) {
  for (OpDecl& op :
       collective_ops(builder, name, CollectiveKind::all_to_all, MeshAxis::expert, send, receive)) {
    if (backward) {
      backward->push_back(std::move(op));
    } else {
      builder.forward(std::move(op));
    }
  }
}

}  // namespace

int64_t expert_ranks(const SpecBuilder& builder) {
  return builder.spec().sharding.compute("experts").degree;
}

// Token side, then expert side: the blocks laid out and sent with their per-expert counts, and the received
// rows ordered expert-major into sorted_x [P B_c, D] (its first R_l rows).
ExpertDispatch add_expert_dispatch(SpecBuilder& builder, const std::string& moe, BufferId x, BufferId offsets,
                                   BufferId sorted, BufferId sorted_x, int64_t k, int64_t E, int64_t P,
                                   int64_t block_rows) {
  const int64_t D = builder.dims().D, M = builder.dims().N * k, E_local = E / P, rows = P * block_rows;
  ExpertDispatch d;
  d.ranks = P;
  d.block_rows = block_rows;
  d.local_experts = E_local;
  d.blocks = shape_of({{"dispatch_rows", rows}, {"embed", D}});
  const Shape block_index = shape_of({{"dispatch_rows", rows}});
  const Shape rank_counts = shape_of({{"expert_ranks", P}, {"local_experts", E_local}});
  const BufferId send_sorted = d.send_sorted =
      int32_activation(builder, moe + "/dispatch/send_sorted", block_index);
  const BufferId send_position = d.send_position =
      int32_activation(builder, moe + "/dispatch/send_position", shape_of({{"assignments", M}}));
  const BufferId send_counts = int32_activation(builder, moe + "/dispatch/send_counts", rank_counts);
  builder.forward({moe + "/dispatch/plan",
                   {offsets, sorted},
                   {send_sorted, send_position, send_counts},
                   0.0,
                   [=](const OpContext& c) {
                     c.kernels->moe_dispatch_plan(c.i32(send_sorted), c.i32(send_position),
                                                  c.i32(send_counts), c.i32(offsets), c.i32(sorted), M, E, P,
                                                  block_rows);
                   },
                   OpKind::memory});
  const BufferId received_counts = int32_activation(builder, moe + "/dispatch/received_counts", rank_counts);
  add_all_to_all(builder, nullptr, moe + "/dispatch/counts_all_to_all", send_counts, received_counts);
  const BufferId send_x = builder.activation(moe + "/dispatch/send_x", d.blocks);
  builder.forward({moe + "/dispatch/gather_forward",
                   {x, send_sorted},
                   {send_x},
                   0.0,
                   [=](const OpContext& c) {
                     c.kernels->moe_gather_forward(c.f32(send_x), c.f32(x), c.i32(send_sorted), rows, k, D);
                   },
                   OpKind::memory});
  const BufferId received_x = builder.activation(moe + "/dispatch/received_x", d.blocks);
  add_all_to_all(builder, nullptr, moe + "/dispatch/tokens_all_to_all", send_x, received_x);
  const BufferId local_offsets = d.local_offsets =
      int32_activation(builder, moe + "/dispatch/local_offsets", shape_of({{"expert_bounds", E_local + 1}}));
  const BufferId local_sorted = d.local_sorted =
      int32_activation(builder, moe + "/dispatch/local_sorted", block_index);
  const BufferId received_position = d.received_position =
      int32_activation(builder, moe + "/dispatch/received_position", block_index);
  builder.forward({moe + "/dispatch/receive_plan",
                   {received_counts},
                   {local_offsets, local_sorted, received_position},
                   0.0,
                   [=](const OpContext& c) {
                     c.kernels->moe_receive_plan(c.i32(local_offsets), c.i32(local_sorted),
                                                 c.i32(received_position), c.i32(received_counts), P, E_local,
                                                 block_rows);
                   },
                   OpKind::memory});
  builder.forward({moe + "/dispatch/local_gather_forward",
                   {received_x, local_sorted, local_offsets},
                   {sorted_x},
                   0.0,
                   [=](const OpContext& c) {
                     c.kernels->moe_gather_forward(c.f32(sorted_x), c.f32(received_x), c.i32(local_sorted),
                                                   local_row_count(c, local_offsets, E_local), 1, D);
                   },
                   OpKind::memory});
  return d;
}

// The experts' output rows [P B_c, D] back in each token rank's block layout: returns the rows the combine
// reads (with dispatch.send_position).
BufferId add_expert_return(SpecBuilder& builder, const std::string& moe, const ExpertDispatch& d,
                           BufferId expert_out) {
  const int64_t D = builder.dims().D, rows = d.ranks * d.block_rows;
  const BufferId received_position = d.received_position;
  const BufferId returned = builder.activation(moe + "/dispatch/returned_x", d.blocks);
  builder.forward({moe + "/dispatch/return_gather_forward",
                   {expert_out, received_position},
                   {returned},
                   0.0,
                   [=](const OpContext& c) {
                     c.kernels->moe_gather_forward(c.f32(returned), c.f32(expert_out),
                                                   c.i32(received_position), rows, 1, D);
                   },
                   OpKind::memory});
  const BufferId combined = builder.activation(moe + "/dispatch/combined_x", d.blocks);
  add_all_to_all(builder, nullptr, moe + "/dispatch/return_all_to_all", returned, combined);
  return combined;
}

// Backward of add_expert_return: the combine's block-layout gradient [P B_c, D] sent to the expert ranks and
// ordered as the experts' output rows (d_expert_out, its first R_l rows written).
std::vector<OpDecl> expert_return_backward(SpecBuilder& builder, const std::string& moe,
                                           const ExpertDispatch& d, BufferId d_combined,
                                           BufferId d_expert_out) {
  const int64_t D = builder.dims().D, E_local = d.local_experts;
  const BufferId local_sorted = d.local_sorted, local_offsets = d.local_offsets;
  const BufferId d_returned = builder.gradient_scratch("scratch/d_returned_blocks", d.blocks);
  std::vector<OpDecl> ops;
  add_all_to_all(builder, &ops, moe + "/dispatch/return_all_to_all_backward", d_combined, d_returned);
  ops.push_back({moe + "/dispatch/return_gather_backward",
                 {d_returned, local_sorted, local_offsets},
                 {d_expert_out},
                 0.0,
                 [=](const OpContext& c) {
                   c.kernels->moe_gather_forward(c.f32(d_expert_out), c.f32(d_returned), c.i32(local_sorted),
                                                 local_row_count(c, local_offsets, E_local), 1, D);
                 },
                 OpKind::memory});
  return ops;
}

// Backward of add_expert_dispatch: the experts' input gradient rows back in the senders' block layout, sent
// to the token ranks and summed into their tokens (d_x written).
std::vector<OpDecl> expert_dispatch_backward(SpecBuilder& builder, const std::string& moe,
                                             const ExpertDispatch& d, BufferId d_sorted_x, BufferId d_x,
                                             int64_t k) {
  const int64_t N = builder.dims().N, D = builder.dims().D, rows = d.ranks * d.block_rows;
  const BufferId received_position = d.received_position, send_position = d.send_position;
  const BufferId d_received = builder.gradient_scratch("scratch/d_received_blocks", d.blocks);
  const BufferId d_sent = builder.gradient_scratch("scratch/d_sent_blocks", d.blocks);
  std::vector<OpDecl> ops;
  ops.push_back({moe + "/dispatch/local_gather_backward",
                 {d_sorted_x, received_position},
                 {d_received},
                 0.0,
                 [=](const OpContext& c) {
                   c.kernels->moe_gather_forward(c.f32(d_received), c.f32(d_sorted_x),
                                                 c.i32(received_position), rows, 1, D);
                 },
                 OpKind::memory});
  add_all_to_all(builder, &ops, moe + "/dispatch/tokens_all_to_all_backward", d_received, d_sent);
  ops.push_back({moe + "/dispatch/gather_backward",
                 {d_sent, send_position},
                 {d_x},
                 static_cast<double>(N * k * D),
                 [=](const OpContext& c) {
                   c.kernels->moe_gather_backward(c.f32(d_x), c.f32(d_sent), c.i32(send_position), N, k, D,
                                                  false);
                 }});
  return ops;
}

std::vector<OpDecl> token_axes_all_reduce(const SpecBuilder& builder, const std::string& name,
                                          BufferId buffer) {
  std::vector<OpDecl> ops;
  for (MeshAxis axis : kTokenMeshAxes) {
    for (OpDecl& op :
         collective_ops(builder, name + "/" + mesh_axis_name(axis), CollectiveKind::all_reduce, axis, buffer))
      ops.push_back(std::move(op));
  }
  return ops;
}

}  // namespace meshtrain
