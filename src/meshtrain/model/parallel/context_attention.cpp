#include "meshtrain/model/parallel/context_attention.h"

#include <cstring>

#include "meshtrain/core/error.h"
#include "meshtrain/model/parallel/collective_ops.h"

namespace meshtrain {
namespace {

// A collective over context moves rank-major blocks ([C, B, L, X], rank r's [B, L, X] at block r, X the
// elements of one token: K d for keys / values, 1 for positions and segment ids); the all_gather kernels
// want every row whole ([B, C L, X]). These two layouts convert:
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
      collective_ops(builder, name, CollectiveKind::all_gather, MeshAxis::context, by_rank, local);
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
       collective_ops(builder, name, CollectiveKind::reduce_scatter, MeshAxis::context, by_rank, local))
    ops.push_back(std::move(op));
  return ops;
}

// all_gather: this rank's L queries against the keys and values of the whole rows (C L tokens, in the
// reordered order the ranks hold them), gathered over context with their positions and segment ids, so the
// mask uses the original positions. The backward computes this rank's share of dK / dV for the whole rows
// and reduce-scatters them.
// A remat policy recomputes a block's activations from activations and inputs only (plan/remat.cpp:
// scratch counts as kept), so every buffer on a path the recompute may walk is an activation: the
// gathered positions and segment ids with their rank-major staging (small int32, once per model), and
// under remat_policy=full, where the attention forward itself is recomputed, the gathered K / V. Otherwise K
// / V are gathered into shared scratch and gathered again for the backward (C times a layer's K / V held only
// while one layer's attention runs).
std::vector<OpDecl> add_all_gather_attention(SpecBuilder& builder, const std::string& attention,
                                             const ContextAttentionBuffers& io, double flops) {
  const ModelDims& m = builder.dims();
  const ModelSpec& spec = builder.spec();
  const int64_t B = m.B, L = m.S, H = m.H, K = m.K, d = m.d;
  const DType compute = spec.config.dtype;  // bfloat16: the backend's bf16 attention kernels
  const int64_t C = context_ranks(builder), Skv = L * C;
  const BufferId positions = spec.positions, segment_ids = spec.segment_ids;
  const Shape kv_by_rank =
      shape_of({{"context_rank", C}, {"batch", B}, {"length", L}, {"kv_heads", K}, {"head_dim", d}});
  const Shape kv_whole = shape_of({{"batch", B}, {"context_length", Skv}, {"kv_heads", K}, {"head_dim", d}});
  const Shape tokens_by_rank = shape_of({{"context_rank", C}, {"batch", B}, {"length", L}});
  const Shape tokens_whole = shape_of({{"batch", B}, {"context_length", Skv}});
  const bool kv_recomputed = spec.options.context.attention_recomputed;
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
  // The whole rows' positions and segment ids are the same in every layer: the first attention layer (of
  // each chunk of the spec) gathers them into activations that every layer reads (kept under any remat
  // policy, since other blocks read them).
  const auto int32_activation = [&](const std::string& name, const Shape& shape) {
    return builder.as_int32(builder.activation(builder.chunk_shared("context/" + name), shape));
  };
  BufferId kv_positions = builder.find(builder.chunk_shared("context/kv_positions"));
  BufferId kv_segment_ids = builder.find(builder.chunk_shared("context/kv_segment_ids"));
  if (kv_positions == kNoBuffer) {
    kv_positions = int32_activation("kv_positions", tokens_whole);
    for (OpDecl& op :
         context_gather_ops(builder, "context/gather_positions", positions,
                            int32_activation("positions_by_rank", tokens_by_rank), kv_positions, C, B))
      builder.forward(std::move(op));
    if (segment_ids != kNoBuffer) {
      kv_segment_ids = int32_activation("kv_segment_ids", tokens_whole);
      for (OpDecl& op :
           context_gather_ops(builder, "context/gather_segment_ids", segment_ids,
                              int32_activation("segment_ids_by_rank", tokens_by_rank), kv_segment_ids, C, B))
        builder.forward(std::move(op));
    }
  }
  const auto gather_kv = [&](std::vector<OpDecl>& into) {
    for (OpDecl& op :
         context_gather_ops(builder, attention + "/gather_key", io.k, key_by_rank, key_whole, C, B))
      into.push_back(std::move(op));
    for (OpDecl& op :
         context_gather_ops(builder, attention + "/gather_value", io.v, value_by_rank, value_whole, C, B))
      into.push_back(std::move(op));
  };
  std::vector<OpDecl> forward_gathers;
  gather_kv(forward_gathers);
  for (OpDecl& op : forward_gathers) builder.forward(std::move(op));
  std::vector<BufferId> token_reads = {positions, kv_positions};
  if (segment_ids != kNoBuffer) {
    token_reads.push_back(segment_ids);
    token_reads.push_back(kv_segment_ids);
  }
  const auto with_tokens = [&](std::vector<BufferId> reads) {
    reads.insert(reads.end(), token_reads.begin(), token_reads.end());
    return reads;
  };
  const BufferId q = io.q, attended = io.attended, lse = io.lse;
  builder.forward({attention + "/attention_forward",
                   with_tokens({q, key_whole, value_whole}),
                   {attended, lse},
                   flops,
                   [=](const OpContext& c) {
                     const int32_t* q_segments = segment_ids == kNoBuffer ? nullptr : c.i32(segment_ids);
                     const int32_t* kv_segments =
                         kv_segment_ids == kNoBuffer ? nullptr : c.i32(kv_segment_ids);
                     kernels::attention_kernels(*c.kernels, compute)
                         .context_forward(c.f32(attended), c.f32(lse), c.f32(q), c.f32(key_whole),
                                          c.f32(value_whole), c.i32(positions), q_segments,
                                          c.i32(kv_positions), kv_segments, B, L, Skv, H, K, d, false);
                   },
                   OpKind::attention});

  std::vector<OpDecl> backward;
  const BufferId context_scratch = builder.gradient_scratch(
      "scratch/context_attention_backward",
      shape_of({{"floats", builder.kernels().context_attention_backward_scratch_floats(B, L, H)}}));
  if (!kv_recomputed) gather_kv(backward);
  const BufferId d_attended = io.d_attended, d_q = io.d_q;
  backward.push_back(
      {attention + "/attention_backward",
       with_tokens({d_attended, attended, lse, q, key_whole, value_whole}),
       {d_q, d_key_whole, d_value_whole, context_scratch},
       2.5 * flops,  // dq, dk, dv plus recomputing the scores
       [=](const OpContext& c) {
         const int32_t* q_segments = segment_ids == kNoBuffer ? nullptr : c.i32(segment_ids);
         const int32_t* kv_segments = kv_segment_ids == kNoBuffer ? nullptr : c.i32(kv_segment_ids);
         kernels::attention_kernels(*c.kernels, compute)
             .context_backward(c.f32(d_q), c.f32(d_key_whole), c.f32(d_value_whole), c.f32(d_attended),
                               c.f32(attended), c.f32(lse), c.f32(q), c.f32(key_whole), c.f32(value_whole),
                               c.i32(positions), q_segments, c.i32(kv_positions), kv_segments, B, L, Skv, H,
                               K, d, false, c.f32(context_scratch));
       },
       OpKind::attention});
  for (OpDecl& op : context_reduce_scatter_ops(builder, attention + "/reduce_scatter_d_key", d_key_whole,
                                               d_by_rank, io.d_k, C, B))
    backward.push_back(std::move(op));
  for (OpDecl& op : context_reduce_scatter_ops(builder, attention + "/reduce_scatter_d_value", d_value_whole,
                                               d_by_rank, io.d_v, C, B))
    backward.push_back(std::move(op));
  return backward;
}

