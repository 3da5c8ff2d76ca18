// The optimizer pass (optim/): parameter groups and their decay mask, the state table it declares beside a
// training spec's parameters, and a spec it was not applied to (decode) holding no optimizer state.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "meshtrain/config/config.h"
#include "meshtrain/core/error.h"
#include "meshtrain/model/layers/engram.h"
#include "meshtrain/model/spec.h"
#include "meshtrain/optim/optimizer.h"
#include "plan/tiny_plan.h"

namespace meshtrain {
namespace {

TEST(Optimizer, GroupsGiveEngramTablesTheirMultiplierAndDecay) {
  for (const std::string decay : {"0.0", "0.5"}) {
    const Config config = testing::tiny_deepseek_config(
        {"engram_learning_rate_multiplier=3.0", "engram_weight_decay=" + decay});
    ModelSpec spec = build_model_spec(config);
    const OptimizerDecl optimizer = apply_optimizer(spec, config);
    ASSERT_EQ(optimizer.groups.size(), 2u);
    EXPECT_EQ(optimizer.groups[0].name, "default");
    EXPECT_EQ(optimizer.groups[0].learning_rate_multiplier, 1.0);
    EXPECT_EQ(optimizer.groups[0].weight_decay_rate, config.adam_weight_decay);
    EXPECT_EQ(optimizer.groups[1].name, "engram_tables");
    EXPECT_EQ(optimizer.groups[1].learning_rate_multiplier, 3.0);
    EXPECT_EQ(optimizer.groups[1].weight_decay_rate, std::stod(decay));
    int64_t tables = 0;
    for (size_t p = 0; p < spec.parameters.size(); ++p) {
      const ParameterDecl& parameter = spec.parameters[p];
      const ParameterState& state = optimizer.state(p);
      if (is_engram_table(parameter)) {
        ++tables;
        EXPECT_EQ(state.group, 1u) << parameter.canonical_name;
        // The tables decay only at a rate above zero (the paper's 0: none).
        EXPECT_EQ(state.weight_decay, std::vector<bool>{decay != "0.0"}) << parameter.canonical_name;
        continue;
      }
      EXPECT_EQ(state.group, 0u) << parameter.canonical_name;
      // The default mask: linear maps' weights decay; norms, biases, scales and embeddings do not.
      const bool linear_map = parameter.role != ParameterRole::bias &&
                              parameter.role != ParameterRole::scale &&
                              parameter.role != ParameterRole::embedding;
      EXPECT_EQ(state.weight_decay, std::vector<bool>{linear_map}) << parameter.canonical_name;
      const std::string& name = parameter.canonical_name;
      if (name.ends_with("scale") || name.ends_with("scales") || name.ends_with("bias") ||
          name.ends_with("_beta") || name == "token_embedder/embedding") {
        EXPECT_FALSE(state.weight_decay.at(0)) << name;
      }
      if (name.ends_with("/kernel") || name.find("/routed_experts/") != std::string::npos) {
        EXPECT_TRUE(state.weight_decay.at(0)) << name;
      }
    }
    EXPECT_EQ(tables, 2);
  }
  // Without Engram layers there is one group.
  EXPECT_EQ(parameter_groups(testing::tiny_config()).size(), 1u);
}

// The decay of each tensor by name, as the groups' data gives it under `overrides`: canonical per-layer
// name -> decays.
std::map<std::string, bool> decay_by_name(const std::vector<std::string>& overrides) {
  const Config config = testing::tiny_config(overrides);
  ModelSpec spec = build_model_spec(config);
  const OptimizerDecl optimizer = apply_optimizer(spec, config);
  std::map<std::string, bool> decay;
  for (size_t p = 0; p < spec.parameters.size(); ++p) {
    const ParameterDecl& parameter = spec.parameters[p];
    const std::vector<bool>& flags = optimizer.state(p).weight_decay;
    if (!parameter.stacked()) {
      EXPECT_EQ(flags.size(), 1u) << parameter.canonical_name;
      decay[parameter.canonical_name] = flags.at(0);
    }
    EXPECT_EQ(flags.size(), std::max<size_t>(1, parameter.members.size())) << parameter.canonical_name;
    for (size_t i = 0; i < parameter.members.size(); ++i)
      decay[parameter.members[i].canonical_name] = flags.at(i);
  }
  return decay;
}

TEST(Optimizer, DecayPatternsTakeTensorsOutOfAndIntoTheMaskByName) {
  for (const std::string scan : {"false", "true"}) {
    const std::map<std::string, bool> plain = decay_by_name({"scan_layers=" + scan});
    // The default mask by role: matrices decay; the embedding and the norms' scales do not.
    EXPECT_TRUE(plain.at("decoder/layers_0/mlp/wo/kernel"));
    EXPECT_TRUE(plain.at("decoder/layers_1/self_attention/query/kernel"));
    EXPECT_FALSE(plain.at("token_embedder/embedding"));
    EXPECT_FALSE(plain.at("decoder/layers_0/pre_self_attention_layer_norm/scale"));
    // adamw_mask (MaxText's meaning): a match never decays; adamw_mask_include: a match always does, except
    // where adamw_mask also matches. Layer 1's MLP out projection only: one layer of a stack differs.
    const std::map<std::string, bool> masked =
        decay_by_name({"scan_layers=" + scan, "adamw_mask=[layers_1/mlp/wo, query]",
                       "adamw_mask_include=[embedding$, layers_1/mlp/wo, pre_self_attention_layer_norm]"});
    ASSERT_EQ(masked.size(), plain.size());
    for (const auto& [name, decays] : plain) {
      const bool excluded =
          name == "decoder/layers_1/mlp/wo/kernel" || name.find("query") != std::string::npos;
      const bool included = name == "token_embedder/embedding" ||
                            name.find("pre_self_attention_layer_norm") != std::string::npos;
      EXPECT_EQ(masked.at(name), excluded ? false : included ? true : decays) << name << " scan " << scan;
    }
    EXPECT_TRUE(masked.at("decoder/layers_0/mlp/wo/kernel"));
    EXPECT_FALSE(masked.at("decoder/layers_1/mlp/wo/kernel"));
  }
}

TEST(Optimizer, InfoTextListsEachGroupsTensorsWithTheLayersFolded) {
  const Config config = testing::tiny_config({"scan_layers=true", "adamw_mask=[layers_1/mlp/wo]"});
  ModelSpec spec = build_model_spec(config);
  const std::string text = optimizer_groups_text(spec, apply_optimizer(spec, config));
  // 2 layers x 7 matrices, one of them taken out; the embedding, 2 x 4 norm scales and the final norm.
  EXPECT_NE(text.find("  default, adamw, lr x1, decay 0.1 (13 tensors): decoder/layers_{0-1}/self_attention/"
                      "query/kernel, "),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("  default, adamw, lr x1, no decay (11 tensors): token_embedder/embedding, "),
            std::string::npos)
      << text;
  EXPECT_NE(text.find(", decoder/layers_0/mlp/wo/kernel\n"), std::string::npos) << text;
  EXPECT_NE(text.find(", decoder/layers_1/mlp/wo/kernel, decoder/decoder_norm/scale\n"), std::string::npos)
      << text;
}

TEST(Optimizer, ADecayPatternMatchingNoTensorIsAnErrorNamingItAndTheClosestNames) {
  for (const std::string key : {"adamw_mask", "adamw_mask_include"}) {
    const Config config = testing::tiny_config({key + "=[norm, layers_0/mlp/wo_kernel]"});
    ModelSpec spec = build_model_spec(config);
    const size_t buffers = spec.buffers.size();
    try {
      apply_optimizer(spec, config);
      ADD_FAILURE() << "a pattern matching no tensor was accepted";
    } catch (const MeshError& error) {
      const std::string message = error.what();
      EXPECT_NE(message.find("config key '" + key + "'"), std::string::npos) << message;
      EXPECT_NE(message.find("'layers_0/mlp/wo_kernel'"), std::string::npos) << message;
      EXPECT_NE(message.find("decoder/layers_0/mlp/wo/kernel"), std::string::npos) << message;
    }
    EXPECT_EQ(spec.buffers.size(), buffers) << "nothing declared before the error";
  }
  // A pattern is searched anywhere in a name, so the hint ranks names by how close it comes to occurring in
  // them ('q_norm' is one edit from 'y_norm' of query_norm), not by distance to the whole name.
  {
    const Config config = testing::tiny_config({"adamw_mask=[q_norm]"});
    ModelSpec spec = build_model_spec(config);
    try {
      apply_optimizer(spec, config);
      ADD_FAILURE() << "a pattern matching no tensor was accepted";
    } catch (const MeshError& error) {
      const std::string message = error.what();
      EXPECT_NE(message.find("/self_attention/query_norm/scale"), std::string::npos) << message;
      EXPECT_EQ(message.find("token_embedder/embedding"), std::string::npos) << message;
    }
  }
  // A pattern that is no regular expression is the config's error, at load.
  EXPECT_THROW(testing::tiny_config({"adamw_mask=[layers_(0]"}), MeshError);
}

TEST(Optimizer, StateTableFindsEachParameterMomentsAfterTheModelsBuffers) {
  for (const std::string weight_dtype : {"float32", "bfloat16"}) {
    const Config config = testing::tiny_config({"weight_dtype=" + weight_dtype});
    ModelSpec spec = build_model_spec(config);
    const size_t model_buffers = spec.buffers.size();
    const OptimizerDecl optimizer = apply_optimizer(spec, config);
    EXPECT_EQ(optimizer.moment_names, (std::vector<std::string>{"adam_m", "adam_v"}));
    ASSERT_EQ(optimizer.parameters.size(), spec.parameters.size());
    // Declared after every buffer of the model, parameter by parameter, then the step counter last: the
    // order of buffer ids the plan files and checkpoints were made with.
    auto next = static_cast<BufferId>(model_buffers);
    for (size_t p = 0; p < spec.parameters.size(); ++p) {
      const ParameterState& state = optimizer.state(p);
      const BufferDecl& value = spec.buffer(spec.parameters[p].value);
      ASSERT_EQ(state.moments.size(), 2u);
      for (size_t m = 0; m < 2; ++m) {
        EXPECT_EQ(state.moments[m], next++);
        const BufferDecl& moment = spec.buffer(state.moments[m]);
        EXPECT_EQ(moment.name, optimizer.moment_names[m] + "/" + value.name);
        EXPECT_EQ(moment.kind, BufferKind::optimizer_state);
        EXPECT_EQ(moment.dtype, DType::f32);
        EXPECT_EQ(moment.shape, value.shape);
      }
      if (weight_dtype == "float32") {
        EXPECT_EQ(state.master, kNoBuffer);
        continue;
      }
      EXPECT_EQ(state.master, next++);  // a float32 master copy of a bfloat16 value
      EXPECT_EQ(spec.buffer(state.master).name, "master/" + value.name);
      EXPECT_EQ(spec.buffer(state.master).dtype, DType::f32);
    }
    EXPECT_EQ(optimizer.step_counter, next);
    EXPECT_EQ(spec.buffers.size(), static_cast<size_t>(next) + 1);
    // The update kernel's ops: the step, every squared gradient norm, the clip, then AdamW per parameter.
    const size_t P = spec.parameters.size();
    ASSERT_EQ(optimizer.update.size(), 2 * P + 2);
    EXPECT_EQ(optimizer.update.front().role, OpRole::step_counter);
    EXPECT_EQ(optimizer.update[P + 1].role, OpRole::clip);
    for (size_t p = 0; p < P; ++p) {
      EXPECT_EQ(optimizer.update[1 + p].role, OpRole::grad_norm);
      const OpDecl& adamw = optimizer.update[P + 2 + p];
      EXPECT_EQ(adamw.role, OpRole::adamw);
      EXPECT_EQ(adamw.parameter, static_cast<int32_t>(p));
      for (BufferId moment : optimizer.state(p).moments) {
        EXPECT_NE(std::find(adamw.writes.begin(), adamw.writes.end(), moment), adamw.writes.end());
      }
    }
    EXPECT_THROW(apply_optimizer(spec, config), std::exception) << "applied twice";
  }
}

bool holds_optimizer_state(const ModelSpec& spec) {
  for (const BufferDecl& buffer : spec.buffers) {
    if (buffer.kind == BufferKind::optimizer_state || buffer.kind == BufferKind::step_counter) return true;
  }
  return false;
}

TEST(Optimizer, ASpecWithoutThePassHasNoOptimizerState) {
  const Config config = testing::tiny_config();
  ModelSpec spec = build_model_spec(config);
  EXPECT_FALSE(holds_optimizer_state(spec));
  apply_optimizer(spec, config);
  EXPECT_TRUE(holds_optimizer_state(spec));
  // A training plan applies it; a decode plan does not, and the pass refuses a decode spec.
  EXPECT_TRUE(holds_optimizer_state(testing::tiny_plan().spec));
  ModelSpec decode = build_decode_spec(config, Mesh{}, 8, kernels::kernel_backend_for_device("cpu"));
  EXPECT_FALSE(holds_optimizer_state(decode));
  EXPECT_THROW(apply_optimizer(decode, config), std::exception);
}

}  // namespace
}  // namespace meshtrain
