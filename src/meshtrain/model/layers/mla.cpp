// Multi-head latent attention (mla.h): the ops in forward order, each backward op declared beside its
// forward, and the backward group in reverse order at the end.
#include "meshtrain/model/layers/mla.h"

#include "meshtrain/core/error.h"
#include "meshtrain/model/parallel/context_attention.h"
#include "meshtrain/model/parallel/linear.h"

namespace meshtrain {

BufferId add_mla_block(SpecBuilder& builder, const std::string& prefix, BufferId residual_in,
                       BufferId d_residual, const MlaBlockOptions& options) {
  const ModelDims& m = builder.dims();
  const ModelSpec& spec = builder.spec();
  const MlaOptions& widths = spec.options.mla;
  const int64_t B = m.B, S = m.S, N = m.N, D = m.D, H = m.H;
  const DType compute = spec.config.dtype;  // bfloat16: the backend's bf16 attention kernels
  const int64_t r_q = widths.q_lora_rank, r_kv = widths.kv_lora_rank;
  const int64_t nope = widths.qk_nope_head_dim, rope = widths.qk_rope_head_dim, v_dim = widths.v_head_dim;
  const int64_t dq = nope + rope, kv_b_width = nope + v_dim;
  MT_CHECK(m.d == dq && m.K == H, "model/spec.cpp sizes MLA's core as H heads of nope + rope");
  const float theta = static_cast<float>(spec.options.attention.rope_max_timescale);
  const std::string attention = prefix + "/self_attention";
  const BufferId positions = spec.positions, segment_ids = spec.segment_ids;

  const Shape width_shape = token_shape(m, {{"embed", D}});
  const Shape q_shape = token_shape(m, {{"heads", H}, {"head_dim", dq}});  // also k and padded v, o
  const Shape attended_shape = token_shape(m, {{"heads", H}, {"head_dim", v_dim}});
  const Shape q_a_shape = token_shape(m, {{"q_lora", r_q}});
  const Shape kv_a_shape = token_shape(m, {{"kv_lora", r_kv + rope}});
  const Shape c_kv_shape = token_shape(m, {{"kv_lora", r_kv}});
  const Shape k_rope_shape = token_shape(m, {{"head_dim", rope}});  // one head
  const Shape kv_b_shape = token_shape(m, {{"heads", H}, {"head_dim", kv_b_width}});
  const Shape q_rope_shape = token_shape(m, {{"heads", H}, {"head_dim", rope}});

  // Backward temporaries, shared by every layer.
  const BufferId d_normed = builder.gradient_scratch("scratch/mla_d_normed", width_shape);
  const BufferId d_q = builder.gradient_scratch("scratch/mla_d_q", q_shape);
  const BufferId d_k = builder.gradient_scratch("scratch/mla_d_k", q_shape);
  const BufferId d_v = builder.gradient_scratch("scratch/mla_d_v", q_shape);
  const BufferId d_o = builder.gradient_scratch("scratch/mla_d_o", q_shape);
  const BufferId d_attended = builder.gradient_scratch("scratch/mla_d_attended", attended_shape);
  const BufferId d_kv_a = builder.gradient_scratch("scratch/mla_d_kv_a", kv_a_shape);
  const BufferId d_c_kv = builder.gradient_scratch("scratch/mla_d_c_kv", c_kv_shape);
  const BufferId d_c_kv_normed = builder.gradient_scratch("scratch/mla_d_c_kv_normed", c_kv_shape);
  const BufferId d_k_rope = builder.gradient_scratch("scratch/mla_d_k_rope", k_rope_shape);
  const BufferId d_kv_b = builder.gradient_scratch("scratch/mla_d_kv_b", kv_b_shape);
  const BufferId d_q_rope = builder.gradient_scratch("scratch/mla_d_q_rope", q_rope_shape);
  const int64_t backward_scratch_floats =
      builder.kernels().attention_backward_scratch_floats(B, S, H, H, dq, spec.options.attention.threads);
  const BufferId attention_scratch = builder.gradient_scratch(
      "scratch/mla_attention_backward", shape_of({{"floats", backward_scratch_floats}}));
  const BufferId q_rope = builder.scratch("scratch/mla_q_rope", q_rope_shape);

  const NormLayer pre_norm =
      add_norm(builder, prefix + "/pre_self_attention_layer_norm", options.norm, residual_in, width_shape, N,
               D, d_normed, d_residual, options.adds_residual, NormReaders::matmuls_only);
  const LinearOptions projection{"attention", false, 0.02, kNoBuffer};

  // Queries, low-rank or direct. The q path's backward writes d_normed first; wkv_a's adds to it.
  // In backward order: the heads' projection, then (low rank) the rest of the q path.
  std::vector<OpDecl> query_heads_backward, query_rest_backward;
  BufferId q = kNoBuffer;
  BufferId query_reduced = d_normed;  // the heads' projection's input gradient (partial under tensor)
  if (r_q > 0) {
    const BufferId d_q_a = builder.gradient_scratch("scratch/mla_d_q_a", q_a_shape);
    const BufferId d_q_a_normed = builder.gradient_scratch("scratch/mla_d_q_a_normed", q_a_shape);
    const LinearLayer wq_a =
        add_linear(builder, attention + "/wq_a", pre_norm.out, shape_of({{"embed", D}, {"q_lora", r_q}}),
                   q_a_shape, projection, d_q_a, d_normed, false);
    const NormLayer q_norm = add_norm(builder, attention + "/q_norm", NormKind::rms, wq_a.out, q_a_shape, N,
                                      r_q, d_q_a_normed, d_q_a, false, NormReaders::matmuls_only);
    const LinearLayer wq_b = add_linear(builder, attention + "/wq_b", q_norm.out,
                                        shape_of({{"q_lora", r_q}, {"heads", H}, {"head_dim", dq}}), q_shape,
                                        projection, d_q, d_q_a_normed, false);
    q = wq_b.out;
    query_reduced = d_q_a_normed;
    query_heads_backward = wq_b.backward;
    query_rest_backward = {q_norm.backward};
    append_ops(query_rest_backward, wq_a.backward);
  } else {
    const LinearLayer query = add_linear(builder, attention + "/query", pre_norm.out,
                                         shape_of({{"embed", D}, {"heads", H}, {"head_dim", dq}}), q_shape,
                                         projection, d_q, d_normed, false);
    q = query.out;
    query_heads_backward = query.backward;
  }
  // RoPE on each head's last `rope` columns, in place (the projection's backward needs its input only).
  const double q_rope_flops = 6.0 * static_cast<double>(N * H * rope);
  builder.forward(
      {attention + "/q_rope_forward", {q, positions}, {q, q_rope}, q_rope_flops, [=](const OpContext& ctx) {
         float* rows = ctx.f32(q) + nope;
         float* part = ctx.f32(q_rope);
         ctx.kernels->column_slice_forward(part, rows, N * H, rope, 1, rope, dq);
         ctx.kernels->rope_forward(part, part, ctx.i32(positions), N, H, rope, theta);
         ctx.kernels->column_slice_forward(rows, part, N * H, rope, 1, dq, rope);
       }});
  const OpDecl q_rope_backward{attention + "/q_rope_backward",
                               {d_q, positions},
                               {d_q, d_q_rope},
                               q_rope_flops,
                               [=](const OpContext& ctx) {
                                 float* rows = ctx.f32(d_q) + nope;
                                 float* part = ctx.f32(d_q_rope);
                                 ctx.kernels->column_slice_forward(part, rows, N * H, rope, 1, rope, dq);
                                 ctx.kernels->rope_backward(part, part, ctx.i32(positions), N, H, rope,
                                                            theta);
                                 ctx.kernels->column_slice_forward(rows, part, N * H, rope, 1, dq, rope);
                               }};

  // Keys and values: the compressed c_kv and the shared rotary key from one down projection.
  const LinearLayer wkv_a = add_linear(builder, attention + "/wkv_a", pre_norm.out,
                                       shape_of({{"embed", D}, {"kv_lora", r_kv + rope}}), kv_a_shape,
                                       projection, d_kv_a, d_normed, true);
  const BufferId c_kv = builder.activation(attention + "/c_kv", c_kv_shape);
  const BufferId k_rope = builder.activation(attention + "/k_rope", k_rope_shape);
  const BufferId kv_a = wkv_a.out;
  builder.forward(
      {attention + "/split_kv_a",
       {kv_a, positions},
       {c_kv, k_rope},
       6.0 * static_cast<double>(N * rope),
       [=](const OpContext& ctx) {
         const float* rows = ctx.f32(kv_a);
         ctx.kernels->column_slice_forward(ctx.f32(c_kv), rows, N, r_kv, 1, r_kv, r_kv + rope);
         ctx.kernels->column_slice_forward(ctx.f32(k_rope), rows + r_kv, N, rope, 1, rope, r_kv + rope);
         ctx.kernels->rope_forward(ctx.f32(k_rope), ctx.f32(k_rope), ctx.i32(positions), N, 1, rope, theta);
       }});
  const OpDecl split_kv_a_backward{
      attention + "/split_kv_a_backward",
      {d_c_kv, d_k_rope, positions},
      {d_kv_a, d_k_rope},
      6.0 * static_cast<double>(N * rope),
      [=](const OpContext& ctx) {
        float* rows = ctx.f32(d_kv_a);
        ctx.kernels->rope_backward(ctx.f32(d_k_rope), ctx.f32(d_k_rope), ctx.i32(positions), N, 1, rope,
                                   theta);
        ctx.kernels->column_slice_forward(rows, ctx.f32(d_c_kv), N, r_kv, 1, r_kv + rope, r_kv);
        ctx.kernels->column_slice_forward(rows + r_kv, ctx.f32(d_k_rope), N, rope, 1, r_kv + rope, rope);
      }};
  const NormLayer kv_norm = add_norm(builder, attention + "/kv_norm", NormKind::rms, c_kv, c_kv_shape, N,
                                     r_kv, d_c_kv_normed, d_c_kv, false, NormReaders::matmuls_only);
  const LinearLayer wkv_b = add_linear(builder, attention + "/wkv_b", kv_norm.out,
                                       shape_of({{"kv_lora", r_kv}, {"heads", H}, {"head_dim", kv_b_width}}),
                                       kv_b_shape, projection, d_kv_b, d_c_kv_normed, false);
  // k = [k_nope | k_rope for every head], v = [v | zeros] at the core's width dq.
  const BufferId k = builder.activation(attention + "/key", q_shape);
  const BufferId v = builder.activation(attention + "/value_padded", q_shape);
  const BufferId kv_b = wkv_b.out;
  builder.forward({attention + "/assemble_kv",
                   {kv_b, k_rope},
                   {k, v},
                   0.0,
                   [=](const OpContext& ctx) {
                     const float* rows = ctx.f32(kv_b);
                     float* keys = ctx.f32(k);
                     float* values = ctx.f32(v);
                     ctx.kernels->column_slice_forward(keys, rows, N * H, nope, 1, dq, kv_b_width);
                     ctx.kernels->column_slice_forward(keys + nope, ctx.f32(k_rope), N, rope, H, dq, rope);
                     ctx.kernels->column_slice_forward(values, rows + nope, N * H, v_dim, 1, dq, kv_b_width);
                     if (dq > v_dim)
                       ctx.kernels->column_slice_forward(values + v_dim, nullptr, N * H, dq - v_dim, 1, dq,
                                                         0);
                   },
                   OpKind::memory});
  OpDecl assemble_kv_backward{
      attention + "/assemble_kv_backward",
      {d_k, d_v},
      {d_kv_b, d_k_rope},
      static_cast<double>(N * H * rope),
      [=](const OpContext& ctx) {
        float* rows = ctx.f32(d_kv_b);
        const float* keys = ctx.f32(d_k);
        ctx.kernels->column_slice_backward(rows, keys, N * H, nope, 1, kv_b_width, dq);
        ctx.kernels->column_slice_backward(rows + nope, ctx.f32(d_v), N * H, v_dim, 1, kv_b_width, dq);
        ctx.kernels->column_slice_backward(ctx.f32(d_k_rope), keys + nope, N, rope, H, rope, dq);
      },
      OpKind::memory};

  // The core at width dq (mla.h: v zero-padded), then the output's first v_dim columns.
  const BufferId o = builder.activation(attention + "/attended_padded", q_shape);
  // Context parallel: each rank's queries attend to keys of the whole sequence (as attention.cpp).
  const int64_t context = context_ranks(builder);
  const double attention_flops = 4.0 * static_cast<double>(B * S * (S * context) * H * dq) / 2.0;
  std::vector<OpDecl> core_backward;
  if (builder.decoding()) {
    const Shape cache_shape = shape_of({{"cache", m.T}, {"kv_heads", H}, {"head_dim", dq}});
    const BufferId key_cache = builder.cache(attention + "/key_cache", cache_shape);
    const BufferId value_cache = builder.cache(attention + "/value_cache", cache_shape);
    const BufferId scores = builder.scratch("scratch/decode_scores", shape_of({{"cache", m.T}}));
    const int64_t T = m.T;
    builder.forward({attention + "/attention_decode",
                     {q, k, v, positions, key_cache, value_cache},
                     {o, key_cache, value_cache, scores},
                     4.0 * static_cast<double>(T * H * dq) / 2.0,
                     [=](const OpContext& ctx) {
                       const int32_t position = ctx.i32(positions)[0];
                       MT_CHECK(position >= 0 && position < T, "decode position outside the cache");
                       ctx.kernels->attention_decode(ctx.f32(o), ctx.f32(key_cache), ctx.f32(value_cache),
                                                     ctx.f32(scores), ctx.f32(q), ctx.f32(k), ctx.f32(v),
                                                     position, H, H, dq);
                     },
                     OpKind::attention});
  } else if (context > 1) {
    // The same core as attention.cpp's under mesh.context (K = H kv heads of width dq): all_gather or ring.
    const BufferId lse =
        builder.activation(attention + "/lse", shape_of({{"batch", B}, {"heads", H}, {"length", S}}));
    core_backward =
        add_context_attention(builder, attention, {q, k, v, o, lse, d_o, d_q, d_k, d_v}, attention_flops);
  } else {
    const BufferId lse =
        builder.activation(attention + "/lse", shape_of({{"batch", B}, {"heads", H}, {"length", S}}));
    builder.forward({attention + "/attention_forward",
                     {q, k, v, positions, segment_ids},
                     {o, lse},
                     attention_flops,
                     [=](const OpContext& ctx) {
                       kernels::attention_kernels(*ctx.kernels, compute)
                           .forward(ctx.f32(o), ctx.f32(lse), ctx.f32(q), ctx.f32(k), ctx.f32(v),
                                    ctx.i32(positions), ctx.i32(segment_ids), B, S, H, H, dq);
                     },
                     OpKind::attention});
    core_backward.push_back({attention + "/attention_backward",
                             {d_o, o, lse, q, k, v, positions, segment_ids},
                             {d_q, d_k, d_v, attention_scratch},
                             2.5 * attention_flops,  // dq, dk, dv plus recomputing the scores
                             [=](const OpContext& ctx) {
                               kernels::attention_kernels(*ctx.kernels, compute)
                                   .backward(ctx.f32(d_q), ctx.f32(d_k), ctx.f32(d_v), ctx.f32(d_o),
                                             ctx.f32(o), ctx.f32(lse), ctx.f32(q), ctx.f32(k), ctx.f32(v),
                                             ctx.i32(positions), ctx.i32(segment_ids), B, S, H, H, dq,
                                             ctx.f32(attention_scratch));
                             },
                             OpKind::attention});
  }
  const BufferId attended = builder.activation(attention + "/attended", attended_shape);
  builder.forward({attention + "/unpad_attended",
                   {o},
                   {attended},
                   0.0,
                   [=](const OpContext& ctx) {
                     ctx.kernels->column_slice_forward(ctx.f32(attended), ctx.f32(o), N * H, v_dim, 1, v_dim,
                                                       dq);
                   },
                   OpKind::memory});
  // The padding columns of o are zero whatever the loss: their gradient is zero.
  const OpDecl unpad_backward{
      attention + "/unpad_attended_backward",
      {d_attended},
      {d_o},
      0.0,
      [=](const OpContext& ctx) {
        float* rows = ctx.f32(d_o);
        ctx.kernels->column_slice_forward(rows, ctx.f32(d_attended), N * H, v_dim, 1, dq, v_dim);
        if (dq > v_dim) ctx.kernels->column_slice_forward(rows + v_dim, nullptr, N * H, dq - v_dim, 1, dq, 0);
      },
      OpKind::memory};

  const LinearLayer out =
      add_linear(builder, attention + "/out", attended,
                 shape_of({{"heads", H}, {"head_dim", v_dim}, {"embed", D}}), width_shape,
                 {"attention", false, options.out_init_std, options.adds_residual ? residual_in : kNoBuffer},
                 d_residual, d_attended, false);

  // Tensor parallel: heads split over tensor (wq_b / query, wkv_b column-parallel, out row-parallel), the
  // down projections and their norms replicated. The gradients that leave the heads for a replicated tensor
  // are partial sums over this rank's heads: all-reduced right there, so everything below them is whole.
  const auto reduce_over_heads = [&](const std::string& name, BufferId partial) {
    return column_parallel_input_gradient(builder, attention + "/" + name, partial);
  };
  std::vector<OpDecl> group = out.backward;
  group.push_back(std::move(unpad_backward));
  const auto append = [&group](std::vector<OpDecl> ops) {
    for (OpDecl& op : ops) group.push_back(std::move(op));
  };
  append(std::move(core_backward));
  group.push_back(std::move(assemble_kv_backward));
  append(reduce_over_heads("reduce_k_rope_gradient", d_k_rope));
  append(wkv_b.backward);
  append(reduce_over_heads("reduce_c_kv_gradient", d_c_kv_normed));
  group.push_back(kv_norm.backward);
  group.push_back(split_kv_a_backward);
  group.push_back(q_rope_backward);
  // The q path: the heads' projection, the reduction of its input gradient, then (low rank) the rest.
  append(std::move(query_heads_backward));
  append(reduce_over_heads(r_q > 0 ? "reduce_q_a_gradient" : "reduce_input_gradient", query_reduced));
  append(std::move(query_rest_backward));
  append(wkv_a.backward);  // adds its (whole) part to the q path's d_normed
  group.push_back(pre_norm.backward);
  builder.backward_group(std::move(group));
  return out.out;
}

}  // namespace meshtrain
