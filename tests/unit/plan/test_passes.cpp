// The planner's passes one at a time (passes.h): storage, remat, FSDP insertion, reductions and update,
// liveness and cost, each on a small plan or on hand-made steps.
#include <gtest/gtest.h>

#include "meshtrain/core/arena.h"
#include "meshtrain/plan/passes.h"
#include "meshtrain/plan/topology.h"
#include "tiny_plan.h"

namespace meshtrain {
namespace {

TEST(PlanStorage, FsdpShardsPersistAndTheRegionTilesWithoutOverlap) {
  const TrainingPlan plan = testing::tiny_plan({"mesh.fsdp=2"});
  ASSERT_EQ(plan.storage.size(), plan.spec.parameters.size());
  for (size_t k = 0; k < plan.storage.size(); ++k) {
    const ParameterStorage& store = plan.storage[k];
    const ParameterDecl& parameter = plan.spec.parameters[k];
    ASSERT_TRUE(store.gathered) << parameter.canonical_name;
    const PlanBuffer& shard = plan.buffers[static_cast<size_t>(store.value_store)];
    EXPECT_TRUE(shard.persistent);
    EXPECT_FALSE(plan.buffers[static_cast<size_t>(parameter.value)].persistent);
    EXPECT_EQ(2 * shard.shape.elements(), plan.spec.buffer(parameter.value).shape.elements());
  }
  std::vector<std::pair<size_t, size_t>> regions;
  size_t total = 0;
  for (const PlanBuffer& buffer : plan.buffers) {
    if (!buffer.persistent) continue;
    EXPECT_EQ(buffer.offset % kArenaAlignment, 0u) << buffer.name;
    regions.emplace_back(buffer.offset, buffer.offset + align_up(buffer.bytes));
    total += align_up(buffer.bytes);
  }
  std::sort(regions.begin(), regions.end());
  for (size_t i = 1; i < regions.size(); ++i) EXPECT_LE(regions[i - 1].second, regions[i].first);
  EXPECT_EQ(plan.persistent_bytes, total);
}

TEST(PlanRemat, RecomputedOpsAreForwardOpsBeforeTheirBlocksBackward) {
  const TrainingPlan none = testing::tiny_plan();
  const std::vector<PlanStep> plain = backward_with_recompute(none.spec);
  ASSERT_EQ(plain.size(), none.spec.loss_backward.size());
  for (const PlanStep& step : plain) EXPECT_FALSE(step.recompute);

  const TrainingPlan full = testing::tiny_plan({"remat_policy=full"});
  const ModelSpec& spec = full.spec;
  const std::vector<PlanStep> steps = backward_with_recompute(spec);
  size_t recomputed = 0, backward = 0;
  for (const PlanStep& step : steps) {
    if (!step.recompute) {
      EXPECT_EQ(step.op, &spec.loss_backward[backward++]);
      continue;
    }
    ++recomputed;
    // A recomputed op belongs to the block whose backward comes next.
    const auto block = std::find_if(spec.blocks.begin(), spec.blocks.end(),
                                    [&](const LayerBlock& b) { return b.backward_begin == backward; });
    ASSERT_NE(block, spec.blocks.end());
    EXPECT_GE(step.op, &spec.forward[block->forward_begin]);
    EXPECT_LT(step.op, &spec.forward[0] + block->forward_end);
  }
  EXPECT_EQ(backward, spec.loss_backward.size());
  EXPECT_GT(recomputed, 0u);
}

TEST(PlanFsdp, GathersPrecedeTheFirstReaderOnce) {
  TrainingPlan plan = testing::tiny_plan({"mesh.fsdp=2"});
  std::vector<const OpDecl*> forward;
  for (const OpDecl& op : plan.spec.forward) forward.push_back(&op);
  const std::vector<PlanStep> steps =
      insert_fsdp(plan, {forward}, {std::vector<bool>(forward.size(), false)}, false).front();
  std::set<int32_t> gathered;
  for (size_t i = 0; i < steps.size(); ++i) {
    const OpDecl& op = *steps[i].op;
    if (op.role == OpRole::fsdp_gather) {
      EXPECT_TRUE(gathered.insert(op.parameter).second) << op.name;
      continue;
    }
    EXPECT_NE(op.role, OpRole::fsdp_reduce_scatter);  // no gradients asked for
    for (size_t k = 0; k < plan.spec.parameters.size(); ++k) {
      if (contains(op.reads, plan.spec.parameters[k].value)) {
        EXPECT_TRUE(gathered.count(static_cast<int32_t>(k))) << op.name << " reads before its gather";
      }
    }
  }
  EXPECT_EQ(steps.size(), forward.size() + gathered.size());
}

TEST(PlanReductions, EachGradientIsReducedBeforeItsNorm) {
  for (bool zero1 : {false, true}) {
    TrainingPlan plan = testing::tiny_plan(
        {"mesh.data=2", std::string("shard_optimizer_over_data=") + (zero1 ? "true" : "false")});
    const OpRole reduction = zero1 ? OpRole::zero1_reduce_scatter : OpRole::data_gradient_reduction;
    std::set<int32_t> reduced, gathered;
    for (const PlanStep& step : update_steps(plan)) {
      const OpDecl& op = *step.op;
      if (op.role == reduction) reduced.insert(op.parameter);
      if (op.role == OpRole::zero1_all_gather) gathered.insert(op.parameter);
      if (op.role == OpRole::grad_norm || op.role == OpRole::adamw) {
        EXPECT_TRUE(reduced.count(op.parameter)) << op.name;
        // ZeRO-1 binds the update to this rank's data shard.
        const ParameterStorage& store = plan.storage[static_cast<size_t>(op.parameter)];
        const BufferId gradient = plan.spec.parameters[static_cast<size_t>(op.parameter)].gradient;
        for (const auto& [spec_id, plan_id] : step.buffers) {
          if (spec_id == gradient) {
            EXPECT_EQ(plan_id, zero1 ? store.gradient_data_shard : store.gradient_store);
          }
        }
      }
    }
    EXPECT_EQ(reduced.size(), plan.spec.parameters.size());
    EXPECT_EQ(gathered.size(), zero1 ? plan.spec.parameters.size() : 0u);
  }
}

TEST(PlanLiveness, AWriteThatDoesNotReadStartsANewValue) {
  const TrainingPlan plan = testing::tiny_plan();
  BufferId scratch = kNoBuffer;
  for (size_t id = 0; id < plan.spec.buffers.size() && scratch == kNoBuffer; ++id) {
    if (plan.spec.buffers[id].kind == BufferKind::activation) scratch = static_cast<BufferId>(id);
  }
  ASSERT_NE(scratch, kNoBuffer);
  const OpDecl write{"write", {}, {scratch}, 0.0, nullptr};
  const OpDecl read{"read", {scratch}, {}, 0.0, nullptr};
  const OpDecl update{"update", {scratch}, {scratch}, 0.0, nullptr};
  const std::vector<PlanStep> steps = {step_of(&write),  step_of(&read), step_of(&write),
                                       step_of(&update), step_of(&read), step_of(&plan.spec.forward[0])};
  const Liveness liveness = plan_liveness(plan, steps, KernelName::eval);
  ASSERT_GE(liveness.values.size(), 2u);
  EXPECT_EQ(liveness.values[0].buffer, scratch);
  EXPECT_EQ(liveness.values[0].first_op, 0);
  EXPECT_EQ(liveness.values[0].last_op, 1);
  EXPECT_EQ(liveness.values[1].first_op, 2);
  EXPECT_EQ(liveness.values[1].last_op, 4);
  EXPECT_EQ(liveness.value_of_step[3], (std::vector<size_t>{1}));
  // The tokens the embedding reads persist: no value.
  for (size_t b = 0; b < steps[5].buffers.size(); ++b) {
    if (steps[5].buffers[b].first == plan.spec.tokens) {
      EXPECT_EQ(liveness.value_of_step[5][b], Liveness::kPersistent);
    }
  }
  const OpDecl orphan{"orphan_read", {scratch}, {}, 0.0, nullptr};
  EXPECT_THROW(plan_liveness(plan, {step_of(&orphan)}, KernelName::eval), std::exception);
}

TEST(PlanCost, CollectivePayloadsFollowAotPlanAndKernelTotalsAddUp) {
  EXPECT_EQ(collective_payload_bytes(CollectiveKind::all_reduce, 800.0, 4.0), 1200.0);
  EXPECT_EQ(collective_payload_bytes(CollectiveKind::all_gather, 800.0, 4.0), 600.0);
  EXPECT_EQ(collective_payload_bytes(CollectiveKind::reduce_scatter, 800.0, 2.0), 400.0);
  EXPECT_EQ(collective_payload_bytes(CollectiveKind::send_recv, 800.0, 2.0), 800.0);
  const TrainingPlan plan = testing::tiny_plan({"mesh.data=2"});
  for (const KernelPlan& kernel : plan.kernels) {
    double flops = 0.0, seconds = 0.0, data = 0.0;
    for (const PlanOp& op : kernel.ops) {
      flops += op.flops;
      seconds += op.seconds;
      if (op.op->kind == OpKind::collective && op.op->collective.axis == MeshAxis::data)
        data += op.collective_bytes;
      EXPECT_GE(op.seconds, 0.0) << op.op->name;
    }
    EXPECT_EQ(kernel.flops, flops);
    EXPECT_EQ(kernel.seconds, seconds);
    EXPECT_EQ(kernel.collective_bytes.count("data") ? kernel.collective_bytes.at("data") : 0.0, data);
    const MemoryFigures& memory = kernel.memory;
    EXPECT_EQ(memory.peak, memory.arguments + memory.outputs + memory.temps - memory.aliases);
  }
}

// Each op kind at the rate it runs at (a hand-made topology, a memory bandwidth no op is bound by): dense
// matmuls at the compute dtype's matmul rate, attention at the attention rate, the cross-entropy's GEMMs at
// the matmul rate plus its N x V logits once per GEMM pass (1 in eval, 3 with the gradient) at the softmax
// rate, elementwise ops' bytes at their own bandwidth. Two ranks on the cpu host share its rates.
TEST(PlanCost, EachOpKindRunsAtItsRate) {
  for (const std::string dtype : {"float32", "bfloat16"}) {
    for (const int64_t ranks : {1, 2}) {
      SCOPED_TRACE(dtype + ", " + std::to_string(ranks) + " ranks");
      TrainingPlan plan = testing::tiny_plan({"dtype=" + dtype, "mesh.data=" + std::to_string(ranks)});
      const bool bf16 = plan.spec.config.dtype == DType::bf16;
      Topology& topology = plan.topology;
      ASSERT_TRUE(topology.host_memory_shared);
      topology.float32.peak_flops = 3e12;
      topology.bfloat16.peak_flops = 12e12;
      topology.float32.matmul_flops = 2e12;
      topology.bfloat16.matmul_flops = 7e12;
      topology.float32.attention_flops = 0.5e12;
      topology.bfloat16.attention_flops = 0.8e12;
      topology.float32.loss_softmax_logits = 2e9;
      topology.bfloat16.loss_softmax_logits = 4e9;
      topology.memory_bandwidth = 1e30;
      topology.float32.elementwise_bandwidth = 1e6;  // slow enough that every elementwise op is bound by it
      topology.bfloat16.elementwise_bandwidth = 2e6;
      const double share = static_cast<double>(ranks);
      const double matmul = (bf16 ? 7e12 : 2e12) / share, attention = (bf16 ? 0.8e12 : 0.5e12) / share;
      const double softmax = (bf16 ? 4e9 : 2e9) / share, elementwise = (bf16 ? 2e6 : 1e6) / share;
      const double logits = static_cast<double>(plan.spec.dims.N * plan.spec.dims.V);
      for (KernelPlan& kernel : plan.kernels) {
        SCOPED_TRACE(kernel_name(kernel.kernel));
        cost_kernel(plan, kernel);
        int64_t matmuls = 0, attentions = 0, cross_entropies = 0, elementwise_ops = 0;
        for (const PlanOp& op : kernel.ops) {
          if (op.op->kind == OpKind::matmul) {
            ++matmuls;
            EXPECT_DOUBLE_EQ(op.seconds, op.flops / matmul) << op.op->name;
          } else if (op.op->kind == OpKind::attention) {
            ++attentions;
            EXPECT_DOUBLE_EQ(op.seconds, op.flops / attention) << op.op->name;
          } else if (op.op->kind == OpKind::loss) {
            ++cross_entropies;
            const double passes = kernel.kernel == KernelName::eval ? 1.0 : 3.0;
            EXPECT_DOUBLE_EQ(op.seconds, op.flops / matmul + passes * logits / softmax) << op.op->name;
          } else if (op.op->kind == OpKind::elementwise) {
            ++elementwise_ops;
            EXPECT_DOUBLE_EQ(op.seconds, op.bytes_accessed / elementwise) << op.op->name;
          }
        }
        const bool runs_the_model = kernel.kernel != KernelName::update;
        EXPECT_EQ(matmuls > 0, runs_the_model);
        EXPECT_EQ(attentions > 0, runs_the_model);
        EXPECT_EQ(cross_entropies, runs_the_model ? 1 : 0);
        EXPECT_EQ(elementwise_ops > 0, runs_the_model);
      }
    }
  }
}

// zero_bubble's split on hand-made steps: a weight op moves to W unless an input op after it touches the same
// persistent gradient (their sum's order would change); an op reading what a moved weight op wrote moves too;
// a weight op reading a value a later input op adds into reads a copy.
TEST(PlanBackwardSplit, WeightOpsMoveUnlessTheyWouldPassAnInputOpOnTheirMemory) {
  TrainingPlan plan;
  const auto add_buffer = [&](const std::string& name, bool persistent, size_t offset) {
    PlanBuffer buffer{name,
                      persistent ? BufferKind::gradient : BufferKind::scratch,
                      DType::f32,
                      shape_of({{"floats", 16}}),
                      {}};
    buffer.bytes = 64;
    buffer.persistent = persistent;
    buffer.offset = offset;
    plan.buffers.push_back(buffer);
    return static_cast<BufferId>(plan.buffers.size() - 1);
  };
  const BufferId d = add_buffer("d", false, 0), tied = add_buffer("tied", true, 0),
                 own = add_buffer("own", true, 64), e = add_buffer("e", false, 0),
                 shard = add_buffer("shard", true, 128);
  const auto op = [](const std::string& name, std::vector<BufferId> reads, std::vector<BufferId> writes,
                     bool weight) {
    OpDecl decl{name, std::move(reads), std::move(writes), 0.0, nullptr};
    decl.weight_gradients_only = weight;
    return decl;
  };
  const std::vector<OpDecl> ops = {
      op("writes d", {}, {d}, false),
      op("weight into tied", {d}, {tied}, true),  // the input op below adds into tied after it: stays
      op("input into tied", {d, tied}, {tied}, false),
      op("weight into own", {d}, {own}, true),  // moves; d changes after it: reads a copy
      op("adds into d", {d}, {d}, false),
      op("weight into e", {d}, {e}, true),
      op("reads e", {e, shard}, {shard}, false),  // reads what a moved weight op wrote: moves
  };
  std::vector<PlanStep> steps;
  for (const OpDecl& decl : ops) steps.push_back(step_of(&decl));
  const Liveness liveness = plan_liveness(plan, steps, KernelName::backward);
  const BackwardSplit split = split_backward(plan, steps, 0, liveness);
  EXPECT_EQ(split.weight, (std::vector<bool>{false, false, false, true, false, true, true}));
  EXPECT_EQ(split.captures, (std::vector<std::pair<size_t, size_t>>{{3, 0}}));
}

}  // namespace
}  // namespace meshtrain