// ring: the blocks are scratch written inside the ops, which read only activations and inputs, so a remat
// policy that recomputes the forward replays its ring as it is.
std::vector<OpDecl> add_ring_attention(SpecBuilder& builder, const std::string& attention,
                                       const ContextAttentionBuffers& io, double flops) {
  const ModelDims& m = builder.dims();
  const ModelSpec& spec = builder.spec();
  const int64_t B = m.B, L = m.S, H = m.H, K = m.K, d = m.d;
  const DType compute = spec.config.dtype;  // bfloat16: the backend's bf16 attention kernels
  const int64_t C = context_ranks(builder);
  const BufferId positions = spec.positions, segment_ids = spec.segment_ids;
  const int64_t token_fields = segment_ids == kNoBuffer ? 1 : 2;
  const Shape kv_block =
      shape_of({{"key_value", 2}, {"batch", B}, {"length", L}, {"kv_heads", K}, {"head_dim", d}});
  const Shape token_block = shape_of({{"token_fields", token_fields}, {"batch", B}, {"length", L}});
  const std::array<BufferId, 2> kv_blocks = {builder.scratch("scratch/ring_kv_0", kv_block),
                                             builder.scratch("scratch/ring_kv_1", kv_block)};
  const std::array<BufferId, 2> token_blocks = {
      builder.as_int32(builder.scratch("scratch/ring_tokens_0", token_block)),
      builder.as_int32(builder.scratch("scratch/ring_tokens_1", token_block))};
  std::vector<BufferId> inputs = {io.q, io.k, io.v, positions};
  if (segment_ids != kNoBuffer) inputs.push_back(segment_ids);
  const std::vector<BufferId> blocks = {kv_blocks[0], kv_blocks[1], token_blocks[0], token_blocks[1]};
  const auto joined = [](std::vector<BufferId> a, const std::vector<BufferId>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  // Everything but the backward's own buffers, as the op sees it.
  const auto arguments = [=](const OpContext& c) {
    RingAttentionArguments a;
    a.B = B, a.L = L, a.H = H, a.K = K, a.d = d;
    a.compute = compute;
    a.q = c.f32(io.q), a.k = c.f32(io.k), a.v = c.f32(io.v);
    a.positions = c.i32(positions);
    a.segment_ids = segment_ids == kNoBuffer ? nullptr : c.i32(segment_ids);
    a.out = c.f32(io.attended), a.lse = c.f32(io.lse);
    a.kv_blocks = {c.view(kv_blocks[0]), c.view(kv_blocks[1])};
    a.token_blocks = {c.view(token_blocks[0]), c.view(token_blocks[1])};
    return a;
  };
  const auto ring_of = [attention](const OpContext& c) -> const kernels::ContextRing& {
    MT_CHECK(c.context_ring != nullptr, "ring attention '" + attention + "' without a context ring");
    return *c.context_ring;
  };
  builder.forward(context_passes(builder, attention + "/ring_pass_kv", kv_blocks[0], C - 1));
  builder.forward(context_passes(builder, attention + "/ring_pass_tokens", token_blocks[0], C - 1));
  builder.forward(
      {attention + "/ring_attention_forward", inputs, joined({io.attended, io.lse}, blocks), flops,
       [=](const OpContext& c) {
         ring_attention_forward(ring_of(c), *c.kernels, arguments(c), attention + "/ring_attention_forward");
       },
       OpKind::attention});

  const std::array<BufferId, 2> d_kv_blocks = {builder.scratch("scratch/ring_d_kv_0", kv_block),
                                               builder.scratch("scratch/ring_d_kv_1", kv_block)};
  const BufferId d_kv_step = builder.scratch("scratch/ring_d_kv_step", kv_block);
  const BufferId scratch = builder.gradient_scratch(
      "scratch/context_attention_backward",
      shape_of({{"floats", builder.kernels().context_attention_backward_scratch_floats(B, L, H)}}));
  std::vector<OpDecl> backward = {
      context_passes(builder, attention + "/ring_pass_kv#backward", kv_blocks[0], C - 1),
      context_passes(builder, attention + "/ring_pass_tokens#backward", token_blocks[0], C - 1),
      context_passes(builder, attention + "/ring_pass_d_kv", d_kv_blocks[0], C)};
  backward.push_back(
      {attention + "/ring_attention_backward", joined({io.d_attended, io.attended, io.lse}, inputs),
       joined({io.d_q, io.d_k, io.d_v, d_kv_blocks[0], d_kv_blocks[1], d_kv_step, scratch}, blocks),
       2.5 * flops,  // dq, dk, dv plus recomputing the scores
       [=](const OpContext& c) {
         RingAttentionArguments a = arguments(c);
         a.dout = c.f32(io.d_attended);
         a.dq = c.f32(io.d_q), a.dk = c.f32(io.d_k), a.dv = c.f32(io.d_v);
         a.d_kv_blocks = {c.view(d_kv_blocks[0]), c.view(d_kv_blocks[1])};
         a.d_kv_step = c.f32(d_kv_step);
         a.scratch = c.f32(scratch);
         ring_attention_backward(ring_of(c), *c.kernels, a, attention + "/ring_attention_backward");
       },
       OpKind::attention});
  return backward;
}

// This rank's block into a ring block: keys then values, positions then segment ids.
void pack_block(const RingAttentionArguments& a) {
  const size_t kv_bytes = static_cast<size_t>(a.B * a.L * a.K * a.d) * sizeof(float);
  const size_t token_bytes = static_cast<size_t>(a.B * a.L) * sizeof(int32_t);
  auto* kv = static_cast<uint8_t*>(a.kv_blocks[0].data);
  std::memcpy(kv, a.k, kv_bytes);
  std::memcpy(kv + kv_bytes, a.v, kv_bytes);
  auto* tokens = static_cast<uint8_t*>(a.token_blocks[0].data);
  std::memcpy(tokens, a.positions, token_bytes);
  if (a.segment_ids != nullptr) std::memcpy(tokens + token_bytes, a.segment_ids, token_bytes);
}

// The views of a ring block's parts.
struct BlockParts {
  const float *k, *v;
  const int32_t *positions, *segment_ids;
};
BlockParts parts_of(const RingAttentionArguments& a, int64_t slot) {
  const float* kv = a.kv_blocks[static_cast<size_t>(slot)].f32();
  const int32_t* tokens = a.token_blocks[static_cast<size_t>(slot)].i32();
  const int64_t kv_floats = a.B * a.L * a.K * a.d;
  return {kv, kv + kv_floats, tokens, a.segment_ids == nullptr ? nullptr : tokens + a.B * a.L};
}

// Where row b starts in each layout: the kernels run one row at a time (B = 1 on offset pointers; the
// kernels' results do not depend on how the rows are split), so the ring's passes move between rows.
struct RowOffsets {
  int64_t queries, lse, keys, tokens;  // in [B, L, H, d], [B, H, L], [B, L, K, d] and [B, L]
  const int32_t* segments(const int32_t* segment_ids) const {
    return segment_ids == nullptr ? nullptr : segment_ids + tokens;
  }
};
RowOffsets row_offsets(const RingAttentionArguments& a, int64_t b) {
  return {b * a.L * a.H * a.d, b * a.H * a.L, b * a.L * a.K * a.d, b * a.L};
}

}  // namespace

