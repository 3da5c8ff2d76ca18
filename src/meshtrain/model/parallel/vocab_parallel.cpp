#include "meshtrain/model/parallel/vocab_parallel.h"

#include "meshtrain/model/parallel/collective_ops.h"

namespace meshtrain {

TableShard table_shard(const SpecBuilder& builder, const std::string& logical_axis, int64_t rows) {
  const int64_t degree = builder.spec().sharding.compute(logical_axis).degree;
  TableShard shard;
  shard.rows = padded_vocab_size(rows, degree) / degree;
  shard.global_rows = shard.rows * degree;
  shard.split = degree > 1;
  return shard;
}

std::vector<OpDecl> table_lookup_reduction(const SpecBuilder& builder, const std::string& name,
                                           BufferId lookup) {
  return collective_ops(builder, name, CollectiveKind::all_reduce, MeshAxis::tensor, lookup);
}

VocabParallelLoss vocab_parallel_loss(SpecBuilder& builder, const TableShard& vocab, int64_t N) {
  VocabParallelLoss loss{vocab, {}};
  if (!vocab.split) return loss;
  const BufferId statistics = builder.scratch("scratch/vocab_parallel_stats", shape_of({{"rows", 5 * N}}));
  loss.statistics = collective_ops(builder, "loss/reduce_vocab_statistics", CollectiveKind::all_reduce,
                                   MeshAxis::tensor, statistics);
  for (OpDecl& op : loss.statistics) op.collective.inside_next_op = true;
  return loss;
}

std::optional<kernels::VocabParallel> VocabParallelLoss::loss_reductions(const OpContext& context) const {
  if (!vocab.split || !context.tensor) return std::nullopt;
  return kernels::VocabParallel{vocab.row_offset(context), context.tensor->all_reduce_max,
                                context.tensor->all_reduce_sum};
}

std::vector<OpDecl> hidden_gradient_reduction(const SpecBuilder& builder, BufferId d_hidden) {
  return collective_ops(builder, "loss/reduce_hidden_gradient", CollectiveKind::all_reduce, MeshAxis::tensor,
                        d_hidden);
}

}  // namespace meshtrain
