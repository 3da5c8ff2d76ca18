#include "meshtrain/model/layers/engram.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "meshtrain/core/error.h"
#include "meshtrain/model/parallel/halo_exchange.h"
#include "meshtrain/model/parallel/linear.h"
#include "meshtrain/model/parallel/vocab_parallel.h"

namespace meshtrain {

bool is_engram_table(const std::string& name) {
  return name.ends_with("/engram/multi_head_embedding/embedding");
}

bool is_engram_table(const ParameterDecl& parameter) {
  return is_engram_table(parameter.canonical_name);
}

EngramCounts engram_counts(const ModelSpec& spec) {
  const EngramOptions& engram = spec.options.engram;
  const ModelDims& m = spec.dims;
  EngramCounts counts;
  counts.layers = static_cast<int64_t>(spec.engram.size());
  if (counts.layers == 0) return counts;
  counts.rows_per_token = engram.num_heads * (engram.max_ngram_size - 1);
  counts.tables = counts.layers * counts.rows_per_token;
  for (const EngramLayerSpec& layer : spec.engram) counts.rows += layer.table_rows;
  for (const ParameterDecl& parameter : spec.parameters) {
    if (is_engram_table(parameter)) counts.table_parameters += spec.buffer(parameter.value).shape.elements();
  }
  const auto N = static_cast<double>(m.N), G = static_cast<double>(m.G), D = static_cast<double>(m.D);
  const double D_en = static_cast<double>(counts.rows_per_token * engram.head_dim);
  const double K = static_cast<double>(engram.kernel_size);
  counts.forward_flops = static_cast<double>(counts.layers) *
                         (2 * N * D_en * G * D + 2 * N * D_en * D + 2 * N * K * G * D + 2 * N * G * D);
  return counts;
}

Shape stream_shape(const ModelDims& m) {
  return m.G > 1 ? token_shape(m, {{"streams", m.G}, {"embed", m.D}}) : token_shape(m, {{"embed", m.D}});
}

BufferId add_engram_block(SpecBuilder& builder, const std::string& prefix, size_t engram_index,
                          BufferId streams_in, BufferId d_streams) {
  const ModelDims& m = builder.dims();
  ModelSpec& spec = builder.spec();
  const EngramOptions& options = spec.options.engram;
  const int64_t B = m.B, S = m.S, N = m.N, G = m.G, D = m.D;
  const int64_t heads = options.num_heads * (options.max_ngram_size - 1);  // H_e (n - 1)
  const int64_t Dh = options.head_dim, D_en = heads * Dh;
  const int64_t K = options.kernel_size, dilation = options.max_ngram_size, GD = G * D;
  const int64_t history = (K - 1) * dilation;  // the ShortConv's halo
  const std::string engram = prefix + "/engram";

  EngramLayerSpec layer;
  layer.layer = options.layers[engram_index];
  layer.table_sizes = options.table_sizes[engram_index];
  layer.table_rows = std::accumulate(layer.table_sizes.begin(), layer.table_sizes.end(), int64_t{0});
  // Each head's ids index its own table; offset_i (exclusive prefix sum) places them in the flat table.
  std::vector<int32_t> offsets(layer.table_sizes.size(), 0);
  for (size_t i = 1; i < offsets.size(); ++i)
    offsets[i] = offsets[i - 1] + static_cast<int32_t>(layer.table_sizes[i - 1]);
  // Table rows split like the vocabulary: rank r holds rows [r R, (r + 1) R) of the padded table, so the
  // global table, and with it a checkpoint, has the same shape on any mesh whose degree divides 128.
  const TableShard row_shard = table_shard(builder, "engram_rows", layer.table_rows);
  const int64_t R = row_shard.rows;
  const int64_t global_rows = row_shard.global_rows;  // ids are below table_rows; the padding is never read

  const Shape streams = stream_shape(m);
  const Shape per_stream = token_shape(m, {{"streams", G}, {"embed", D}});
  const Shape memory_shape = token_shape(m, {{"engram_dim", D_en}});
  const Shape value_shape = token_shape(m, {{"embed", D}});
  const BufferId hash_ids = layer.hash_ids =
      builder.input("batch/engram_hash_ids/" + prefix.substr(prefix.rfind('/') + 1), DType::i32,
                    token_shape(m, {{"engram_heads", heads}}));

  // Backward temporaries, shared by the Engram layers.
  const BufferId d_h = builder.gradient_scratch("scratch/d_engram_normed", per_stream);
  const BufferId d_memory = builder.gradient_scratch("scratch/d_engram_memory", memory_shape);
  const BufferId d_key = builder.gradient_scratch("scratch/d_engram_key", per_stream);
  const BufferId d_q = builder.gradient_scratch("scratch/d_engram_query", per_stream);
  const BufferId d_k = builder.gradient_scratch("scratch/d_engram_key_normed", per_stream);
  const BufferId d_v = builder.gradient_scratch("scratch/d_engram_value", value_shape);
  const BufferId d_gated = builder.gradient_scratch("scratch/d_engram_gated", per_stream);
  const BufferId d_u = builder.gradient_scratch("scratch/d_engram_conv_input", per_stream);
  const BufferId d_y = builder.gradient_scratch("scratch/d_engram_conv", per_stream);

  // h = RMSNorm_engram(x), one [D] scale for every stream.
  const NormLayer pre_norm = add_norm(builder, engram + "/engram_layer_norm", NormKind::rms, streams_in,
                                      per_stream, N * G, D, d_h, d_streams, true);

  // The memory read: e [N, D_en] = the heads' rows, concatenated (head-major within a token).
  const BufferId table = builder.parameter(
      engram + "/multi_head_embedding/embedding", shape_of({{"engram_rows", R}, {"engram_head_dim", Dh}}),
      {"engram", ParameterInit::normal, 1.0 / std::sqrt(static_cast<double>(Dh)), ParameterRole::embedding});
  const BufferId d_table = builder.gradient_of(table);
  const BufferId rows =
      builder.as_int32(builder.activation(engram + "/table_rows", token_shape(m, {{"engram_heads", heads}})));
  const BufferId memory = builder.activation(engram + "/memory", memory_shape);
  const auto row_offset = [=](const OpContext& ctx) { return row_shard.row_offset(ctx); };
  builder.forward(
      {engram + "/lookup_forward", {hash_ids, table}, {rows, memory}, 0.0, [=](const OpContext& ctx) {
         int32_t* flat = ctx.i32(rows);
         ctx.kernels->engram_table_rows(flat, ctx.i32(hash_ids), offsets.data(), N, heads);
         ctx.kernels->embedding_forward(ctx.f32(memory), flat, ctx.f32(table), N * heads, R, Dh, false,
                                        row_offset(ctx), global_rows);
       }});
  if (row_shard.split) {
    for (OpDecl& op : table_lookup_reduction(builder, engram + "/reduce_lookup", memory))
      builder.forward(std::move(op));
  }

  // Keys per stream and the shared value, from the memory (DenseGeneral with bias; fan-in init).
  const double projection_std = 1.0 / std::sqrt(static_cast<double>(D_en));
  const LinearLayer key_projection = add_linear(
      builder, engram + "/key_proj", memory, shape_of({{"engram_dim", D_en}, {"streams", G}, {"embed", D}}),
      per_stream, {"engram", true, projection_std, kNoBuffer}, d_key, d_memory, true);
  const NormLayer k_norm = add_stream_norm(builder, engram + "/k_norm", key_projection.out, per_stream, N, G,
                                           D, d_k, d_key, false);
  const NormLayer q_norm =
      add_stream_norm(builder, engram + "/q_norm", pre_norm.out, per_stream, N, G, D, d_q, d_h, false);
  const LinearLayer value_projection =
      add_linear(builder, engram + "/value_proj", memory, shape_of({{"engram_dim", D_en}, {"embed", D}}),
                 value_shape, {"engram", true, projection_std, kNoBuffer}, d_v, d_memory, false);

  // gated_g = gate_g v.
  const BufferId gated = builder.activation(engram + "/gated", per_stream);
  const BufferId gate = builder.activation(engram + "/gate", token_shape(m, {{"streams", G}}));
  const BufferId q = q_norm.out, k = k_norm.out, v = value_projection.out;
  builder.forward({engram + "/gate_forward",
                   {q, k, v},
                   {gated, gate},
                   2.0 * static_cast<double>(N * G * D),
                   [=](const OpContext& ctx) {
                     ctx.kernels->engram_gate_forward(ctx.f32(gated), ctx.f32(gate), ctx.f32(q), ctx.f32(k),
                                                      ctx.f32(v), N, G, D);
                   }});

  // ShortConv: u = RMSNorm_c(gated), y = causal depthwise conv over the G D channels, zero-initialised taps.
  const NormLayer conv_norm =
      add_stream_norm(builder, engram + "/short_conv/norm", gated, per_stream, N, G, D, d_u, d_gated, true);
  const BufferId conv_weight = builder.parameter(
      engram + "/short_conv/conv/kernel", shape_of({{"conv_taps", K}, {"streams", G}, {"embed", D}}),
      {"engram", ParameterInit::zeros, 0.0, ParameterRole::convolution});
  const BufferId d_conv_weight = builder.gradient_of(conv_weight);
  const BufferId u = conv_norm.out;
  const BufferId y = builder.activation(engram + "/short_conv/out", per_stream);
  const ShortConvHalos conv = short_conv_halos(builder, history, GD);
  BufferId halo = kNoBuffer;
  const double conv_flops = 2.0 * static_cast<double>(N * K * GD);
  if (builder.decoding()) {
    // One token: the taps before it read the last `history` inputs, kept across steps (zeros at position 0).
    BufferId conv_history = kNoBuffer;
    if (history > 0) {
      conv_history = layer.conv_history = builder.cache(
          engram + "/short_conv/history", shape_of({{"conv_history", history}, {"mhc_width", GD}}));
    }
    const BufferId positions = spec.positions;
    std::vector<BufferId> reads = {u, conv_weight, positions}, writes = {y};
    if (conv_history != kNoBuffer) {
      reads.push_back(conv_history);
      writes.push_back(conv_history);
    }
    builder.forward(
        {engram + "/short_conv/decode", reads, writes, conv_flops, [=](const OpContext& ctx) {
           float* kept = conv_history == kNoBuffer ? nullptr : ctx.f32(conv_history);
           if (kept != nullptr && ctx.i32(positions)[0] == 0) std::fill_n(kept, history * GD, 0.0f);
           ctx.kernels->short_conv_forward(ctx.f32(y), ctx.f32(u), kept, ctx.f32(conv_weight), 1, 1, GD, K,
                                           dilation);
           if (kept != nullptr) {  // oldest out, this token's input in
             std::memmove(kept, kept + GD, static_cast<size_t>((history - 1) * GD) * sizeof(float));
             std::memcpy(kept + (history - 1) * GD, ctx.f32(u), static_cast<size_t>(GD) * sizeof(float));
           }
         }});
  } else if (!conv.exchanges()) {
    builder.forward(
        {engram + "/short_conv/forward", {u, conv_weight}, {y}, conv_flops, [=](const OpContext& ctx) {
           ctx.kernels->short_conv_forward(ctx.f32(y), ctx.f32(u), nullptr, ctx.f32(conv_weight), B, S, GD, K,
                                           dilation);
         }});
  } else {
    // Each stretch's halo: the last `history` inputs of its natural predecessor, from the context rank
    // holding it (ShortConvHalos), saved for the backward (the taps' gradient reads it).
    halo = builder.activation(engram + "/short_conv/halo", conv.halo_shape());
    builder.forward(conv.pass(builder, engram + "/short_conv/pass_halo"));
    builder.forward({engram + "/short_conv/forward",
                     {u, conv_weight},
                     {y, halo, conv.send, conv.receive},
                     conv_flops,
                     [=](const OpContext& ctx) {
                       conv.exchange_halo(ctx, ctx.f32(u), ctx.f32(halo), engram + "/short_conv/pass_halo");
                       ctx.kernels->short_conv_forward(ctx.f32(y), ctx.f32(u), ctx.f32(halo),
                                                       ctx.f32(conv_weight), B * conv.stretches, conv.length,
                                                       GD, K, dilation);
                     }});
  }

  // x_out = x + gated + silu(y): the block's output joins every stream's residual.
  const BufferId out = builder.activation(engram + "/out", streams);
  builder.forward({engram + "/output_forward",
                   {streams_in, gated, y},
                   {out},
                   3.0 * static_cast<double>(N * GD),
                   [=](const OpContext& ctx) {
                     ctx.kernels->short_conv_output_forward(ctx.f32(out), ctx.f32(streams_in), ctx.f32(gated),
                                                            ctx.f32(y), N * GD);
                   }});
  spec.engram.push_back(layer);

  // Backward, in order: the output and the conv (d_gated, d_y, d_u), the conv norm (adds into d_gated), the
  // gate, the value and key paths into d_memory, the table, the query norm and the pre-norm (adds into
  // d_streams, which the residual path already holds).
  std::vector<OpDecl> group;
  group.push_back({engram + "/output_backward",
                   {d_streams, y},
                   {d_gated, d_y},
                   4.0 * static_cast<double>(N * GD),
                   [=](const OpContext& ctx) {
                     ctx.kernels->short_conv_output_backward(ctx.f32(d_gated), ctx.f32(d_y),
                                                             ctx.f32(d_streams), ctx.f32(y), N * GD);
                   }});
  if (!conv.exchanges()) {
    group.push_back({engram + "/short_conv/backward",
                     {d_y, u, conv_weight, d_conv_weight},
                     {d_u, d_conv_weight},
                     2.0 * conv_flops,
                     [=](const OpContext& ctx) {
                       ctx.kernels->short_conv_backward(ctx.f32(d_u), nullptr, ctx.f32(d_conv_weight),
                                                        ctx.f32(d_y), ctx.f32(u), nullptr,
                                                        ctx.f32(conv_weight), B, S, GD, K, dilation);
                     }});
  } else {
    // The halos' gradients go back to the ranks whose inputs they were, which add them to those inputs'.
    const BufferId d_halo = builder.gradient_scratch("scratch/d_engram_halo", conv.halo_shape());
    group.push_back(conv.pass(builder, engram + "/short_conv/pass_halo_gradient"));
    group.push_back({engram + "/short_conv/backward",
                     {d_y, u, halo, conv_weight, d_conv_weight},
                     {d_u, d_halo, d_conv_weight, conv.send, conv.receive},
                     2.0 * conv_flops,
                     [=](const OpContext& ctx) {
                       ctx.kernels->short_conv_backward(ctx.f32(d_u), ctx.f32(d_halo), ctx.f32(d_conv_weight),
                                                        ctx.f32(d_y), ctx.f32(u), ctx.f32(halo),
                                                        ctx.f32(conv_weight), B * conv.stretches, conv.length,
                                                        GD, K, dilation);
                       conv.return_halo_gradient(ctx, ctx.f32(d_halo), ctx.f32(d_u),
                                                 engram + "/short_conv/pass_halo_gradient");
                     }});
  }
  group.push_back(conv_norm.backward);
  group.push_back({engram + "/gate_backward",
                   {d_gated, gate, q, k, v},
                   {d_q, d_k, d_v},
                   4.0 * static_cast<double>(N * G * D),
                   [=](const OpContext& ctx) {
                     ctx.kernels->engram_gate_backward(ctx.f32(d_q), ctx.f32(d_k), ctx.f32(d_v),
                                                       ctx.f32(d_gated), ctx.f32(gate), ctx.f32(q),
                                                       ctx.f32(k), ctx.f32(v), N, G, D);
                   }});
  append_ops(group, value_projection.backward);  // d_memory written
  group.push_back(k_norm.backward);
  append_ops(group, key_projection.backward);  // d_memory added
  group.push_back({engram + "/lookup_backward", {d_memory, rows}, {d_table}, 0.0, [=](const OpContext& ctx) {
                     ctx.kernels->embedding_backward(ctx.f32(d_table), ctx.i32(rows), ctx.f32(d_memory),
                                                     N * heads, R, Dh, row_offset(ctx), global_rows);
                   }});
  group.push_back(q_norm.backward);
  group.push_back(pre_norm.backward);
  builder.backward_group(std::move(group));
  return out;
}

}  // namespace meshtrain