std::vector<OpDecl> add_context_attention(SpecBuilder& builder, const std::string& attention,
                                          const ContextAttentionBuffers& buffers, double flops) {
  return builder.spec().options.context.strategy == ContextParallelStrategy::ring
             ? add_ring_attention(builder, attention, buffers, flops)
             : add_all_gather_attention(builder, attention, buffers, flops);
}

void ring_attention_forward(const kernels::ContextRing& ring, const kernels::KernelBackend& kernels,
                            const RingAttentionArguments& a, const std::string& name) {
  const int64_t C = ring.size;
  pack_block(a);
  for (int64_t step = 0; step < C; ++step) {
    const int64_t slot = step % 2, next = 1 - slot;
    if (step + 1 < C) {
      ring.start_pass(a.kv_blocks[static_cast<size_t>(slot)], a.kv_blocks[static_cast<size_t>(next)],
                      name + "/pass_kv");
      ring.start_pass(a.token_blocks[static_cast<size_t>(slot)], a.token_blocks[static_cast<size_t>(next)],
                      name + "/pass_tokens");
    }
    const BlockParts block = parts_of(a, slot);
    for (int64_t b = 0; b < a.B; ++b) {  // a row at a time, moving the pass along in between
      const RowOffsets at = row_offsets(a, b);
      kernels::attention_kernels(kernels, a.compute)
          .context_forward(a.out + at.queries, a.lse + at.lse, a.q + at.queries, block.k + at.keys,
                           block.v + at.keys, a.positions + at.tokens, at.segments(a.segment_ids),
                           block.positions + at.tokens, at.segments(block.segment_ids), 1, a.L, a.L, a.H, a.K,
                           a.d, step > 0);
      ring.progress();
    }
    if (step + 1 < C) ring.wait(name + "/wait");
  }
}

