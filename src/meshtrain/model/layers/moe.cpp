#include "meshtrain/model/layers/moe.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "meshtrain/core/error.h"
#include "meshtrain/model/layers/mlp.h"
#include "meshtrain/model/layers/norm.h"
#include "meshtrain/model/parallel/expert_parallel.h"
#include "meshtrain/model/parallel/linear.h"

namespace meshtrain {
namespace {

BufferId int32_activation(SpecBuilder& builder, const std::string& name, const Shape& shape) {
  return builder.as_int32(builder.activation(name, shape));
}

// `count` int32s of an arena buffer from element `first`, for the host (segment bounds, expert loads),
// through the backend's copy: a memcpy on the cpu; out of a device arena, after the kernels that wrote them.
std::vector<int32_t> host_int32s(const OpContext& c, BufferId id, int64_t first, int64_t count) {
  std::vector<int32_t> host(static_cast<size_t>(count));
  c.kernels->memory_copy_out(host.data(), c.i32(id) + first, host.size() * sizeof(int32_t));
  return host;
}

// The shared experts: a dense SwiGLU of x [N, D] at width F_s (shared_experts x F_e) whose down projection
// ends on the residual stream (out = residual_in + down(silu(gate(x)) * up(x))). Forward ops go to the
// builder; returns the output and the backward ops (they add into d_x).
struct SharedExperts {
  BufferId out = kNoBuffer;
  std::vector<OpDecl> backward;
};
SharedExperts add_shared_experts(SpecBuilder& builder, const std::string& name, BufferId x,
                                 BufferId residual_in, BufferId d_out, BufferId d_x, int64_t width,
                                 double out_init_std) {
  const ModelDims& m = builder.dims();
  const Shape hidden_shape = token_shape(m, {{"moe_mlp", width}});
  const Shape width_shape = token_shape(m, {{"embed", m.D}});
  const Shape in_kernel = shape_of({{"embed", m.D}, {"moe_mlp", width}});
  const Shape out_kernel = shape_of({{"moe_mlp", width}, {"embed", m.D}});
  const BufferId d_gate = builder.gradient_scratch("scratch/d_shared_gate", hidden_shape);
  const BufferId d_up = builder.gradient_scratch("scratch/d_shared_up", hidden_shape);
  const BufferId d_activated = builder.gradient_scratch("scratch/d_shared_activated", hidden_shape);
  const LinearOptions in_projection{"moe", false, 0.02, kNoBuffer};
  const LinearLayer gate =
      add_linear(builder, name + "/wi_0", x, in_kernel, hidden_shape, in_projection, d_gate, d_x, true);
  const LinearLayer up =
      add_linear(builder, name + "/wi_1", x, in_kernel, hidden_shape, in_projection, d_up, d_x, true);
  GatedActivation swiglu =
      add_swiglu(builder, name, gate.out, up.out, hidden_shape, d_activated, d_gate, d_up);
  const LinearLayer down = add_linear(builder, name + "/wo", swiglu.out, out_kernel, width_shape,
                                      {"moe", false, out_init_std, residual_in}, d_out, d_activated, false);
  SharedExperts shared{down.out, down.backward};
  shared.backward.push_back(std::move(swiglu.backward));
  append_ops(shared.backward, gate.backward);
  append_ops(shared.backward, up.backward);
  return shared;
}

}  // namespace

int64_t moe_expert_capacity(double capacity_factor, int64_t tokens, int64_t top_k, int64_t experts) {
  if (capacity_factor <= 0.0) return 0;
  return static_cast<int64_t>(
      std::ceil(capacity_factor * static_cast<double>(tokens * top_k) / static_cast<double>(experts)));
}

int64_t moe_dispatch_block_rows(int64_t capacity, int64_t tokens, int64_t top_k, int64_t local_experts) {
  // A token's k experts are distinct, so at most min(k, E_l) of its assignments go to one rank.
  const int64_t worst = tokens * std::min(top_k, local_experts);
  return capacity > 0 ? std::min(worst, local_experts * capacity) : worst;
}

BufferId add_moe_block(SpecBuilder& builder, const std::string& prefix, BufferId residual_in,
                       BufferId d_residual, const MoeBlockOptions& options) {
  const ModelDims& m = builder.dims();
  const int64_t N = m.N, D = m.D, E = options.experts, k = options.routing.top_k, F = options.expert_width;
  const int64_t M = N * k;
  const int64_t capacity = moe_expert_capacity(options.capacity_factor, N, k, E);
  // Expert parallelism: the stacked routed experts split over the mesh axes of logical axis `experts`
  // (mesh.expert), P ranks of E_l experts each; the assignments travel there and back in fixed blocks.
  const int64_t P = expert_ranks(builder);
  const int64_t E_local = E / P;
  const int64_t block_rows = P > 1 ? moe_dispatch_block_rows(capacity, N, k, E_local) : 0;  // B_c
  const int64_t expert_rows = P > 1 ? P * block_rows : M;  // rows the grouped matmuls may get
  const kernels::MoeRouting routing = options.routing;
  const Shape width_shape = token_shape(m, {{"embed", m.D}});
  const Shape logits_shape = token_shape(m, {{"expert_scores", E}});
  const Shape choice_shape = token_shape(m, {{"top_k", k}});
  const Shape rows_width = shape_of({{"expert_rows", expert_rows}, {"embed", D}});
  const Shape rows_hidden = shape_of({{"expert_rows", expert_rows}, {"moe_mlp", F}});
  const Shape blocks_width = shape_of({{"dispatch_rows", P * block_rows}, {"embed", D}});
  const std::string moe = prefix + "/moe";
  const BufferId residual = options.adds_residual ? residual_in : kNoBuffer;

  // Backward temporaries, shared by every MoE layer.
  const BufferId d_normed = builder.gradient_scratch("scratch/d_normed", width_shape);
  const BufferId d_logits = builder.gradient_scratch("scratch/d_router_logits", logits_shape);
  const BufferId d_weights = builder.gradient_scratch("scratch/d_router_weights", choice_shape);
  const BufferId d_expert_out = builder.gradient_scratch("scratch/d_expert_out", rows_width);
  const BufferId d_expert_activated = builder.gradient_scratch("scratch/d_expert_activated", rows_hidden);
  const BufferId d_expert_gate = builder.gradient_scratch("scratch/d_expert_gate", rows_hidden);
  const BufferId d_expert_up = builder.gradient_scratch("scratch/d_expert_up", rows_hidden);
  const BufferId d_sorted_x = builder.gradient_scratch("scratch/d_sorted_x", rows_width);
  const BufferId d_sorted_x_up = builder.gradient_scratch("scratch/d_sorted_x_up", rows_width);

  const NormLayer pre_norm =
      add_norm(builder, prefix + "/post_self_attention_layer_norm", NormKind::rms, residual_in, width_shape,
               N, D, d_normed, d_residual, options.adds_residual);
  const BufferId x = pre_norm.out;

  // Router: logits = x @ W_gate, then scores, the chosen experts and their weights.
  const LinearLayer gate =
      add_linear(builder, moe + "/gate", x, shape_of({{"embed", D}, {"expert_scores", E}}), logits_shape,
                 {"moe", false, 0.02, kNoBuffer, ParameterRole::router}, d_logits, d_normed, true);
  const BufferId logits = gate.out;
  const BufferId chosen = int32_activation(builder, moe + "/chosen", choice_shape);
  const BufferId weights = builder.activation(moe + "/weights", choice_shape);
  const BufferId scores = builder.activation(moe + "/scores", logits_shape);
  // The selection bias orders the experts only (never the weights) and no gradient reaches it: see
  // ModelSpec::moe_selection_biases.
  const BufferId bias =
      options.selection_bias
          ? builder.parameter(moe + "/gate/selection_bias", shape_of({{"expert_scores", E}}),
                              {"moe", ParameterInit::zeros, 0.0, ParameterRole::bias})
          : kNoBuffer;
  builder.spec().moe_selection_biases.push_back(bias);
  std::vector<BufferId> router_inputs = {logits};
  if (bias != kNoBuffer) router_inputs.push_back(bias);
  builder.forward({moe + "/router_forward",
                   router_inputs,
                   {chosen, weights, scores},
                   static_cast<double>(N * E) * 8.0,
                   [=](const OpContext& c) {
                     c.kernels->moe_router_forward(c.i32(chosen), c.f32(weights), c.f32(scores),
                                                   c.f32(logits), bias == kNoBuffer ? nullptr : c.f32(bias),
                                                   N, E, routing);
                   }});

  // The assignments sorted by expert, and the tokens gathered into those rows.
  const BufferId counts = int32_activation(builder, moe + "/counts", shape_of({{"expert_scores", E}}));
  const BufferId offsets = int32_activation(builder, moe + "/offsets", shape_of({{"expert_bounds", E + 1}}));
  const BufferId sorted = int32_activation(builder, moe + "/sorted", shape_of({{"assignments", M}}));
  const BufferId position = int32_activation(builder, moe + "/position", shape_of({{"assignments", M}}));
  const BufferId assigned = int32_activation(builder, moe + "/assigned", shape_of({{"expert_scores", E}}));
  const size_t layer_index = builder.spec().moe_layers.size();
  builder.spec().moe_layers.push_back(prefix);
  builder.spec().moe_experts = E;
  builder.forward({moe + "/route_plan",
                   {chosen},
                   {counts, offsets, sorted, position, assigned},
                   0.0,
                   [=](const OpContext& c) {
                     const int64_t dropped = c.kernels->moe_route_plan(
                         c.i32(counts), c.i32(offsets), c.i32(sorted), c.i32(position), c.i32(assigned),
                         c.i32(chosen), N, k, E, capacity);
                     if (c.recomputing) return;
                     RoutingSums& sums = c.loss_sums->routing;
                     sums.dropped[layer_index] += static_cast<double>(dropped);
                     const std::vector<int32_t> loads = host_int32s(c, assigned, 0, E);
                     for (int64_t e = 0; e < E; ++e)
                       sums.expert_load[layer_index * static_cast<size_t>(E) + static_cast<size_t>(e)] +=
                           loads[static_cast<size_t>(e)];
                   },
                   OpKind::memory});
  // The balance loss's f_e counts the assignments of the whole micro-batch (every rank's tokens: the
  // per-expert counts all-reduced over data, fsdp, expert and context), so any mesh gives the same loss; its
  // P_e is this rank's tokens' scores, and the per-token terms add up over ranks.
  const float balance_weight = static_cast<float>(options.balance_loss_weight);
  const kernels::RouterScore score_function = routing.score_function;
  BufferId batch_assigned = kNoBuffer;
  if (balance_weight > 0.0f) {
    batch_assigned = int32_activation(builder, moe + "/batch_assigned", shape_of({{"expert_scores", E}}));
    builder.forward({moe + "/batch_assigned",
                     {assigned},
                     {batch_assigned},
                     0.0,
                     [=](const OpContext& c) {
                       const std::vector<int32_t> loads = host_int32s(c, assigned, 0, E);
                       c.kernels->memory_copy_in(c.i32(batch_assigned), loads.data(),
                                                 loads.size() * sizeof(int32_t));
                     },
                     OpKind::memory});
    for (OpDecl& op : token_axes_all_reduce(builder, moe + "/batch_assigned", batch_assigned))
      builder.forward(std::move(op));
    builder.forward({moe + "/balance_loss_forward",
                     {scores, batch_assigned},
                     {},
                     static_cast<double>(N * E) * 2.0,
                     [=](const OpContext& c) {
                       if (c.recomputing) return;
                       // The kernel's loss is a mean over this rank's N tokens: N times it is their sum.
                       c.loss_sums->routing.balance_loss[layer_index] +=
                           static_cast<double>(N) *
                           c.kernels->moe_balance_loss_forward(c.f32(scores), c.i32(batch_assigned), N, E,
                                                               score_function, balance_weight);
                     },
                     OpKind::loss});
  }
  // The rows the routed experts take, sorted by (local) expert, and their segment bounds: one rank gathers
  // its tokens into them; under expert parallelism each token rank lays its sorted rows out in one block
  // per expert rank (moe_dispatch_plan), the blocks and their per-expert counts go over the expert axis
  // (all_to_all), and each expert rank orders what it received expert-major (moe_receive_plan).
  const BufferId sorted_x = builder.activation(moe + "/sorted_x", rows_width);
  BufferId expert_offsets = offsets;  // [E_l + 1]
  ExpertDispatch dispatch;
  if (P == 1) {
    builder.forward({moe + "/gather_forward",
                     {x, sorted, offsets},
                     {sorted_x},
                     0.0,
                     [=](const OpContext& c) {
                       c.kernels->moe_gather_forward(c.f32(sorted_x), c.f32(x), c.i32(sorted),
                                                     host_int32s(c, offsets, E, 1)[0], k, D);
                     },
                     OpKind::memory});
  } else {
    dispatch = add_expert_dispatch(builder, moe, x, offsets, sorted, sorted_x, k, E, P, block_rows);
    expert_offsets = dispatch.local_offsets;
  }
  const auto kept_rows = [=](const OpContext& c) -> int64_t {  // R
    return host_int32s(c, expert_offsets, E_local, 1)[0];
  };

  // The routed experts: SwiGLU over each expert's rows, as grouped matmuls.
  const auto expert_weights = [&](const char* name, const Shape& shape, double init_std) {
    return builder.parameter(moe + "/routed_experts/" + name, shape,
                             {"moe", ParameterInit::normal, init_std, ParameterRole::matrix});
  };
  const BufferId w_gate =
      expert_weights("wi_0", shape_of({{"experts", E_local}, {"embed", D}, {"moe_mlp", F}}), 0.02);
  const BufferId w_up =
      expert_weights("wi_1", shape_of({{"experts", E_local}, {"embed", D}, {"moe_mlp", F}}), 0.02);
  const BufferId w_down = expert_weights("wo", shape_of({{"experts", E_local}, {"moe_mlp", F}, {"embed", D}}),
                                         options.out_init_std);
  const BufferId d_w_gate = builder.gradient_of(w_gate), d_w_up = builder.gradient_of(w_up),
                 d_w_down = builder.gradient_of(w_down);
  const BufferId expert_gate = builder.activation(moe + "/expert_gate", rows_hidden);
  const BufferId expert_up = builder.activation(moe + "/expert_up", rows_hidden);
  const BufferId expert_activated = builder.activation(moe + "/expert_activated", rows_hidden);
  const BufferId expert_out = builder.activation(moe + "/expert_out", rows_width);
  // Dropless and balanced, every rank's experts take M rows.
  const double expert_flops = 2.0 * static_cast<double>(M * D * F);
  OpDecl expert_in{moe + "/expert_in_forward",
                   {sorted_x, w_gate, w_up, expert_offsets},
                   {expert_gate, expert_up},
                   2.0 * expert_flops,
                   [=](const OpContext& c) {
                     c.kernels->grouped_matmul_forward(c.f32(expert_gate), c.f32(sorted_x), c.f32(w_gate),
                                                       c.i32(expert_offsets), E_local, D, F);
                     c.kernels->grouped_matmul_forward(c.f32(expert_up), c.f32(sorted_x), c.f32(w_up),
                                                       c.i32(expert_offsets), E_local, D, F);
                   },
                   OpKind::matmul};
  builder.forward(std::move(expert_in));
  builder.forward({moe + "/expert_swiglu_forward",
                   {expert_gate, expert_up, expert_offsets},
                   {expert_activated},
                   4.0 * static_cast<double>(M * F),
                   [=](const OpContext& c) {
                     c.kernels->swiglu_forward(c.f32(expert_activated), c.f32(expert_gate), c.f32(expert_up),
                                               kept_rows(c) * F);
                   }});
  builder.forward({moe + "/expert_out_forward",
                   {expert_activated, w_down, expert_offsets},
                   {expert_out},
                   expert_flops,
                   [=](const OpContext& c) {
                     c.kernels->grouped_matmul_forward(c.f32(expert_out), c.f32(expert_activated),
                                                       c.f32(w_down), c.i32(expert_offsets), E_local, F, D);
                   },
                   OpKind::matmul});
  // The rows the combine reads, and each assignment's row among them: the experts' output on one rank;
  // under expert parallelism the blocks sent back (each token rank's own block layout).
  BufferId combined_rows = expert_out, combined_position = position;
  if (P > 1) {
    combined_rows = add_expert_return(builder, moe, dispatch, expert_out);
    combined_position = dispatch.send_position;
  }

  // The shared experts end on the residual stream; the routed experts' weighted sum joins them.
  SharedExperts shared;
  if (options.shared_experts > 0) {
    shared = add_shared_experts(builder, moe + "/shared_experts", x, residual, d_residual, d_normed,
                                options.shared_experts * F, options.out_init_std);
  }
  // What the routed sum adds to: the shared experts' output (which holds the residual), else the residual
  // (an mHC sublayer without shared experts: nothing).
  const BufferId base = shared.out != kNoBuffer ? shared.out : residual;
  const BufferId out = builder.activation(moe + "/out", width_shape);
  std::vector<BufferId> combine_reads = {combined_rows, weights, combined_position};
  if (base != kNoBuffer) combine_reads.push_back(base);
  builder.forward({moe + "/combine_forward",
                   combine_reads,
                   {out},
                   2.0 * static_cast<double>(M * D),
                   [=](const OpContext& c) {
                     c.kernels->moe_combine_forward(c.f32(out), c.f32(combined_rows), c.f32(weights),
                                                    c.i32(combined_position), N, k, D, false);
                     if (base != kNoBuffer) c.kernels->residual_add(c.f32(out), c.f32(base), N * D);
                   }});

  // Backward, in order: combine, the experts, gather (writes d_normed), router (+ balance loss), the gate
  // and the shared experts (add into d_normed), the norm.
  std::vector<OpDecl> group;
  // Under expert parallelism the combine's gradient rows are the blocks' layout (padding rows stay zero),
  // sent back to the expert ranks and ordered as the experts' rows there.
  const BufferId d_combined =
      P > 1 ? builder.gradient_scratch("scratch/d_combined_blocks", blocks_width) : d_expert_out;
  group.push_back({moe + "/combine_backward",
                   {d_residual, combined_rows, weights, combined_position},
                   {d_combined, d_weights},
                   4.0 * static_cast<double>(M * D),
                   [=](const OpContext& c) {
                     if (P > 1) {  // through the table: the blocks may be device memory
                       c.kernels->memory_fill(c.f32(d_combined), 0,
                                              static_cast<size_t>(P * block_rows * D) * sizeof(float));
                     }
                     c.kernels->moe_combine_backward(c.f32(d_combined), c.f32(d_weights), c.f32(d_residual),
                                                     c.f32(combined_rows), c.f32(weights),
                                                     c.i32(combined_position), N, k, D);
                   }});
  if (P > 1) {
    for (OpDecl& op : expert_return_backward(builder, moe, dispatch, d_combined, d_expert_out))
      group.push_back(std::move(op));
  }
  OpDecl expert_out_backward{moe + "/expert_out_backward",
                             {d_expert_out, expert_activated, w_down, expert_offsets, d_w_down},
                             {d_expert_activated, d_w_down},
                             2.0 * expert_flops,
                             [=](const OpContext& c) {
                               c.kernels->grouped_matmul_backward(c.f32(d_expert_activated), c.f32(d_w_down),
                                                                  c.f32(d_expert_out),
                                                                  c.f32(expert_activated), c.f32(w_down),
                                                                  c.i32(expert_offsets), E_local, F, D);
                             },
                             OpKind::matmul};
  group.push_back(std::move(expert_out_backward));
  group.push_back({moe + "/expert_swiglu_backward",
                   {d_expert_activated, expert_gate, expert_up, expert_offsets},
                   {d_expert_gate, d_expert_up},
                   8.0 * static_cast<double>(M * F),
                   [=](const OpContext& c) {
                     c.kernels->swiglu_backward(c.f32(d_expert_gate), c.f32(d_expert_up),
                                                c.f32(d_expert_activated), c.f32(expert_gate),
                                                c.f32(expert_up), kept_rows(c) * F);
                   }});
  OpDecl expert_in_backward{
      moe + "/expert_in_backward",
      {d_expert_gate, d_expert_up, sorted_x, w_gate, w_up, expert_offsets, d_w_gate, d_w_up},
      {d_sorted_x, d_sorted_x_up, d_w_gate, d_w_up},
      4.0 * expert_flops,
      [=](const OpContext& c) {
        c.kernels->grouped_matmul_backward(c.f32(d_sorted_x), c.f32(d_w_gate), c.f32(d_expert_gate),
                                           c.f32(sorted_x), c.f32(w_gate), c.i32(expert_offsets), E_local, D,
                                           F);
        c.kernels->grouped_matmul_backward(c.f32(d_sorted_x_up), c.f32(d_w_up), c.f32(d_expert_up),
                                           c.f32(sorted_x), c.f32(w_up), c.i32(expert_offsets), E_local, D,
                                           F);
        c.kernels->residual_add(c.f32(d_sorted_x), c.f32(d_sorted_x_up), kept_rows(c) * D);
      },
      OpKind::matmul};
  group.push_back(std::move(expert_in_backward));
  if (P == 1) {
    group.push_back({moe + "/gather_backward",
                     {d_sorted_x, position},
                     {d_normed},
                     static_cast<double>(M * D),
                     [=](const OpContext& c) {
                       c.kernels->moe_gather_backward(c.f32(d_normed), c.f32(d_sorted_x), c.i32(position), N,
                                                      k, D, false);
                     }});
  } else {
    for (OpDecl& op : expert_dispatch_backward(builder, moe, dispatch, d_sorted_x, d_normed, k))
      group.push_back(std::move(op));
  }
  // The balance loss's gradient enters as N times the kernel's (a mean over this rank's N tokens), because
  // gradients hold sums over tokens until the update divides by the global valid-token count, as the
  // cross-entropy's do.
  std::vector<BufferId> router_reads = {d_weights, scores, chosen};
  if (balance_weight > 0.0f) router_reads.push_back(batch_assigned);
  group.push_back({moe + "/router_backward",
                   router_reads,
                   {d_logits},
                   static_cast<double>(N * E) * 8.0,
                   [=](const OpContext& c) {
                     c.kernels->moe_router_backward(c.f32(d_logits), c.f32(d_weights), c.f32(scores),
                                                    c.i32(chosen), N, E, routing);
                     if (balance_weight > 0.0f) {
                       c.kernels->moe_balance_loss_backward(c.f32(d_logits), c.f32(scores),
                                                            c.i32(batch_assigned), N, E, score_function,
                                                            balance_weight, static_cast<float>(N));
                     }
                   }});
  append_ops(group, gate.backward);
  for (OpDecl& op : shared.backward) group.push_back(std::move(op));
  group.push_back(pre_norm.backward);
  builder.backward_group(std::move(group));
  return out;
}

}  // namespace meshtrain
