#include "meshtrain/model/layers/embedding.h"

#include <algorithm>
#include <optional>

#include "meshtrain/model/parallel/vocab_parallel.h"

namespace meshtrain {

BufferId add_embedding_table(SpecBuilder& builder) {
  const ModelDims& m = builder.dims();
  builder.spec().embedding_table =
      builder.parameter("token_embedder/embedding", shape_of({{"vocab", m.V}, {"embed", m.D}}),
                        {"embedding", ParameterInit::normal, 0.02, ParameterRole::embedding});
  return builder.spec().embedding_table;
}

EmbeddingLayer add_embedding(SpecBuilder& builder, bool learned_positions, BufferId d_residual) {
  const ModelDims& m = builder.dims();
  const ModelSpec& spec = builder.spec();
  const int64_t N = m.N, V = m.V, D = m.D, P = m.P;
  const BufferId table = add_embedding_table(builder);
  const BufferId d_table = builder.gradient_of(table);
  const BufferId residual = builder.activation("token_embedder/out", token_shape(m, {{"embed", D}}));
  const BufferId tokens = spec.tokens, positions = spec.positions;
  BufferId position_table = kNoBuffer, d_position_table = kNoBuffer;
  if (learned_positions) {
    position_table =
        builder.parameter("position_embedder/embedding", shape_of({{"positions", P}, {"embed", D}}),
                          {"embedding", ParameterInit::normal, 0.01, ParameterRole::embedding});
    d_position_table = builder.gradient_of(position_table);
  }
  std::vector<BufferId> reads = {tokens, positions, table}, backward_writes = {d_table};
  if (learned_positions) {
    reads.push_back(position_table);
    backward_writes.push_back(d_position_table);
  }
  // Vocab-parallel: this tensor rank holds vocabulary rows [rank x V, (rank + 1) x V); the learned positions
  // join on one rank only, so the lookup's reduction adds them once.
  const TableShard vocab = table_shard(builder, "vocab", m.V_valid);
  const int64_t global_rows = vocab.global_rows;
  const auto vocab_offset = [=](const OpContext& c) { return vocab.row_offset(c); };
  const auto adds_positions = [=](const OpContext& c) {
    return position_table != kNoBuffer && vocab.first_rank(c);
  };
  builder.forward({"token_embedder/forward", reads, {residual}, 0.0, [=](const OpContext& c) {
                     c.kernels->embedding_forward(c.f32(residual), c.i32(tokens), c.f32(table), N, V, D,
                                                  false, vocab_offset(c), global_rows);
                     if (adds_positions(c)) {
                       c.kernels->embedding_forward(c.f32(residual), c.i32(positions), c.f32(position_table),
                                                    N, P, D, true, /*vocab_offset=*/0, /*global_rows=*/-1);
                     }
                   }});
  for (OpDecl& op : table_lookup_reduction(builder, "token_embedder/reduce_lookup", residual))
    builder.forward(std::move(op));
  builder.backward_group({{"token_embedder/backward",
                           {d_residual, tokens, positions},
                           backward_writes,
                           0.0,
                           [=](const OpContext& c) {
                             c.kernels->embedding_backward(c.f32(d_table), c.i32(tokens), c.f32(d_residual),
                                                           N, V, D, vocab_offset(c), global_rows);
                             if (d_position_table != kNoBuffer) {
                               c.kernels->embedding_backward(c.f32(d_position_table), c.i32(positions),
                                                             c.f32(d_residual), N, P, D, /*vocab_offset=*/0,
                                                             /*global_rows=*/-1);
                             }
                           }}});
  return {residual, table};
}

namespace {

// The decode step's end: logits [1, V] of the next token from the final hidden state, padding rows -inf.
void add_decode_logits(SpecBuilder& builder, BufferId hidden, BufferId unembedding,
                       kernels::UnembedLayout layout) {
  const ModelDims& m = builder.dims();
  const int64_t D = m.D, V = m.V, V_valid = m.V_valid;
  const BufferId logits = builder.activation("decoder/logits", token_shape(m, {{"vocab", V}}));
  builder.spec().logits = logits;
  builder.forward({"decoder/logits_forward",
                   {hidden, unembedding},
                   {logits},
                   2.0 * static_cast<double>(D * V),
                   [=](const OpContext& c) {
                     c.kernels->unembed_logits(c.f32(logits), c.f32(hidden), c.f32(unembedding), layout, 1, D,
                                               V, V_valid);
                   },
                   OpKind::matmul});
}

}  // namespace

void add_final_norm_and_loss(SpecBuilder& builder, NormKind norm, BufferId residual, BufferId tied_table,
                             BufferId d_residual) {
  const ModelDims& m = builder.dims();
  ModelSpec& spec = builder.spec();
  const int64_t N = m.N, D = m.D, V = m.V, V_valid = m.V_valid;
  const Shape width_shape = token_shape(m, {{"embed", D}});
  const BufferId d_hidden = builder.gradient_scratch("scratch/d_normed", width_shape);
  const NormLayer final_norm = add_norm(builder, "decoder/decoder_norm", norm, residual, width_shape, N, D,
                                        d_hidden, d_residual, false);
  spec.final_hidden = final_norm.out;

  BufferId unembedding = tied_table;
  auto layout = kernels::UnembedLayout::table_VD;
  if (tied_table == kNoBuffer) {
    unembedding = builder.parameter("decoder/logits_dense/kernel", shape_of({{"embed", D}, {"vocab", V}}),
                                    {"unembedding", ParameterInit::normal, 0.02, ParameterRole::head});
    layout = kernels::UnembedLayout::kernel_DV;
  }
  if (builder.decoding()) {
    add_decode_logits(builder, final_norm.out, unembedding, layout);
    return;
  }
  const BufferId d_unembedding = builder.gradient_of(unembedding);
  const int64_t chunk_tokens = kernels::cross_entropy_chunk_tokens(N, V);
  const BufferId logits_scratch = builder.scratch(
      "scratch/cross_entropy",
      shape_of({{"floats", builder.kernels().cross_entropy_scratch_floats(chunk_tokens, V)}}));
  const BufferId bf16_inputs =
      builder.bf16_inputs_scratch("scratch/cross_entropy_bf16_inputs",
                                  builder.kernels().cross_entropy_bf16_scratch_elements(N, chunk_tokens, D, V));
  const BufferId hidden = final_norm.out, targets = spec.targets, loss_mask = spec.loss_mask;
  const double z_loss_multiplier = spec.options.loss.z_loss_multiplier;
  // The GEMMs' FLOPs: the softmax's per-logit work is not priced, nor the z-loss's few per token.
  const double flops = 2.0 * static_cast<double>(N * D * V);
  const VocabParallelLoss vocab_parallel =
      vocab_parallel_loss(builder, table_shard(builder, "vocab", V_valid), N);
  const auto loss_op = [=](bool with_gradient) {
    std::vector<BufferId> writes = with_gradient
                                       ? std::vector<BufferId>{d_hidden, d_unembedding, logits_scratch}
                                       : std::vector<BufferId>{logits_scratch};
    if (bf16_inputs != kNoBuffer) writes.push_back(bf16_inputs);
    return OpDecl{
        with_gradient ? "loss/forward_backward" : "loss/forward",
        {hidden, unembedding, targets, loss_mask},
        writes,
        with_gradient ? 3.0 * flops : flops,
        [=](const OpContext& c) {
          const std::optional<kernels::VocabParallel> reductions = vocab_parallel.loss_reductions(c);
          const kernels::CrossEntropySums sums = c.kernels->unembed_cross_entropy(
              with_gradient ? c.f32(d_hidden) : nullptr, with_gradient ? c.f32(d_unembedding) : nullptr,
              c.f32(hidden), c.f32(unembedding), layout, c.i32(targets), c.u8(loss_mask), N, D, V, V_valid,
              z_loss_multiplier, chunk_tokens, c.f32(logits_scratch), reductions ? &*reductions : nullptr,
              c.bf16(bf16_inputs));
          c.loss_sums->loss_sum += sums.loss_sum;
          c.loss_sums->z_loss_sum += sums.z_loss_sum;
          c.loss_sums->valid_count += sums.valid_count;
        },
        OpKind::loss};
  };
  std::vector<OpDecl> eval_ops = vocab_parallel.statistics, train_ops = vocab_parallel.statistics;
  eval_ops.push_back(loss_op(false));
  train_ops.push_back(loss_op(true));
  for (OpDecl& op : hidden_gradient_reduction(builder, d_hidden)) train_ops.push_back(std::move(op));
  train_ops.push_back(final_norm.backward);
  builder.loss(std::move(eval_ops), std::move(train_ops));
}

}  // namespace meshtrain
