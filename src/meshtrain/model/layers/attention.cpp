#include "meshtrain/model/layers/attention.h"

#include <omp.h>

#include <cstring>

#include "meshtrain/core/error.h"
#include "meshtrain/model/layers/linear.h"

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

// Context parallelism (mesh.context = C > 1), all_gather strategy. Legend: B batch, L tokens per context
// rank (the spec's S), C context ranks, X the elements of one token (K d for keys / values, 1 for positions
// and segment ids). A collective over context moves rank-major blocks ([C, B, L, X], rank r's [B, L, X]
// at block r); the attention kernels want every row whole ([B, C L, X]). These two ops convert.
//   batch_major[b, r L + i, x] = rank_major[r, b, i, x]
void permute_rank_major(const TensorView& from, const TensorView& to, int64_t C, int64_t B,
                        bool to_batch_major) {
  const size_t block = from.bytes() / static_cast<size_t>(C * B);  // one rank's share of one row: L X
  const auto* source = static_cast<const uint8_t*>(from.data);
  auto* destination = static_cast<uint8_t*>(to.data);
  for (int64_t r = 0; r < C; ++r) {
    for (int64_t b = 0; b < B; ++b) {
      const size_t rank_major = static_cast<size_t>(r * B + b) * block;
      const size_t batch_major = static_cast<size_t>(b * C + r) * block;
      std::memcpy(destination + (to_batch_major ? batch_major : rank_major),
                  source + (to_batch_major ? rank_major : batch_major), block);
    }
  }
}

// The ops that gather `local` [B, L, X] over context into `whole` [B, C L, X] through `by_rank` [C B L X].
std::vector<OpDecl> context_gather_ops(const SpecBuilder& builder, const std::string& name, BufferId local,
                                       BufferId by_rank, BufferId whole, int64_t C, int64_t B) {
  std::vector<OpDecl> ops =
      builder.collective(name, CollectiveKind::all_gather, MeshAxis::context, by_rank, local);
  ops.push_back({name + "_to_rows",
                 {by_rank},
                 {whole},
                 0.0,
                 [=](const OpContext& c) { permute_rank_major(c.view(by_rank), c.view(whole), C, B, true); },
                 OpKind::memory});
  return ops;
}

