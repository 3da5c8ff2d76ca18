// Whole-model gradient checks: the hand-written backward of every parameter tensor of a tiny Qwen3, a tiny
// GPT-2 and tiny DeepSeek-style MLA models against central finite differences of the forward loss along a
// random direction.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "gradcheck.h"
#include "meshtrain/model/spec.h"
#include "meshtrain/runtime/engine.h"
#include "meshtrain/train/run.h"
#include "tiny_batch.h"

namespace meshtrain {
namespace {

using testing::tiny_batch;

Config tiny_config(const std::string& preset) {
  std::vector<std::string> overrides = {
      "base_emb_dim=32",     "base_num_query_heads=4",    "head_dim=8",
      "base_mlp_dim=48",     "base_num_decoder_layers=2", "vocab_size=100",
      "max_target_length=8", "per_device_batch_size=2",   "init_weights_seed=3"};
  overrides.push_back(preset == "qwen3-tiny" ? "base_num_kv_heads=2" : "base_num_kv_heads=4");
  if (preset == "gpt2-124m") overrides.push_back("max_position_embeddings=16");
  return load_config(preset, overrides);
}

// For each parameter: g . u versus (L(p + e u) - L(p - e u)) / 2e, with u a random unit direction; L the
// cross-entropy sum plus the z-loss sum (0 without z_loss_multiplier).
// step: the finite-difference step along u (kQwenGptStep or kStep).
// perturb_constants: parameters that start constant (norm scales, biases, Engram's zero conv taps, mHC's
// betas and 0.01 scales) move off their init, so the paths a constant init silences carry signal too.
void check_model_gradient(const Config& config, double bound, double step, bool perturb_constants = false) {
  Engine engine(config);
  const ModelSpec& spec = engine.spec();
  uint64_t perturbation_seed = 500;
  // Larger weights than the 0.02 init make every path carry signal (a tiny init hides attention errors).
  for (const ParameterDecl& parameter : spec.parameters) {
    const TensorView value = engine.view(parameter.value);
    if (parameter.init == ParameterInit::normal) {
      for (int64_t i = 0; i < value.elements(); ++i) value.f32()[i] *= 10.0f;
    } else if (perturb_constants) {
      const std::vector<double> noise =
          testing::random_values(static_cast<size_t>(value.elements()), ++perturbation_seed);
      for (int64_t i = 0; i < value.elements(); ++i)
        value.f32()[i] += static_cast<float>(0.3 * noise[static_cast<size_t>(i)]);
      // Engram's query and key norms at ~3 (tiny_engram_config).
      const std::string& name = spec.buffer(parameter.value).name;
      if (name.ends_with("/engram/q_norm/scale") || name.ends_with("/engram/k_norm/scale")) {
        for (int64_t i = 0; i < value.elements(); ++i) value.f32()[i] *= 3.0f;
      }
    }
  }
  Batch batch = tiny_batch(spec.dims, 11);
  if (!config.engram_layers.empty()) {
    make_engram_hashing(engram_hash_options(config), nullptr).add_to(batch, spec.dims.S);
  }
  engine.fwd_bwd(batch);
  uint64_t seed = 100;
  for (const ParameterDecl& parameter : spec.parameters) {
    const TensorView value = engine.view(parameter.value);
    const int64_t count = value.elements();
    std::vector<double> direction = testing::random_values(static_cast<size_t>(count), ++seed);
    double norm = 0.0;
    for (double x : direction) norm += x * x;
    for (double& x : direction) x /= std::sqrt(norm);
    const float* gradient = engine.view(parameter.gradient).f32();
    double analytic = 0.0;
    for (int64_t i = 0; i < count; ++i) analytic += gradient[i] * direction[static_cast<size_t>(i)];

    const std::vector<float> saved(value.f32(), value.f32() + count);
    const auto loss_at = [&](double scale) {
      for (int64_t i = 0; i < count; ++i) {
        value.f32()[i] =
            static_cast<float>(saved[static_cast<size_t>(i)] + scale * direction[static_cast<size_t>(i)]);
      }
      const LossSums sums = engine.eval(batch);
      return sums.loss_sum + sums.z_loss_sum;
    };
    const double numeric = (loss_at(step) - loss_at(-step)) / (2.0 * step);
    std::copy(saved.begin(), saved.end(), value.f32());
    // Relative to the larger of the two, floored so near-zero directional derivatives compare absolutely.
    const double error =
        std::fabs(numeric - analytic) / std::max({std::fabs(numeric), std::fabs(analytic), 1e-1});
    testing::report_error(spec.buffer(parameter.value).name, error, bound);
    EXPECT_LT(error, bound) << spec.buffer(parameter.value).name << " analytic " << analytic << " numeric "
                            << numeric;
  }
}

// The step of the central difference trades the float32 forward's rounding (the loss sum, ~70-110 here,
// changes by ~1e-6 from rounding alone: ~c / step on the quotient) against the O(step^2) truncation. Measured
// over these tests (max error of any parameter; the quotient minus the analytic value along u at steps 8e-2
// down to 1.25e-3): the dense models' worst error is rounding at 1e-2 (1.5e-3 on the tied embedding of
// Qwen3, 2.04e-3 with the z-loss in the -O1 sanitizer build, whose float rounding differs) and halves at
// 2e-2 (7e-4), where truncation is still ~1e-5. The other models keep 1e-2: at 2e-2 a routed expert's top-k
// choice flips (an error of ~1), mHC's exponential alpha scales reach 4e-3 of truncation, and MLA's worst
// error (7-8e-4) is no smaller.
constexpr double kQwenGptStep = 2e-2;
constexpr double kStep = 1e-2;

TEST(ModelGradient, Qwen3MatchesFiniteDifferences) {
  check_model_gradient(tiny_config("qwen3-tiny"), 2e-3, kQwenGptStep);
}
TEST(ModelGradient, Gpt2MatchesFiniteDifferences) {
  check_model_gradient(tiny_config("gpt2-124m"), 2e-3, kQwenGptStep);
}
// The z-loss (m = 0.1: its gradient 2 m lse softmax as large as the cross-entropy's) through the whole model,
// with the tied table and with an untied head.
TEST(ModelGradient, Qwen3WithZLossMatchesFiniteDifferences) {
  for (const char* tied : {"true", "false"}) {
    Config config = tiny_config("qwen3-tiny");
    config.set("z_loss_multiplier", "0.1");
    config.set("logits_via_embedding", tied);
    check_model_gradient(config, 2e-3, kQwenGptStep);
  }
}

// Multi-head latent attention with both query paths. Widths unequal everywhere (r_q 12, r_kv 10, nope 6,
// rope 4, v 8 < nope + rope, so v is padded) so a mixed-up slice cannot pass.
Config tiny_mla_config(const std::string& q_lora_rank, const std::vector<std::string>& extra = {}) {
  std::vector<std::string> overrides = {"base_emb_dim=32",           "base_num_query_heads=4",
                                        "base_num_kv_heads=4",       "base_mlp_dim=48",
                                        "base_num_decoder_layers=2", "vocab_size=100",
                                        "max_target_length=8",       "per_device_batch_size=2",
                                        "init_weights_seed=3",       "q_lora_rank=" + q_lora_rank,
                                        "kv_lora_rank=10",           "qk_nope_head_dim=6",
                                        "qk_rope_head_dim=4",        "v_head_dim=8"};
  overrides.push_back("num_experts=0");    // dense unless `extra` asks for experts
  for (const std::string& item : extra) {  // an extra key replaces the default (each key once)
    const std::string key = item.substr(0, item.find('=') + 1);
    std::erase_if(overrides, [&](const std::string& existing) { return existing.starts_with(key); });
    overrides.push_back(item);
  }
  return load_config("deepseek-tiny", overrides);
}
TEST(ModelGradient, MlaWithQueryCompressionMatchesFiniteDifferences) {
  check_model_gradient(tiny_mla_config("12"), 2e-3, kStep);
}
TEST(ModelGradient, MlaWithDirectQueriesMatchesFiniteDifferences) {
  check_model_gradient(tiny_mla_config("0"), 2e-3, kStep);
}

// Mixture of experts after a dense first layer: 6 routed experts (two groups of 3, the best one kept) top-2
// with weights normalised and scaled, one shared expert, expert width 12 unlike the dense 48. Routing is
// piecewise constant: the direction steps move each weight by ~1e-2 / sqrt(count), far from flipping a
// choice of these random logits (a flip would show as a large error, not a small one). Capacity-limited
// routing drops assignments, which the same check covers.
Config tiny_moe_config(const std::string& score_function, const std::string& capacity_factor) {
  return tiny_mla_config(
      "12", {"num_experts=6", "num_experts_per_tok=2", "base_moe_mlp_dim=12", "first_num_dense_layers=1",
             "shared_experts=1", "routed_score_func=" + score_function, "n_routing_groups=2",
             "topk_routing_group=1", "norm_topk_prob=true", "routed_scaling_factor=2.5",
             "capacity_factor=" + capacity_factor});
}
TEST(ModelGradient, MoeWithSigmoidRoutingMatchesFiniteDifferences) {
  check_model_gradient(tiny_moe_config("sigmoid", "0"), 2e-3, kStep);
}
TEST(ModelGradient, MoeWithSoftmaxRoutingAndCapacityMatchesFiniteDifferences) {
  check_model_gradient(tiny_moe_config("softmax", "1.0"), 2e-3, kStep);
}

// Engram on both layers (orders 2 and 3, 2 heads each over tables of 31.. and 37.. rows, rows of 4, a
// 2-tap ShortConv of dilation 3 reaching across the row's first 3 tokens), without and with mHC (4 streams,
// 20 Sinkhorn iterations) around every sublayer; `experts` > 0 makes the second layer MoE (an mHC site
// around the MoE block). Query and key norms perturbed to ~3 keep Engram's gate scores of order 10, away
// from the steep zero of its signed square root.
Config tiny_engram_config(const std::string& streams, const std::string& kernel_size,
                          const std::string& experts) {
  return tiny_mla_config(
      "12", {"engram_layers=[0,1]", "engram_num_heads=2", "engram_head_dim=4", "engram_vocab_bases=[31,37]",
             "engram_kernel_size=" + kernel_size, "mhc_expansion_rate=" + streams, "num_experts=" + experts,
             "num_experts_per_tok=2", "base_moe_mlp_dim=12", "first_num_dense_layers=1",
             "routed_score_func=sigmoid", "norm_topk_prob=true"});
}
TEST(ModelGradient, EngramMatchesFiniteDifferences) {
  check_model_gradient(tiny_engram_config("1", "2", "0"), 2e-3, kStep, true);
}
TEST(ModelGradient, EngramWithMhcMatchesFiniteDifferences) {
  check_model_gradient(tiny_engram_config("4", "2", "0"), 2e-3, kStep, true);
}
TEST(ModelGradient, MhcAroundMoeWithPointwiseShortConvMatchesFiniteDifferences) {
  check_model_gradient(tiny_engram_config("3", "1", "4"), 2e-3, kStep, true);
}

// The tables' optimizer group: Adam's first step moves every entry by its learning rate times the sign of
// its gradient (m / sqrt(v) = g / |g|), so a table entry with a gradient moves by exactly
// engram_learning_rate_multiplier x lr and without decay, while a decayed kernel moves by lr (1 + decay w).
TEST(ModelGradient, EngramTablesHaveTheirOwnOptimizerGroup) {
  for (const std::string decay : {"0.0", "0.5"}) {
    Config config = tiny_engram_config("1", "2", "0");
    config.engram_weight_decay = std::stod(decay);
    config.adam_eps = 1e-30;  // the first step's m / sqrt(v) is then exactly the gradient's sign
    Engine engine(config);
    const ModelSpec& spec = engine.spec();
    Batch batch = tiny_batch(spec.dims, 3);
    make_engram_hashing(engram_hash_options(config), nullptr).add_to(batch, spec.dims.S);
    std::vector<std::vector<float>> before;
    for (const ParameterDecl& parameter : spec.parameters) {
      const TensorView value = engine.view(parameter.value);
      before.emplace_back(value.f32(), value.f32() + value.elements());
    }
    const LossSums sums = engine.fwd_bwd(batch);
    const double lr = 1e-3;
    engine.update(sums.valid_count, lr, 0);
    int64_t checked_tables = 0, checked_kernels = 0;
    for (size_t p = 0; p < spec.parameters.size(); ++p) {
      const ParameterDecl& parameter = spec.parameters[p];
      const bool table = parameter.canonical_name.ends_with("/engram/multi_head_embedding/embedding");
      const bool kernel = parameter.canonical_name.ends_with("/engram/value_proj/kernel");
      if (!table && !kernel) continue;
      const float* after = engine.view(parameter.value).f32();
      const float* moment = engine.view(engine.plan().optimizer.state(p).moments.at(0)).f32();  // adam_m
      for (size_t i = 0; i < before[p].size(); ++i) {
        if (moment[i] == 0.0f) continue;  // a row no token read
        const double sign = moment[i] > 0.0f ? 1.0 : -1.0, w = before[p][i];
        const double expected = table ? w * (1.0 - 5.0 * lr * config.engram_weight_decay) - 5.0 * lr * sign
                                      : w * (1.0 - lr * config.adam_weight_decay) - lr * sign;
        ASSERT_NEAR(after[i], expected, 1e-6)
            << parameter.canonical_name << " entry " << i << " decay " << decay;
        (table ? checked_tables : checked_kernels) += 1;
      }
    }
    EXPECT_GT(checked_tables, 0);
    EXPECT_GT(checked_kernels, 0);
  }
}

TEST(ModelGradient, AccumulateAddsAndEvalMatchesTraining) {
  Engine engine(tiny_config("qwen3-tiny"));
  const Batch batch = tiny_batch(engine.spec().dims, 5);
  const LossSums training = engine.fwd_bwd(batch);
  std::vector<std::vector<float>> once;
  for (const ParameterDecl& parameter : engine.spec().parameters) {
    const TensorView gradient = engine.view(parameter.gradient);
    once.emplace_back(gradient.f32(), gradient.f32() + gradient.elements());
  }
  engine.fwd_bwd_accum(batch);
  // A tensor fed by two paths (the tied table) sums in another order the second time: compare to rounding.
  for (size_t p = 0; p < once.size(); ++p) {
    const TensorView gradient = engine.view(engine.spec().parameters[p].gradient);
    std::vector<float> doubled(once[p]);
    for (float& value : doubled) value *= 2.0f;
    EXPECT_LT(testing::relative_error(
                  std::vector<float>(gradient.f32(), gradient.f32() + gradient.elements()), doubled),
              1e-6)
        << engine.spec().buffer(engine.spec().parameters[p].value).name;
  }
  const LossSums evaluation = engine.eval(batch);
  EXPECT_EQ(evaluation.loss_sum, training.loss_sum);
  EXPECT_EQ(evaluation.valid_count, training.valid_count);
  EXPECT_EQ(training.valid_count, 14);  // 16 targets, s = 3 masked in each row
}

}  // namespace
}  // namespace meshtrain
