// Stacked layers (shared/specs/layers-and-checkpoints.md, "Segments and scan groups"): scan_layers stores
// each scan group's parameters as one tensor with a layer axis, never changing the math. Every rule of the
// spec's list has a case here: the names and shapes of both layouts, a group of one layer, 0-d and 1-d
// parameters, non-parameter buffers, tied and shared parameters, the sharding entry of the layer axis,
// nothing to stack; and bitwise-equal initial weights, gradients and losses of the two layouts for every
// family (Qwen3, GPT-2, and DeepSeek-style MLA + MoE with Engram and mHC).
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <set>

#include "meshtrain/checkpoint/checkpoint_layout.h"
#include "meshtrain/config/config.h"
#include "meshtrain/core/error.h"
#include "meshtrain/kernels/backend.h"
#include "meshtrain/model/segments.h"
#include "meshtrain/model/spec.h"
#include "meshtrain/model/spec_builder.h"
#include "meshtrain/optim/optimizer.h"
#include "meshtrain/plan/plan.h"
#include "meshtrain/runtime/engine.h"
#include "meshtrain/train/run.h"
#include "tiny_batch.h"

namespace meshtrain {
namespace {

std::vector<std::string> with(std::vector<std::string> overrides, const std::vector<std::string>& extra) {
  for (const std::string& item : extra) {  // an extra key replaces the default
    const std::string key = item.substr(0, item.find('=') + 1);
    std::erase_if(overrides, [&](const std::string& existing) { return existing.starts_with(key); });
    overrides.push_back(item);
  }
  return overrides;
}

Config qwen3(const std::vector<std::string>& extra = {}) {
  return load_config("qwen3-tiny",
                     with({"base_emb_dim=32", "base_num_query_heads=4", "base_num_kv_heads=2", "head_dim=8",
                           "base_mlp_dim=48", "base_num_decoder_layers=3", "vocab_size=100",
                           "max_target_length=8", "per_device_batch_size=2", "init_weights_seed=3"},
                          extra));
}

Config gpt2(const std::vector<std::string>& extra = {}) {
  return load_config("gpt2-124m", with({"base_emb_dim=32", "base_num_query_heads=4", "base_num_kv_heads=4",
                                        "head_dim=8", "base_mlp_dim=48", "base_num_decoder_layers=3",
                                        "vocab_size=100", "max_target_length=8", "max_position_embeddings=16",
                                        "per_device_batch_size=2", "init_weights_seed=3"},
                                       extra));
}

// The spec's example shape: 6 layers, layer 0 dense, Engram on layers 1 and 4, the rest MoE, with MLA,
// a selection bias and 2 mHC streams.
Config deepseek(const std::vector<std::string>& extra = {}) {
  return load_config("deepseek-tiny", with({"base_emb_dim=32",
                                            "base_num_query_heads=4",
                                            "base_num_kv_heads=4",
                                            "base_mlp_dim=48",
                                            "base_num_decoder_layers=6",
                                            "vocab_size=100",
                                            "max_target_length=8",
                                            "per_device_batch_size=2",
                                            "init_weights_seed=3",
                                            "q_lora_rank=12",
                                            "kv_lora_rank=10",
                                            "qk_nope_head_dim=6",
                                            "qk_rope_head_dim=4",
                                            "v_head_dim=8",
                                            "num_experts=4",
                                            "num_experts_per_tok=2",
                                            "base_moe_mlp_dim=12",
                                            "first_num_dense_layers=1",
                                            "routed_score_func=sigmoid",
                                            "norm_topk_prob=true",
                                            "routed_bias=true",
                                            "engram_layers=[1,4]",
                                            "engram_num_heads=2",
                                            "engram_head_dim=4",
                                            "engram_vocab_bases=[31,37]",
                                            "engram_kernel_size=2",
                                            "mhc_expansion_rate=2"},
                                           extra));
}

Config scanned(Config config, bool scan) {
  config.set("scan_layers", scan ? "true" : "false");
  return config;
}

std::map<std::string, Shape> parameter_shapes(const ModelSpec& spec) {
  std::map<std::string, Shape> shapes;
  for (const ParameterDecl& parameter : spec.parameters)
    shapes[spec.buffer(parameter.value).name] = spec.buffer(parameter.value).shape;
  return shapes;
}

TEST(Scan, StackedNamesAndShapes) {
  const ModelSpec per_layer = build_model_spec(qwen3());
  ModelSpec stacked = build_model_spec(scanned(qwen3(), true));
  const OptimizerDecl optimizer = apply_optimizer(stacked, stacked.config);
  const std::map<std::string, Shape> shapes = parameter_shapes(stacked);
  ASSERT_TRUE(shapes.contains("decoder/layers/mlp/wo/kernel"));
  EXPECT_EQ(shapes.at("decoder/layers/mlp/wo/kernel").dims, (std::vector<int64_t>{3, 48, 32}));
  EXPECT_EQ(shapes.at("decoder/layers/mlp/wo/kernel").axes.front(), "layers");
  // 1-d parameters stack like any other: a norm [D] is [L, D] in memory.
  EXPECT_EQ(shapes.at("decoder/layers/pre_self_attention_layer_norm/scale").dims,
            (std::vector<int64_t>{3, 32}));
  for (const auto& [name, shape] : shapes) EXPECT_FALSE(name.starts_with("decoder/layers_")) << name;
  // Tied embeddings and the final norm stay one tensor; every element is there once.
  EXPECT_TRUE(shapes.contains("token_embedder/embedding"));
  EXPECT_TRUE(shapes.contains("decoder/decoder_norm/scale"));
  EXPECT_EQ(stacked.parameter_count(), per_layer.parameter_count());
  EXPECT_EQ(stacked.parameters.size(), 3 + (per_layer.parameters.size() - 3) / 3);
  // Members in layer order, each with its per-layer canonical name (its init stream) and norm slot.
  std::set<int32_t> slots;
  for (size_t p = 0; p < stacked.parameters.size(); ++p) {
    const ParameterDecl& parameter = stacked.parameters[p];
    if (!parameter.stacked()) {
      slots.insert(parameter.norm_slot);
      continue;
    }
    ASSERT_EQ(parameter.members.size(), 3u);
    for (size_t i = 0; i < 3; ++i) {
      const ParameterDecl::Member& member = parameter.members[i];
      EXPECT_EQ(member.canonical_name.substr(0, 16), "decoder/layers_" + std::to_string(i));
      EXPECT_EQ(stacked.buffer(member.value).stack, parameter.value);
      EXPECT_EQ(stacked.buffer(member.value).stack_index, static_cast<int64_t>(i));
      EXPECT_EQ(stacked.buffer(member.gradient).stack, parameter.gradient);
      slots.insert(member.norm_slot);
    }
    for (BufferId moment : optimizer.state(p).moments)  // the optimizer's state is stacked like its parameter
      EXPECT_EQ(stacked.buffer(moment).shape, stacked.buffer(parameter.value).shape);
  }
  EXPECT_EQ(slots.size(), per_layer.parameters.size());  // one slot per per-layer parameter
  EXPECT_EQ(stacked.norm_slots, static_cast<int32_t>(per_layer.parameters.size()));
}

TEST(Scan, NonParameterBuffersAreTheSameInBothLayouts) {
  for (const Config& config : {qwen3(), deepseek()}) {
    const ModelSpec per_layer = build_model_spec(config);
    const ModelSpec stacked = build_model_spec(scanned(config, true));
    std::map<std::string, Shape> a, b;
    for (const BufferDecl& buffer : per_layer.buffers) {
      if (buffer.kind != BufferKind::optimizer_state && buffer.stack == kNoBuffer)
        a[buffer.name] = buffer.shape;
    }
    for (const BufferDecl& buffer : stacked.buffers) {
      // Activations, scratch, caches, inputs (and Engram's per-layer tables) are the per-layer layout's.
      if (buffer.kind == BufferKind::parameter || buffer.kind == BufferKind::gradient ||
          buffer.kind == BufferKind::optimizer_state)
        continue;
      EXPECT_TRUE(a.contains(buffer.name)) << buffer.name;
      b[buffer.name] = buffer.shape;
    }
    for (const auto& [name, shape] : a) {
      const bool parameter_or_gradient =
          per_layer
                  .buffers[static_cast<size_t>(
                      std::find_if(per_layer.buffers.begin(), per_layer.buffers.end(),
                                   [&](const BufferDecl& x) { return x.name == name; }) -
                      per_layer.buffers.begin())]
                  .kind == BufferKind::parameter ||
          name.starts_with("grad/");
      if (parameter_or_gradient) continue;
      ASSERT_TRUE(b.contains(name)) << name << " dropped by stacking";
      EXPECT_EQ(b.at(name), shape) << name;
    }
    // The layers' ops are the same ops over the same buffer names.
    ASSERT_EQ(stacked.forward.size(), per_layer.forward.size());
    for (size_t i = 0; i < stacked.forward.size(); ++i)
      EXPECT_EQ(stacked.forward[i].name, per_layer.forward[i].name);
  }
}

TEST(Scan, GroupsOfEveryKindAndSingleLayers) {
  const ModelSpec stacked = build_model_spec(scanned(deepseek(), true));
  const std::map<std::string, Shape> shapes = parameter_shapes(stacked);
  // dense 0..0 | moe+engram 1 | moe 2..3 | moe+engram 4 | moe 5..5: a group of one layer is still stacked.
  EXPECT_EQ(segments_text(decoder_segments(stacked.config)),
            "dense 0..0 | moe+engram 1 | moe 2..3 | moe+engram 4 | moe 5..5");
  int groups_of_one = 0, moe_pairs = 0, engram_single = 0;
  for (const auto& [name, shape] : shapes) {
    if (name.starts_with("decoder/dense_layers/") || name.starts_with("decoder/moe_layers_at_5/")) {
      EXPECT_EQ(shape.dims.front(), 1) << name;
      EXPECT_EQ(shape.axes.front(), "layers") << name;
      ++groups_of_one;
    }
    if (name.starts_with("decoder/moe_layers_at_2/")) {
      EXPECT_EQ(shape.dims.front(), 2) << name;
      ++moe_pairs;
    }
    // An Engram layer stands alone: its per-layer names, no layer axis.
    if (name.starts_with("decoder/layers_1/") || name.starts_with("decoder/layers_4/")) {
      EXPECT_NE(shape.axes.front(), "layers") << name;
      ++engram_single;
    }
    EXPECT_FALSE(name.starts_with("decoder/layers_0/") || name.starts_with("decoder/layers_2/")) << name;
  }
  EXPECT_GT(groups_of_one, 0);
  EXPECT_GT(moe_pairs, 0);
  EXPECT_GT(engram_single, 0);
  // The selection biases are the layers' views of a stacked bias.
  for (BufferId bias : stacked.moe_selection_biases) {
    if (bias == kNoBuffer) continue;
    const BufferDecl& decl = stacked.buffer(bias);
    EXPECT_TRUE(decl.stack != kNoBuffer || decl.name.starts_with("decoder/layers_1/") ||
                decl.name.starts_with("decoder/layers_4/"))
        << decl.name;
  }
}

TEST(Scan, NothingToStackIsANoOp) {
  // Engram on every layer: no group at all.
  const Config config = deepseek({"engram_layers=[0,1,2,3,4,5]"});
  EXPECT_EQ(parameter_shapes(build_model_spec(scanned(config, true))),
            parameter_shapes(build_model_spec(config)));
}

// An empty two-layer spec with scan_layers on, for parameters and ops declared by hand.
ModelSpec hand_built_spec() {
  ModelSpec spec;
  spec.config = scanned(qwen3({"base_num_decoder_layers=2"}), true);
  spec.kernels = &kernels::kernel_backend_for_device("cpu");
  spec.sharding = ShardingLayout(spec.config.logical_axis_rules, Mesh{});
  spec.dims.B = spec.dims.S = spec.dims.N = 1;
  return spec;
}

ParameterOptions mlp_options() {
  ParameterOptions options;
  options.component = "mlp";
  return options;
}

TEST(Scan, ASharedParameterInsideAGroupIsRefused) {
  ModelSpec spec = hand_built_spec();
  SpecBuilder builder(spec);
  const ParameterOptions options = mlp_options();
  const BufferId first = builder.parameter("decoder/layers_0/mlp/scale", shape_of({{"embed", 4}}), options);
  const BufferId second = builder.parameter("decoder/layers_1/mlp/scale", shape_of({{"embed", 4}}), options);
  builder.forward({"decoder/layers_0/mlp/forward", {first}, {}, 0.0, nullptr});
  builder.forward({"decoder/layers_1/mlp/forward", {second, first}, {}, 0.0, nullptr});  // layer 1 reads 0's
  try {
    builder.finish();
    FAIL() << "a parameter used by two layers of a group was stacked";
  } catch (const MeshError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("scan_layers"), std::string::npos) << message;
    EXPECT_NE(message.find("decoder/layers_0/mlp/scale is also used by layer(s) 1"), std::string::npos)
        << message;
  }
}

// No family has a 0-d parameter; one declared by hand stacks like any other ([] -> [L]), and its checkpoint
// tensor is [L] whatever param_scan_axis says.
TEST(Scan, ZeroAndOneDimensionalParametersStack) {
  ModelSpec spec = hand_built_spec();
  SpecBuilder builder(spec);
  const ParameterOptions options = mlp_options();
  for (int layer = 0; layer < 2; ++layer) {
    const std::string prefix = "decoder/layers_" + std::to_string(layer) + "/mlp/";
    const BufferId gate = builder.parameter(prefix + "gate", Shape{}, options);
    const BufferId scale = builder.parameter(prefix + "scale", shape_of({{"embed", 4}}), options);
    builder.forward({prefix + "forward", {gate, scale}, {}, 0.0, nullptr});
  }
  builder.finish();
  const OptimizerDecl optimizer = apply_optimizer(spec, spec.config);
  const std::map<std::string, Shape> shapes = parameter_shapes(spec);
  ASSERT_EQ(shapes.size(), 2u);
  EXPECT_EQ(shapes.at("decoder/layers/mlp/gate").dims, (std::vector<int64_t>{2}));
  EXPECT_EQ(shapes.at("decoder/layers/mlp/scale").dims, (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(spec.buffer(optimizer.state(0).moments.at(1)).shape.dims, (std::vector<int64_t>{2}));
  const CheckpointLayout layout(spec.config, true, 1);
  EXPECT_EQ(layout.place("decoder/layers_1/mlp/gate", {}).dims, (std::vector<int64_t>{2}));
  EXPECT_EQ(layout.place("decoder/layers_1/mlp/scale", {4}).dims, (std::vector<int64_t>{4, 2}));
  EXPECT_EQ(layout.place("decoder/layers_1/mlp/gate", {}).index, 1);
}

TEST(Scan, TheLayerAxisIsReplicatedAndFsdpGathersEachLayer) {
  PlanRequest request;
  request.config = scanned(qwen3({"mesh.fsdp=2", "mesh.data=1"}), true);
  request.topology = "cpu";
  request.devices = 2;
  const TrainingPlan plan = plan_training(request);
  bool checked = false;
  for (size_t k = 0; k < plan.spec.parameters.size(); ++k) {
    const ParameterDecl& parameter = plan.spec.parameters[k];
    if (!parameter.stacked() || !plan.storage[k].gathered) continue;
    const PlanBuffer& shard = plan.buffers[static_cast<size_t>(plan.storage[k].value_store)];
    ASSERT_EQ(shard.shape.axes.front(), "layers");
    EXPECT_TRUE(shard.sharding.front().axes.empty()) << shard.name;  // replicated entry for the layer axis
    EXPECT_EQ(shard.shape.dims.front(), 3) << shard.name;
    EXPECT_TRUE(shard.split_over(MeshAxis::fsdp)) << shard.name;
    // Each layer gathers its own block of the shard, once per phase.
    const KernelPlan& fwd_bwd = plan.kernel(KernelName::fwd_bwd);
    for (const ParameterDecl::Member& member : parameter.members) {
      int gathers = 0;
      for (const PlanOp& op : fwd_bwd.ops)
        gathers += op.op->name.starts_with("fsdp/gather/" + member.canonical_name);
      EXPECT_EQ(gathers, 2) << member.canonical_name;
    }
    checked = true;
  }
  EXPECT_TRUE(checked);
}

// A pipeline stage's chunk holds part of a scan group: it stacks the layers it holds under the group's
// name, its members in layer order; a checkpoint places its first member at its offset in the group.
TEST(Scan, AStageChunkStacksTheLayersOfAGroupItHolds) {
  const Config config =
      scanned(deepseek(), true);  // dense 0..0 | moe+engram 1 | moe 2..3 | moe+engram 4 | ...
  const kernels::KernelBackend& cpu = kernels::kernel_backend_for_device("cpu");
  const ModelSpec tail = build_model_spec(config, Mesh{}, cpu, {LayerChunk{3, 5, false, true}});
  const std::map<std::string, Shape> shapes = parameter_shapes(tail);
  int64_t part = 0, engram_layer = 0;  // layer 3 of the group 2..3; layer 4 keeps its per-layer names
  for (const auto& [name, shape] : shapes) {
    if (name.starts_with("decoder/moe_layers_at_2/") || name.starts_with("decoder/moe_layers_at_5/")) {
      EXPECT_EQ(shape.dims.front(), 1) << name;
      EXPECT_EQ(shape.axes.front(), "layers") << name;
      ++part;
    }
    engram_layer += name.starts_with("decoder/layers_4/");
    EXPECT_FALSE(name.starts_with("decoder/dense_layers/") || name.starts_with("decoder/layers_1/") ||
                 name.starts_with("decoder/layers_3/"))
        << name;
  }
  EXPECT_GT(part, 0);
  EXPECT_GT(engram_layer, 0);
  const ModelSpec head = build_model_spec(config, Mesh{}, cpu, {LayerChunk{0, 2, true, false}});
  const CheckpointLayout layout(config, true, 1);
  int64_t checked = 0;
  for (const ModelSpec* spec : {&head, &tail}) {
    for (const ParameterDecl& parameter : spec->parameters) {
      if (!parameter.stacked() || !spec->buffer(parameter.value).name.starts_with("decoder/moe_layers_at_2/"))
        continue;
      ASSERT_EQ(parameter.members.size(), 1u);
      const int64_t layer = spec == &head ? 2 : 3;
      EXPECT_TRUE(parameter.members[0].canonical_name.starts_with("decoder/layers_" + std::to_string(layer)));
      const std::vector<int64_t>& dims = spec->buffer(parameter.value).shape.dims;
      const CheckpointTensorPlace place =
          layout.place(parameter.members[0].canonical_name, {dims.begin() + 1, dims.end()});
      EXPECT_EQ(place.name, spec->buffer(parameter.value).name);
      EXPECT_EQ(place.index, layer - 2);  // the group's layer axis is 2 long in the checkpoint
      EXPECT_EQ(place.dims.at(static_cast<size_t>(place.axis)), 2);
      ++checked;
    }
  }
  EXPECT_GT(checked, 2);
}

TEST(Scan, CheckpointPlacesPutTheLayerAxisAtParamScanAxis) {
  const Config config = deepseek();
  const CheckpointLayout stacked(config, true, 1), first(config, true, 0), far(config, true, 5);
  CheckpointTensorPlace place = stacked.place("decoder/layers_3/mlp/wo/kernel", {48, 32});
  EXPECT_EQ(place.name, "decoder/moe_layers_at_2/mlp/wo/kernel");
  EXPECT_EQ(place.dims, (std::vector<int64_t>{48, 2, 32}));
  EXPECT_EQ(place.index, 1);
  EXPECT_EQ(first.place("adam_m/decoder/layers_3/mlp/wo/kernel", {48, 32}).name,
            "adam_m/decoder/moe_layers_at_2/mlp/wo/kernel");
  EXPECT_EQ(first.place("decoder/layers_3/mlp/wo/kernel", {48, 32}).dims, (std::vector<int64_t>{2, 48, 32}));
  // 1-d and 0-d: the axis goes at min(param_scan_axis, rank).
  EXPECT_EQ(far.place("decoder/layers_0/norm/scale", {32}).dims, (std::vector<int64_t>{32, 1}));
  EXPECT_EQ(stacked.place("decoder/layers_5/scalar", {}).dims, (std::vector<int64_t>{1}));
  // Single layers and parameters outside the layers keep their names; per layer nothing moves.
  EXPECT_EQ(stacked.place("decoder/layers_4/engram/key/kernel", {4, 4}).index, -1);
  EXPECT_EQ(stacked.place("token_embedder/embedding", {128, 32}).name, "token_embedder/embedding");
  EXPECT_EQ(CheckpointLayout(config, false, 1).place("decoder/layers_3/mlp/wo/kernel", {48, 32}).name,
            "decoder/layers_3/mlp/wo/kernel");
}

std::vector<char> bytes_of(const TensorView& view) {
  const char* data = static_cast<const char*>(view.data);
  return {data, data + view.bytes()};
}

// Every per-layer parameter of `a` (per layer) against its view in `b` (stacked): values, or gradients.
void expect_same_tensors(const Engine& a, const Engine& b, bool gradients, const std::string& when) {
  int64_t compared = 0;
  for (const ParameterDecl& parameter : b.spec().parameters) {
    std::vector<std::pair<std::string, BufferId>> pieces;
    if (!parameter.stacked())
      pieces.emplace_back(parameter.canonical_name, gradients ? parameter.gradient : parameter.value);
    for (const ParameterDecl::Member& member : parameter.members)
      pieces.emplace_back(member.canonical_name, gradients ? member.gradient : member.value);
    for (const auto& [name, id] : pieces) {
      const std::optional<size_t> index = a.parameters().find(name);
      ASSERT_TRUE(index.has_value()) << name;
      const ParameterDecl& own = a.parameters().decl(*index);
      EXPECT_EQ(bytes_of(a.view(gradients ? own.gradient : own.value)), bytes_of(b.view(id)))
          << name << (gradients ? " gradient " : " value ") << when;
      ++compared;
    }
  }
  EXPECT_EQ(compared, static_cast<int64_t>(a.spec().parameters.size()));
}

void expect_layouts_train_alike(const Config& config) {
  Engine per_layer(scanned(config, false)), stacked(scanned(config, true));
  ASSERT_NE(per_layer.spec().parameters.size(), stacked.spec().parameters.size());
  expect_same_tensors(per_layer, stacked, false, "at init");
  for (int64_t step = 0; step < 3; ++step) {
    const Batch batch =
        testing::tiny_batch_for(config, per_layer.spec().dims, 40 + static_cast<uint64_t>(step));
    const LossSums a = per_layer.fwd_bwd(batch), b = stacked.fwd_bwd(batch);
    EXPECT_EQ(a.loss_sum, b.loss_sum) << "step " << step;
    EXPECT_EQ(a.routing.expert_load, b.routing.expert_load);
    expect_same_tensors(per_layer, stacked, true, "after fwd_bwd of step " + std::to_string(step));
    const UpdateResult ua = per_layer.update(a.valid_count, 1e-2, step);
    const UpdateResult ub = stacked.update(b.valid_count, 1e-2, step);
    EXPECT_EQ(ua.raw_grad_norm, ub.raw_grad_norm) << "step " << step;
    EXPECT_EQ(ua.grad_norm, ub.grad_norm) << "step " << step;
    if (!a.routing.expert_load.empty()) {
      per_layer.update_selection_biases(a.routing.expert_load, 0.01);
      stacked.update_selection_biases(b.routing.expert_load, 0.01);
    }
    expect_same_tensors(per_layer, stacked, false, "after step " + std::to_string(step));
  }
}

TEST(Scan, Qwen3WithRecomputationLayoutsTrainBitwiseAlike) {
  expect_layouts_train_alike(qwen3({"remat_policy=full"}));
}
TEST(Scan, Qwen3LayoutsTrainBitwiseAlike) {
  expect_layouts_train_alike(qwen3({"gradient_clipping_threshold=0.5"}));
}
// A decay pattern matching one layer of a stack: the stacked update decays that layer's block only.
TEST(Scan, ADecayMaskSplittingAStackTrainsBitwiseAlike) {
  expect_layouts_train_alike(qwen3({"adamw_mask=[layers_1/mlp/wo, layers_0/self_attention/query]"}));
}
TEST(Scan, Gpt2LayoutsTrainBitwiseAlike) {
  expect_layouts_train_alike(gpt2());
}
TEST(Scan, DeepSeekMoeEngramMhcLayoutsTrainBitwiseAlike) {
  expect_layouts_train_alike(deepseek());
}

}  // namespace
}  // namespace meshtrain
