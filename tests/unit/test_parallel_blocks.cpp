// The parallel building blocks (model/parallel/): they declare a collective only where its mesh axis has
// ranks, place a table's rows by tensor rank, and reach the other ranks at run time only through the
// runtime's interfaces (kernels/collectives.h).
#include <gtest/gtest.h>

#include <vector>

#include "meshtrain/config/config.h"
#include "meshtrain/model/parallel/linear.h"
#include "meshtrain/model/parallel/vocab_parallel.h"
#include "meshtrain/model/spec_builder.h"

namespace meshtrain {
namespace {

// An empty spec over `mesh`, for blocks called by hand.
ModelSpec spec_over(const Mesh& mesh) {
  ModelSpec spec;
  spec.config = load_config("qwen3-tiny", {});
  spec.kernels = &kernels::kernel_backend_for_device("cpu");
  spec.sharding = ShardingLayout(spec.config.logical_axis_rules, mesh);
  spec.dims.B = spec.dims.S = spec.dims.N = 1;
  return spec;
}

// An op's view of the run with a tensor group and no buffers.
class TensorRankContext : public OpContext {
 public:
  TensorView view(BufferId) const override { return {}; }
};

TEST(ParallelBlocks, ColumnParallelInputGradientIsAnAllReduceOnlyOverTensorRanks) {
  ModelSpec single = spec_over(Mesh{});
  SpecBuilder single_builder(single);
  const BufferId single_gradient = single_builder.scratch("scratch/d_x", shape_of({{"embed", 8}}));
  EXPECT_TRUE(column_parallel_input_gradient(single_builder, "reduce", single_gradient).empty());

  ModelSpec split = spec_over(Mesh({{MeshAxis::tensor, 2}}));
  SpecBuilder builder(split);
  const BufferId gradient = builder.scratch("scratch/d_x", shape_of({{"embed", 8}}));
  const std::vector<OpDecl> ops = column_parallel_input_gradient(builder, "reduce", gradient);
  ASSERT_EQ(ops.size(), 1u);
  EXPECT_EQ(ops[0].kind, OpKind::collective);
  EXPECT_EQ(ops[0].collective.kind, CollectiveKind::all_reduce);
  EXPECT_EQ(ops[0].collective.axis, MeshAxis::tensor);
  EXPECT_EQ(ops[0].collective.group, 2);
  EXPECT_EQ(ops[0].reads, std::vector<BufferId>{gradient});
  EXPECT_EQ(ops[0].writes, std::vector<BufferId>{gradient});
}

TEST(ParallelBlocks, TableShardPlacesRowsByTensorRank) {
  ModelSpec spec = spec_over(Mesh({{MeshAxis::tensor, 4}}));
  const SpecBuilder builder(spec);
  const TableShard shard = table_shard(builder, "vocab", 1000);
  EXPECT_TRUE(shard.split);
  EXPECT_EQ(shard.rows, 256);  // 1000 padded to 1024 (a multiple of 128 and of 4)
  EXPECT_EQ(shard.global_rows, 1024);
  TensorRankContext context;
  EXPECT_EQ(shard.row_offset(context), 0);  // no tensor group: the whole table
  EXPECT_TRUE(shard.first_rank(context));
  kernels::TensorGroup group;
  group.rank = 2;
  group.size = 4;
  context.tensor = &group;
  EXPECT_EQ(shard.row_offset(context), 512);
  EXPECT_FALSE(shard.first_rank(context));
}

TEST(ParallelBlocks, VocabParallelLossCountsItsTrafficAndCallsTheRuntimeGroup) {
  ModelSpec spec = spec_over(Mesh({{MeshAxis::tensor, 2}}));
  SpecBuilder builder(spec);
  const VocabParallelLoss loss = vocab_parallel_loss(builder, table_shard(builder, "vocab", 256), 3);
  ASSERT_EQ(loss.statistics.size(), 1u);
  EXPECT_TRUE(loss.statistics[0].collective.inside_next_op);
  EXPECT_EQ(spec.buffer(loss.statistics[0].collective.buffer).shape.elements(), 15);  // 5 floats a token

  std::vector<int64_t> max_counts, sum_counts;
  kernels::TensorGroup group;
  group.rank = 1;
  group.size = 2;
  group.all_reduce_max = [&](float*, int64_t count) { max_counts.push_back(count); };
  group.all_reduce_sum = [&](double*, int64_t count) { sum_counts.push_back(count); };
  TensorRankContext context;
  EXPECT_FALSE(loss.loss_reductions(context).has_value());  // no tensor group at run time
  context.tensor = &group;
  const std::optional<kernels::VocabParallel> reductions = loss.loss_reductions(context);
  ASSERT_TRUE(reductions.has_value());
  EXPECT_EQ(reductions->vocab_offset, 128);
  reductions->all_reduce_max(nullptr, 7);
  reductions->all_reduce_sum(nullptr, 14);
  EXPECT_EQ(max_counts, std::vector<int64_t>{7});
  EXPECT_EQ(sum_counts, std::vector<int64_t>{14});
}

}  // namespace
}  // namespace meshtrain