void ring_attention_backward(const kernels::ContextRing& ring, const kernels::KernelBackend& kernels,
                             const RingAttentionArguments& a, const std::string& name) {
  const int64_t C = ring.size;
  const int64_t kv_floats = a.B * a.L * a.K * a.d;
  pack_block(a);
  for (int64_t step = 0; step < C; ++step) {
    const int64_t slot = step % 2, next = 1 - slot;
    if (step + 1 < C) {
      ring.start_pass(a.kv_blocks[static_cast<size_t>(slot)], a.kv_blocks[static_cast<size_t>(next)],
                      name + "/pass_kv");
      ring.start_pass(a.token_blocks[static_cast<size_t>(slot)], a.token_blocks[static_cast<size_t>(next)],
                      name + "/pass_tokens");
    }
    // Step 0 starts the partial sums of this rank's own block; later steps compute into d_kv_step (the
    // partial sums of the block in hand are still arriving) and add once they are here.
    const TensorView& d_sums = a.d_kv_blocks[static_cast<size_t>(slot)];
    float* d_target = step == 0 ? d_sums.f32() : a.d_kv_step;
    if (step > 0) std::memset(a.d_kv_step, 0, static_cast<size_t>(2 * kv_floats) * sizeof(float));
    const BlockParts block = parts_of(a, slot);
    for (int64_t b = 0; b < a.B; ++b) {
      const RowOffsets at = row_offsets(a, b);
      kernels::attention_kernels(kernels, a.compute)
          .context_backward(a.dq + at.queries, d_target + at.keys, d_target + kv_floats + at.keys,
                            a.dout + at.queries, a.out + at.queries, a.lse + at.lse, a.q + at.queries,
                            block.k + at.keys, block.v + at.keys, a.positions + at.tokens,
                            at.segments(a.segment_ids), block.positions + at.tokens,
                            at.segments(block.segment_ids), 1, a.L, a.L, a.H, a.K, a.d, step > 0, a.scratch);
      ring.progress();
    }
    ring.wait(name + "/wait");
    if (step > 0) kernels.residual_add(d_sums.f32(), a.d_kv_step, 2 * kv_floats);
    ring.start_pass(d_sums, a.d_kv_blocks[static_cast<size_t>(next)], name + "/pass_d_kv");
  }
  ring.wait(name + "/wait");
  // After C passes the sums of this rank's own block are complete.
  const float* own = a.d_kv_blocks[static_cast<size_t>(C % 2)].f32();
  std::memcpy(a.dk, own, static_cast<size_t>(kv_floats) * sizeof(float));
  std::memcpy(a.dv, own + kv_floats, static_cast<size_t>(kv_floats) * sizeof(float));
}

OpDecl context_passes(const SpecBuilder& builder, const std::string& name, BufferId block, int64_t passes) {
  std::vector<OpDecl> ops =
      collective_ops(builder, name, CollectiveKind::send_recv, MeshAxis::context, block);
  MT_CHECK(ops.size() == 1, "passes between context ranks need more than one");
  ops[0].collective.inside_next_op = true;
  ops[0].collective.repeats = passes;
  return ops[0];
}

int64_t context_ranks(const SpecBuilder& builder) {
  return builder.spec().sharding.mesh().size(MeshAxis::context);
}

}  // namespace meshtrain
