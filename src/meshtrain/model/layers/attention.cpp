#include "meshtrain/model/layers/attention.h"

#include "meshtrain/core/error.h"
#include "meshtrain/model/parallel/context_attention.h"
#include "meshtrain/model/parallel/linear.h"

namespace meshtrain {
namespace {

// The decode step in place of attention_forward: this token's keys and values (after QK-norm and RoPE) join
// the layer's caches [T, K, d] at its position, and its query attends over every row so far.
void add_attention_decode(SpecBuilder& builder, const std::string& attention, BufferId q, BufferId k,
                          BufferId v, BufferId attended) {
  const ModelDims& m = builder.dims();
  const Shape cache_shape = shape_of({{"cache", m.T}, {"kv_heads", m.K}, {"head_dim", m.d}});
  const BufferId key_cache = builder.cache(attention + "/key_cache", cache_shape);
  const BufferId value_cache = builder.cache(attention + "/value_cache", cache_shape);
  const BufferId scores = builder.scratch("scratch/decode_scores", shape_of({{"cache", m.T}}));
  const BufferId positions = builder.spec().positions;
  const int64_t T = m.T, H = m.H, K = m.K, d = m.d;
  builder.forward({attention + "/attention_decode",
                   {q, k, v, positions, key_cache, value_cache},
                   {attended, key_cache, value_cache, scores},
                   4.0 * static_cast<double>(T * H * d) / 2.0,  // a full cache's causal half, as training
                   [=](const OpContext& c) {
                     const int32_t position = c.i32(positions)[0];
                     MT_CHECK(position >= 0 && position < T, "decode position outside the cache");
                     c.kernels->attention_decode(c.f32(attended), c.f32(key_cache), c.f32(value_cache),
                                                 c.f32(scores), c.f32(q), c.f32(k), c.f32(v), position, H, K,
                                                 d);
                   },
                   OpKind::attention});
}

}  // namespace

BufferId add_attention_block(SpecBuilder& builder, const std::string& prefix, BufferId residual_in,
                             BufferId d_residual, const AttentionBlockOptions& options) {
  const ModelDims& m = builder.dims();
  const ModelSpec& spec = builder.spec();
  const Shape width_shape = token_shape(m, {{"embed", m.D}});
  const Shape q_shape = token_shape(m, {{"heads", m.H}, {"head_dim", m.d}});
  const Shape kv_shape = token_shape(m, {{"kv_heads", m.K}, {"head_dim", m.d}});
  const Shape lse_shape = shape_of({{"batch", m.B}, {"heads", m.H}, {"length", m.S}});

  // Backward temporaries, shared by every layer.
  const BufferId d_normed = builder.gradient_scratch("scratch/d_normed", width_shape);
  const BufferId d_attended = builder.gradient_scratch("scratch/d_attended", q_shape);
  const BufferId d_q_rotated = builder.gradient_scratch("scratch/d_q_rotated", q_shape);
  const BufferId d_k_rotated = builder.gradient_scratch("scratch/d_k_rotated", kv_shape);
  const BufferId d_v = builder.gradient_scratch("scratch/d_v", kv_shape);
  const BufferId d_q = options.qk_norm ? builder.gradient_scratch("scratch/d_q", q_shape) : d_q_rotated;
  const BufferId d_k = options.qk_norm ? builder.gradient_scratch("scratch/d_k", kv_shape) : d_k_rotated;
  const int64_t backward_scratch_floats = builder.kernels().attention_backward_scratch_floats(
      m.B, m.S, m.H, m.K, m.d, spec.options.attention.threads);
  const BufferId attention_scratch =
      builder.gradient_scratch("scratch/attention_backward", shape_of({{"floats", backward_scratch_floats}}));

  const NormLayer pre_norm =
      add_norm(builder, prefix + "/pre_self_attention_layer_norm", options.norm, residual_in, width_shape,
               m.N, m.D, d_normed, d_residual, options.adds_residual, NormReaders::matmuls_only);
  const LinearOptions projection{"attention", options.bias, 0.02, kNoBuffer};
  const auto kernel_shape = [&](const char* axis, int64_t heads) {
    return shape_of({{"embed", m.D}, {axis, heads}, {"head_dim", m.d}});
  };
  const std::string attention = prefix + "/self_attention";
  const LinearLayer query = add_linear(builder, attention + "/query", pre_norm.out,
                                       kernel_shape("heads", m.H), q_shape, projection, d_q, d_normed, false);
  const LinearLayer key = add_linear(builder, attention + "/key", pre_norm.out, kernel_shape("kv_heads", m.K),
                                     kv_shape, projection, d_k, d_normed, true);
  const LinearLayer value =
      add_linear(builder, attention + "/value", pre_norm.out, kernel_shape("kv_heads", m.K), kv_shape,
                 projection, d_v, d_normed, true);

  BufferId q_rotated = query.out, k_rotated = key.out;
  std::vector<OpDecl> qk_backward;  // in backward order
  if (options.qk_norm) {
    const NormLayer q_norm = add_norm(builder, attention + "/query_norm", NormKind::rms, query.out, q_shape,
                                      m.N * m.H, m.d, d_q_rotated, d_q, false);
    const NormLayer k_norm = add_norm(builder, attention + "/key_norm", NormKind::rms, key.out, kv_shape,
                                      m.N * m.K, m.d, d_k_rotated, d_k, false);
    mark_gradient_partial_over_heads(builder, attention + "/query_norm/scale");
    mark_gradient_partial_over_heads(builder, attention + "/key_norm/scale");
    q_rotated = q_norm.out;
    k_rotated = k_norm.out;
    qk_backward = {q_norm.backward, k_norm.backward};
  }
  const BufferId positions = spec.positions, segment_ids = spec.segment_ids;
  if (options.rope) {
    const float theta = static_cast<float>(spec.options.attention.rope_max_timescale);
    const int64_t N = m.N, H = m.H, K = m.K, d = m.d;
    // In place: the norm's backward needs its input and rstd, not its output.
    builder.forward(
        {attention + "/rope_forward",
         {q_rotated, k_rotated, positions},
         {q_rotated, k_rotated},
         6.0 * static_cast<double>(N * (H + K) * d),
         [=](const OpContext& c) {
           c.kernels->rope_forward(c.f32(q_rotated), c.f32(q_rotated), c.i32(positions), N, H, d, theta);
           c.kernels->rope_forward(c.f32(k_rotated), c.f32(k_rotated), c.i32(positions), N, K, d, theta);
         }});
    qk_backward.insert(
        qk_backward.begin(),
        {attention + "/rope_backward",
         {d_q_rotated, d_k_rotated, positions},
         {d_q_rotated, d_k_rotated},
         6.0 * static_cast<double>(N * (H + K) * d),
         [=](const OpContext& c) {
           c.kernels->rope_backward(c.f32(d_q_rotated), c.f32(d_q_rotated), c.i32(positions), N, H, d, theta);
           c.kernels->rope_backward(c.f32(d_k_rotated), c.f32(d_k_rotated), c.i32(positions), N, K, d, theta);
         }});
  }

  const BufferId attended = builder.activation(attention + "/attended", q_shape);
  const BufferId v = value.out;
  const int64_t B = m.B, S = m.S, H = m.H, K = m.K, d = m.d;
  const DType compute = spec.config.dtype;  // bfloat16: the backend's bf16 attention kernels
  // Context parallel: each rank's queries attend to keys of the whole sequence (the causal half on
  // average; under a reorder that balances it, on every rank).
  const int64_t context = context_ranks(builder);
  const double attention_flops = 4.0 * static_cast<double>(B * S * (S * context) * H * d) / 2.0;
  std::vector<OpDecl> attention_backward;  // in backward order
  if (builder.decoding()) {
    add_attention_decode(builder, attention, q_rotated, k_rotated, v, attended);
  } else if (context > 1) {
    const BufferId lse = builder.activation(attention + "/lse", lse_shape);
    attention_backward = add_context_attention(
        builder, attention,
        {q_rotated, k_rotated, v, attended, lse, d_attended, d_q_rotated, d_k_rotated, d_v}, attention_flops);
  } else {
    const BufferId lse = builder.activation(attention + "/lse", lse_shape);
    builder.forward({attention + "/attention_forward",
                     {q_rotated, k_rotated, v, positions, segment_ids},
                     {attended, lse},
                     attention_flops,
                     [=](const OpContext& c) {
                       kernels::attention_kernels(*c.kernels, compute)
                           .forward(c.f32(attended), c.f32(lse), c.f32(q_rotated), c.f32(k_rotated), c.f32(v),
                                    c.i32(positions), c.i32(segment_ids), B, S, H, K, d);
                     },
                     OpKind::attention});
    attention_backward.push_back(
        {attention + "/attention_backward",
         {d_attended, attended, lse, q_rotated, k_rotated, v, positions, segment_ids},
         {d_q_rotated, d_k_rotated, d_v, attention_scratch},
         2.5 * attention_flops,  // dq, dk, dv plus recomputing the scores
         [=](const OpContext& c) {
           kernels::attention_kernels(*c.kernels, compute)
               .backward(c.f32(d_q_rotated), c.f32(d_k_rotated), c.f32(d_v), c.f32(d_attended),
                         c.f32(attended), c.f32(lse), c.f32(q_rotated), c.f32(k_rotated), c.f32(v),
                         c.i32(positions), c.i32(segment_ids), B, S, H, K, d, c.f32(attention_scratch));
         },
         OpKind::attention});
  }

  const LinearLayer out = add_linear(
      builder, attention + "/out", attended, shape_of({{"heads", m.H}, {"head_dim", m.d}, {"embed", m.D}}),
      width_shape,
      {"attention", options.bias, options.out_init_std, options.adds_residual ? residual_in : kNoBuffer},
      d_residual, d_attended, false);

  std::vector<OpDecl> group = out.backward;
  for (OpDecl& op : attention_backward) group.push_back(std::move(op));
  for (OpDecl& op : qk_backward) group.push_back(std::move(op));
  append_ops(group, query.backward);
  append_ops(group, key.backward);
  append_ops(group, value.backward);
  // Column-parallel q, k, v.
  for (OpDecl& op : column_parallel_input_gradient(builder, attention + "/reduce_input_gradient", d_normed))
    group.push_back(std::move(op));
  group.push_back(pre_norm.backward);
  builder.backward_group(std::move(group));
  return out.out;
}

}  // namespace meshtrain
