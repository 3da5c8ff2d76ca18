// Multi-head latent attention beyond its gradient (test_model_gradient.cpp) and decode (test_decoder.cpp)
// checks: its parameters and their Hugging Face DeepSeek names, the RoPE column order of Hugging Face
// checkpoints, its tensor- and context-parallel declarations and the input it refuses.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "error_text.h"
#include "gradcheck.h"
#include "meshtrain/config/config.h"
#include "meshtrain/interchange/hf_names.h"
#include "meshtrain/kernels/cpu/rope.h"
#include "meshtrain/model/spec.h"
#include "meshtrain/plan/plan.h"

namespace meshtrain {
namespace {

using testing::error_of;

Config tiny_mla(std::vector<std::string> extra = {}) {
  std::vector<std::string> overrides = {
      "base_emb_dim=32",     "base_num_query_heads=4",    "base_num_kv_heads=4",
      "base_mlp_dim=48",     "base_num_decoder_layers=2", "vocab_size=100",
      "max_target_length=8", "per_device_batch_size=2",   "kv_lora_rank=10",
      "qk_nope_head_dim=6",  "qk_rope_head_dim=4",        "v_head_dim=8",
      "num_experts=0"};  // dense MLPs: the preset's experts are not what these tests look at
  // An extra key replaces the default above (the command line takes each key once).
  for (std::string& item : extra) {
    const std::string key = item.substr(0, item.find('=') + 1);
    std::erase_if(overrides, [&](const std::string& existing) { return existing.starts_with(key); });
    overrides.push_back(std::move(item));
  }
  return load_config("deepseek-tiny", overrides);
}

std::map<std::string, std::vector<int64_t>> layer0_attention_shapes(const ModelSpec& spec) {
  std::map<std::string, std::vector<int64_t>> shapes;
  const std::string prefix = "decoder/layers_0/self_attention/";
  for (const ParameterDecl& parameter : spec.parameters) {
    const BufferDecl& buffer = spec.buffer(parameter.value);
    if (buffer.name.starts_with(prefix)) shapes[buffer.name.substr(prefix.size())] = buffer.shape.dims;
  }
  return shapes;
}

TEST(Mla, ParametersHaveDeepSeekShapesAndHuggingFaceNames) {
  // D 32, H 4, r_q 12, r_kv 10, nope 6, rope 4, v 8.
  const ModelSpec compressed = build_model_spec(tiny_mla({"q_lora_rank=12"}));
  const std::map<std::string, std::vector<int64_t>> expected = {
      {"wq_a/kernel", {32, 12}},  {"q_norm/scale", {12}},  {"wq_b/kernel", {12, 4, 10}},
      {"wkv_a/kernel", {32, 14}}, {"kv_norm/scale", {10}}, {"wkv_b/kernel", {10, 4, 14}},
      {"out/kernel", {4, 8, 32}}};
  EXPECT_EQ(layer0_attention_shapes(compressed), expected);
  const ModelSpec direct = build_model_spec(tiny_mla({"q_lora_rank=0"}));
  const std::map<std::string, std::vector<int64_t>> expected_direct = {{"query/kernel", {32, 4, 10}},
                                                                       {"wkv_a/kernel", {32, 14}},
                                                                       {"kv_norm/scale", {10}},
                                                                       {"wkv_b/kernel", {10, 4, 14}},
                                                                       {"out/kernel", {4, 8, 32}}};
  EXPECT_EQ(layer0_attention_shapes(direct), expected_direct);

  const std::map<std::string, std::string> hf = {{"wq_a/kernel", "q_a_proj"},
                                                 {"q_norm/scale", "q_a_layernorm"},
                                                 {"wq_b/kernel", "q_b_proj"},
                                                 {"query/kernel", "q_proj"},
                                                 {"wkv_a/kernel", "kv_a_proj_with_mqa"},
                                                 {"kv_norm/scale", "kv_a_layernorm"},
                                                 {"wkv_b/kernel", "kv_b_proj"},
                                                 {"out/kernel", "o_proj"}};
  for (const auto& [engine, hf_module] : hf) {
    EXPECT_EQ(hugging_face_name("decoder/layers_3/self_attention/" + engine),
              "model.layers.3.self_attn." + hf_module + ".weight");
  }
}

// DeepSeek's RoPE on interleaved pairs (its inference code's complex rotation: pair i is columns 2i, 2i + 1),
// which is what Hugging Face's rope_interleave computes on a checkpoint's columns.
std::vector<double> interleaved_rope(const std::vector<double>& x, int32_t position, double theta) {
  const int64_t d = static_cast<int64_t>(x.size());
  std::vector<double> out(x.size());
  for (int64_t i = 0; i < d / 2; ++i) {
    const double angle = kernels::rope_angle(position, i, d, theta);
    const double re = x[static_cast<size_t>(2 * i)], im = x[static_cast<size_t>(2 * i + 1)];
    out[static_cast<size_t>(2 * i)] = re * std::cos(angle) - im * std::sin(angle);
    out[static_cast<size_t>(2 * i + 1)] = re * std::sin(angle) + im * std::cos(angle);
  }
  return out;
}

TEST(Mla, HuggingFaceRopeColumnsPermutedGiveTheInterleavedRotation) {
  const int64_t d = 8;
  const double theta = 10000.0;
  const std::vector<int64_t> order = hf_rope_column_order(d);
  EXPECT_EQ(order, (std::vector<int64_t>{0, 2, 4, 6, 1, 3, 5, 7}));
  const auto permuted = [&](const std::vector<double>& file_columns) {
    std::vector<double> engine(file_columns.size());
    for (size_t j = 0; j < engine.size(); ++j) engine[j] = file_columns[static_cast<size_t>(order[j])];
    return engine;
  };
  double error = 0.0, q_dot_k_error = 0.0, rotated = 0.0;
  for (const int32_t position : {0, 1, 7, 300}) {
    const std::vector<double> q = testing::random_values(d, 31 + position), k = testing::random_values(d, 41);
    // The engine's rotate-half RoPE on the permuted columns is the interleaved rotation, permuted the same.
    std::vector<double> q_engine(d), k_engine(d);
    kernels::rope_reference_forward(q_engine.data(), permuted(q).data(), &position, 1, 1, d, theta);
    kernels::rope_reference_forward(k_engine.data(), permuted(k).data(), &position, 1, 1, d, theta);
    const std::vector<double> q_file = interleaved_rope(q, position, theta),
                              k_file = interleaved_rope(k, position, theta);
    error = std::max(error, testing::relative_error(q_engine, permuted(q_file)));
    // So attention scores, q . k, are the checkpoint's.
    double dot_engine = 0.0, dot_file = 0.0;
    for (int64_t j = 0; j < d; ++j) {
      dot_engine += q_engine[static_cast<size_t>(j)] * k_engine[static_cast<size_t>(j)];
      dot_file += q_file[static_cast<size_t>(j)] * k_file[static_cast<size_t>(j)];
    }
    q_dot_k_error =
        std::max(q_dot_k_error, std::fabs(dot_engine - dot_file) / std::max(1.0, std::fabs(dot_file)));
    if (position > 0) rotated = std::max(rotated, testing::relative_error(q_file, q));
  }
  // Double arithmetic on the same angles: only rounding differs.
  const double bound = 1e-12;
  testing::report_error("permuted rotate-half vs interleaved rope", error, bound);
  testing::report_error("permuted rotate-half q.k vs interleaved q.k", q_dot_k_error, bound);
  EXPECT_LT(error, bound);
  EXPECT_LT(q_dot_k_error, bound);
  EXPECT_GT(rotated, 1e-2) << "the rotation must move the values, or the comparison has no signal";
}

// Under mesh.tensor the heads split and the gradients leaving them for the replicated down projections are
// all-reduced, one reduction per partial gradient (the numbers: the mpirun check in the report).
TEST(Mla, SplitsHeadsOverTensorAndReducesTheGradientsLeavingThem) {
  for (const char* q_lora_rank : {"q_lora_rank=12", "q_lora_rank=0"}) {
    SCOPED_TRACE(q_lora_rank);
    const ModelSpec spec = build_model_spec(tiny_mla({q_lora_rank}), Mesh({{MeshAxis::tensor, 2}}),
                                            kernels::kernel_backend_for_device("cpu"));
    EXPECT_EQ(spec.dims.H, 2);
    const std::map<std::string, std::vector<int64_t>> shapes = layer0_attention_shapes(spec);
    EXPECT_EQ(shapes.at("wkv_a/kernel"), (std::vector<int64_t>{32, 14}));  // replicated
    EXPECT_EQ(shapes.at("wkv_b/kernel"), (std::vector<int64_t>{10, 2, 14}));
    EXPECT_EQ(shapes.at("out/kernel"), (std::vector<int64_t>{2, 8, 32}));
    std::vector<std::string> reductions;
    const std::string prefix = "decoder/layers_0/self_attention/";
    for (const OpDecl& op : spec.loss_backward) {
      if (op.kind == OpKind::collective && op.name.starts_with(prefix))
        reductions.push_back(op.name.substr(prefix.size()));
    }
    const std::string q_reduction =
        std::string(q_lora_rank) == "q_lora_rank=0" ? "reduce_input_gradient" : "reduce_q_a_gradient";
    EXPECT_EQ(reductions,
              (std::vector<std::string>{"reduce_k_rope_gradient", "reduce_c_kv_gradient", q_reduction}));
  }
}

// Under mesh.context the core is context_attention.h's, over MLA's expanded keys and padded values (the
// numbers: tests/mpi/mla_equivalence.sh, the context cases).
TEST(Mla, UnderContextParallelismUsesTheContextAttentionCore) {
  for (const char* strategy : {"all_gather", "ring"}) {
    SCOPED_TRACE(strategy);
    const ModelSpec spec =
        build_model_spec(tiny_mla({std::string("context_parallel_strategy=") + strategy}),
                         Mesh({{MeshAxis::context, 2}}), kernels::kernel_backend_for_device("cpu"));
    EXPECT_EQ(spec.dims.S, 4);  // 8 tokens over 2 context ranks
    const std::string core =
        std::string("decoder/layers_0/self_attention/") +
        (std::string(strategy) == "ring" ? "ring_attention_forward" : "attention_forward");
    const auto found = std::find_if(spec.forward.begin(), spec.forward.end(),
                                    [&](const OpDecl& op) { return op.name == core; });
    ASSERT_NE(found, spec.forward.end());
    // Over the whole row: B = 4 rows (per_device_batch_size x devices, each cut over context), 4 queries x 8
    // keys of the 4 heads at width dq = 10, half of them causal.
    EXPECT_EQ(spec.dims.B, 4);
    EXPECT_EQ(found->flops, 4.0 * 4 * 4 * 8 * 4 * 10 / 2.0);
  }
}

TEST(Mla, RefusesUnequalKvHeadsAndADenseExpertMeshNamingTheKey) {
  EXPECT_NO_THROW(
      build_model_spec(tiny_mla(), Mesh({{MeshAxis::data, 2}}), kernels::kernel_backend_for_device("cpu")));
  const std::string kv = error_of([] { build_model_spec(tiny_mla({"base_num_kv_heads=2"})); });
  EXPECT_NE(kv.find("'base_num_kv_heads'"), std::string::npos) << kv;
  EXPECT_NE(kv.find("base_num_query_heads (4) under attention_type=mla"), std::string::npos) << kv;
  // The resolved mesh.expert (here filled in from the devices, not given) must divide the experts too.
  const std::string expert = error_of([] {
    PlanRequest request;
    request.config = tiny_mla({"mesh.data=1", "mesh.expert=-1"});
    request.devices = 2;
    plan_training(request);
  });
  EXPECT_NE(expert.find("'mesh.expert'"), std::string::npos) << expert;
  // MoE layers build, with and without the selection bias.
  EXPECT_NO_THROW(build_model_spec(tiny_mla({"num_experts=4", "base_moe_mlp_dim=16"})));
  EXPECT_NO_THROW(build_model_spec(tiny_mla({"num_experts=4", "base_moe_mlp_dim=16", "routed_bias=true"})));
}

TEST(Mla, StandardFlopsCountTheLowRankProjections) {
  // Per token and layer, forward: 2 (D r_q + r_q H dq + D (r_kv + rope) + r_kv H (nope + v) + H v D) with
  // D 32, H 4, r_q 12, r_kv 10, nope 6, rope 4 (dq 10), v 8; the attention part 2 S H (dq + v) / 2 per token.
  const Config config = tiny_mla({"q_lora_rank=12"});
  const StandardFlops flops = standard_training_flops(config);
  const double tokens = 2.0 * 8.0, layers = 2.0;
  const double attention_projections = 2.0 * (32 * 12 + 12 * 4 * 10 + 32 * 14 + 10 * 4 * 14 + 4 * 8 * 32);
  const double mlp = 2.0 * 3 * 32 * 48, unembedding = 2.0 * 32 * 100;
  EXPECT_DOUBLE_EQ(flops.learnable, 3 * tokens * (layers * (attention_projections + mlp) + unembedding));
  EXPECT_DOUBLE_EQ(flops.attention, 3 * layers * tokens * 2.0 * 8 * 4 * (10 + 8) / 2);
}

}  // namespace
}  // namespace meshtrain