// The ops that sum `whole` [B, C L, X] (every rank's share of the gradient of the whole rows) over context
// and leave this rank's tokens in `local` [B, L, X], through `by_rank` [C B L X].
std::vector<OpDecl> context_reduce_scatter_ops(const SpecBuilder& builder, const std::string& name,
                                               BufferId whole, BufferId by_rank, BufferId local, int64_t C,
                                               int64_t B) {
  std::vector<OpDecl> ops = {
      {name + "_to_ranks",
       {whole},
       {by_rank},
       0.0,
       [=](const OpContext& c) { permute_rank_major(c.view(whole), c.view(by_rank), C, B, false); },
       OpKind::memory}};
  for (OpDecl& op :
       builder.collective(name, CollectiveKind::reduce_scatter, MeshAxis::context, by_rank, local))
    ops.push_back(std::move(op));
  return ops;
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
      m.B, m.S, m.H, m.K, m.d,
      spec.config.num_threads > 0 ? static_cast<int>(spec.config.num_threads) : omp_get_max_threads());
  const BufferId attention_scratch =
      builder.gradient_scratch("scratch/attention_backward", shape_of({{"floats", backward_scratch_floats}}));

  const NormLayer pre_norm = add_norm(builder, prefix + "/pre_self_attention_layer_norm", options.norm,
                                      residual_in, width_shape, m.N, m.D, d_normed, d_residual, true);
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
    // With heads split over tensor, each rank's QK-norm scale gradient sums only its own heads.
    const bool heads_split = spec.sharding.compute("heads").degree > 1;
    for (ParameterDecl& parameter : builder.spec().parameters) {
      if (parameter.canonical_name == attention + "/query_norm/scale" ||
          parameter.canonical_name == attention + "/key_norm/scale")
        parameter.gradient_partial_over_tensor = heads_split;
    }
    q_rotated = q_norm.out;
    k_rotated = k_norm.out;
    qk_backward = {q_norm.backward, k_norm.backward};
  }
  const BufferId positions = spec.positions, segment_ids = spec.segment_ids;
  if (options.rope) {
    const float theta = static_cast<float>(spec.config.rope_max_timescale);
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
  // Context parallel: each rank's queries attend to keys of the whole sequence, gathered over `context`
  // (the causal half on average).
  const int64_t context = spec.sharding.mesh().size(MeshAxis::context);
  const double attention_flops = 4.0 * static_cast<double>(B * S * (S * context) * H * d) / 2.0;
  BufferId lse = kNoBuffer;
  if (builder.decoding()) {
    add_attention_decode(builder, attention, q_rotated, k_rotated, v, attended);
  } else {
    lse = builder.activation(attention + "/lse", lse_shape);
  }
  OpDecl attention_backward;
  std::vector<OpDecl> context_backward;  // under context: the ops around attention_backward, in order
  const bool context_parallel = context > 1 && !builder.decoding();
  if (!context_parallel) {
    if (!builder.decoding()) {
      builder.forward({attention + "/attention_forward",
                       {q_rotated, k_rotated, v, positions, segment_ids},
                       {attended, lse},
                       attention_flops,
                       [=](const OpContext& c) {
                         c.kernels->attention_forward(c.f32(attended), c.f32(lse), c.f32(q_rotated),
                                                      c.f32(k_rotated), c.f32(v), c.i32(positions),
                                                      c.i32(segment_ids), B, S, H, K, d);
                       },
                       OpKind::attention});
    }
    attention_backward = {attention + "/attention_backward",
                          {d_attended, attended, lse, q_rotated, k_rotated, v, positions, segment_ids},
                          {d_q_rotated, d_k_rotated, d_v, attention_scratch},
                          2.5 * attention_flops,  // dq, dk, dv plus recomputing the scores
                          [=](const OpContext& c) {
                            c.kernels->attention_backward(c.f32(d_q_rotated), c.f32(d_k_rotated), c.f32(d_v),
                                                          c.f32(d_attended), c.f32(attended), c.f32(lse),
                                                          c.f32(q_rotated), c.f32(k_rotated), c.f32(v),
                                                          c.i32(positions), c.i32(segment_ids), B, S, H, K, d,
                                                          c.f32(attention_scratch));
                          },
                          OpKind::attention};
  } else {
    // Context parallel, all_gather: this rank's L = S queries against the keys and values of the whole
    // rows (C L tokens, in the reordered order the ranks hold them), gathered over context with their
    // positions and segment ids, so the mask uses the original positions. The backward computes this
    // rank's share of dK / dV for the whole rows and reduce-scatters them.
    // A remat policy recomputes a block's activations from activations and inputs only (plan/remat.cpp:
    // scratch counts as kept), so every buffer on a path the recompute may walk is an activation: the
    // positions and segment ids with their rank-major staging (small int32, always), and under
    // remat_policy=full, where the attention forward itself is recomputed, the gathered K / V. Otherwise
    // K / V are gathered into shared scratch and gathered again for the backward (C times a layer's K / V
    // held only while one layer's attention runs).
    const int64_t C = context, Skv = S * context;
    const Shape kv_by_rank =
        shape_of({{"context_rank", C}, {"batch", B}, {"length", S}, {"kv_heads", K}, {"head_dim", d}});
    const Shape kv_whole =
        shape_of({{"batch", B}, {"context_length", Skv}, {"kv_heads", K}, {"head_dim", d}});
    const Shape tokens_by_rank = shape_of({{"context_rank", C}, {"batch", B}, {"length", S}});
    const Shape tokens_whole = shape_of({{"batch", B}, {"context_length", Skv}});
    const bool kv_recomputed = spec.config.remat_policy == RematPolicy::full;
    const auto kv_buffer = [&](const std::string& name, const Shape& shape) {
      return kv_recomputed ? builder.activation(attention + "/context_" + name, shape)
                           : builder.scratch("scratch/context_" + name, shape);
    };
    const BufferId key_by_rank = kv_buffer("key_by_rank", kv_by_rank);
    const BufferId value_by_rank = kv_recomputed ? kv_buffer("value_by_rank", kv_by_rank) : key_by_rank;
    const BufferId key_whole = kv_buffer("gathered_key", kv_whole);
    const BufferId value_whole = kv_buffer("gathered_value", kv_whole);
    const BufferId d_key_whole = builder.scratch("scratch/context_gathered_d_key", kv_whole);
    const BufferId d_value_whole = builder.scratch("scratch/context_gathered_d_value", kv_whole);
    const BufferId d_by_rank = builder.scratch("scratch/context_d_kv_by_rank", kv_by_rank);
    const auto int32_activation = [&](const std::string& name, const Shape& shape) {
      const BufferId id = builder.activation(attention + "/context_" + name, shape);
      builder.spec().buffers[static_cast<size_t>(id)].dtype = DType::i32;
      return id;
    };
    const BufferId kv_positions = int32_activation("kv_positions", tokens_whole);
    for (OpDecl& op :
         context_gather_ops(builder, attention + "/gather_positions", positions,
                            int32_activation("positions_by_rank", tokens_by_rank), kv_positions, C, B))
      builder.forward(std::move(op));
    BufferId kv_segment_ids = kNoBuffer;
    if (segment_ids != kNoBuffer) {
      kv_segment_ids = int32_activation("kv_segment_ids", tokens_whole);
      for (OpDecl& op :
           context_gather_ops(builder, attention + "/gather_segment_ids", segment_ids,
                              int32_activation("segment_ids_by_rank", tokens_by_rank), kv_segment_ids, C, B))
        builder.forward(std::move(op));
    }
    const auto gather_kv = [&](std::vector<OpDecl>& into) {
      for (OpDecl& op :
           context_gather_ops(builder, attention + "/gather_key", k_rotated, key_by_rank, key_whole, C, B))
        into.push_back(std::move(op));
      for (OpDecl& op :
           context_gather_ops(builder, attention + "/gather_value", v, value_by_rank, value_whole, C, B))
        into.push_back(std::move(op));
    };
    std::vector<OpDecl> forward_gathers;
    gather_kv(forward_gathers);
    for (OpDecl& op : forward_gathers) builder.forward(std::move(op));
    std::vector<BufferId> forward_reads = {q_rotated, key_whole, value_whole, positions, kv_positions};
    if (segment_ids != kNoBuffer) {
      forward_reads.push_back(segment_ids);
      forward_reads.push_back(kv_segment_ids);
    }
    builder.forward({attention + "/attention_forward",
                     forward_reads,
                     {attended, lse},
                     attention_flops,
                     [=](const OpContext& c) {
                       const int32_t* q_segments = segment_ids == kNoBuffer ? nullptr : c.i32(segment_ids);
                       const int32_t* kv_segments =
                           kv_segment_ids == kNoBuffer ? nullptr : c.i32(kv_segment_ids);
                       c.kernels->context_attention_forward(c.f32(attended), c.f32(lse), c.f32(q_rotated),
                                                            c.f32(key_whole), c.f32(value_whole),
                                                            c.i32(positions), q_segments, c.i32(kv_positions),
                                                            kv_segments, B, S, Skv, H, K, d, false);
                     },
                     OpKind::attention});
    const BufferId context_scratch = builder.gradient_scratch(
        "scratch/context_attention_backward",
        shape_of({{"floats", builder.kernels().context_attention_backward_scratch_floats(B, S, H)}}));
    if (!kv_recomputed) gather_kv(context_backward);
    std::vector<BufferId> backward_reads = {d_attended, attended,    lse,       q_rotated,
                                            key_whole,  value_whole, positions, kv_positions};
    if (segment_ids != kNoBuffer) {
      backward_reads.push_back(segment_ids);
      backward_reads.push_back(kv_segment_ids);
    }
    context_backward.push_back(
        {attention + "/attention_backward",
         backward_reads,
         {d_q_rotated, d_key_whole, d_value_whole, context_scratch},
         2.5 * attention_flops,  // dq, dk, dv plus recomputing the scores
         [=](const OpContext& c) {
           const int32_t* q_segments = segment_ids == kNoBuffer ? nullptr : c.i32(segment_ids);
           const int32_t* kv_segments = kv_segment_ids == kNoBuffer ? nullptr : c.i32(kv_segment_ids);
           c.kernels->context_attention_backward(
               c.f32(d_q_rotated), c.f32(d_key_whole), c.f32(d_value_whole), c.f32(d_attended),
               c.f32(attended), c.f32(lse), c.f32(q_rotated), c.f32(key_whole), c.f32(value_whole),
               c.i32(positions), q_segments, c.i32(kv_positions), kv_segments, B, S, Skv, H, K, d, false,
               c.f32(context_scratch));
         },
         OpKind::attention});
    for (OpDecl& op : context_reduce_scatter_ops(builder, attention + "/reduce_scatter_d_key", d_key_whole,
                                                 d_by_rank, d_k_rotated, C, B))
      context_backward.push_back(std::move(op));
    for (OpDecl& op : context_reduce_scatter_ops(builder, attention + "/reduce_scatter_d_value",
                                                 d_value_whole, d_by_rank, d_v, C, B))
      context_backward.push_back(std::move(op));
  }

  const LinearLayer out = add_linear(
      builder, attention + "/out", attended, shape_of({{"heads", m.H}, {"head_dim", m.d}, {"embed", m.D}}),
      width_shape, {"attention", options.bias, options.out_init_std, residual_in}, d_residual, d_attended,
      false);

  std::vector<OpDecl> group = {out.backward};
  if (!context_parallel) {
    group.push_back(attention_backward);
  } else {
    for (OpDecl& op : context_backward) group.push_back(std::move(op));
  }
  for (OpDecl& op : qk_backward) group.push_back(std::move(op));
  group.push_back(query.backward);
  group.push_back(key.backward);
  group.push_back(value.backward);
  // Column-parallel q, k, v: each tensor rank holds part of the input gradient.
  for (OpDecl& op : builder.collective(attention + "/reduce_input_gradient", CollectiveKind::all_reduce,
                                       MeshAxis::tensor, d_normed))
    group.push_back(std::move(op));
  group.push_back(pre_norm.backward);
  builder.backward_group(std::move(group));
  return out.out;
}

}  // namespace meshtrain
