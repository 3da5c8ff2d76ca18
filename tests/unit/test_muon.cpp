// Muon (kernels/cpu/muon.h, optim/muon.h): the fast step and its plain reference against PyTorch's golden
// steps (tests/reference/muon_golden), the AdamW beside it (Nesterov), the Newton-Schulz output's singular
// values, which tensors Muon steps by name, and its bad inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "meshtrain/config/config.h"
#include "meshtrain/core/error.h"
#include "meshtrain/kernels/cpu/adamw.h"
#include "meshtrain/kernels/cpu/muon.h"
#include "meshtrain/model/spec.h"
#include "meshtrain/optim/muon.h"
#include "meshtrain/optim/optimizer.h"
#include "plan/tiny_plan.h"

namespace meshtrain {
namespace {

nlohmann::json golden() {
  std::ifstream file(std::string(MESHTRAIN_SOURCE_DIR) + "/tests/reference/muon_golden/golden.json");
  return nlohmann::json::parse(file);
}

template <class T>
std::vector<T> as(const nlohmann::json& values) {
  std::vector<T> out;
  for (const auto& value : values) out.push_back(static_cast<T>(value.get<double>()));
  return out;
}

template <class T>
void expect_near(const std::vector<T>& found, const nlohmann::json& expected, double tolerance,
                 const std::string& what) {
  ASSERT_EQ(found.size(), expected.size()) << what;
  for (size_t i = 0; i < found.size(); ++i)
    EXPECT_NEAR(static_cast<double>(found[i]), expected[i].get<double>(), tolerance)
        << what << " [" << i << "]";
}

TEST(Muon, FastStepAndReferenceEqualPyTorchsGoldenSteps) {
  const nlohmann::json g = golden();
  for (const nlohmann::json& c : g["muon"]) {
    const int64_t batch = c["batch"], rows = c["rows"], cols = c["cols"];
    kernels::MuonStep step{g["learning_rate"].get<float>(), g["beta"].get<float>(),
                           g["epsilon"].get<float>(),       g["weight_decay"].get<float>(),
                           c["update_scale"].get<float>(),  1,
                           g["gradient_scale"].get<float>()};
    // The scale as optim/muon.h computes it from the config's key.
    Config config = testing::tiny_config({"opt_type=muon"});
    if (!c["consistent_rms"].is_null()) config.muon_consistent_rms = c["consistent_rms"].get<double>();
    EXPECT_NEAR(muon_update_scale(config, rows, cols), c["update_scale"].get<double>(), 1e-12) << c["name"];

    std::vector<float> param = as<float>(c["param"]), momentum(param.size(), 0.0f);
    std::vector<double> param_ref = as<double>(c["param"]), momentum_ref(param.size(), 0.0);
    std::vector<float> scratch(static_cast<size_t>(kernels::muon_scratch_floats(rows, cols)));
    for (int64_t t = 1; t <= g["steps"].get<int64_t>(); ++t) {
      step.step = t;
      const auto i = static_cast<size_t>(t - 1);
      const std::vector<float> grad = as<float>(c["grads"][i]);
      const std::vector<double> grad_ref = as<double>(c["grads"][i]);
      kernels::muon_update(param.data(), grad.data(), momentum.data(), batch, rows, cols, step, true,
                           scratch.data());
      kernels::muon_reference_update(param_ref.data(), grad_ref.data(), momentum_ref.data(), batch, rows,
                                     cols, step, true);
      const std::string what = c["name"].get<std::string>() + " step " + std::to_string(t);
      // The reference in double is the same formula: to rounding. The float32 fast path: its GEMMs'.
      expect_near(param_ref, c["params"][i], 1e-6, what + " reference");
      expect_near(momentum_ref, c["momenta"][i], 1e-7, what + " reference momentum");
      expect_near(param, c["params"][i], 2e-5, what + " fast");
      expect_near(momentum, c["momenta"][i], 2e-6, what + " fast momentum");
    }
  }
}

TEST(Muon, AdamWBesideMuonIsNesterovsAsPyTorchsGolden) {
  const nlohmann::json g = golden();
  const nlohmann::json& c = g["adamw_nesterov"];
  kernels::AdamWStep step{g["learning_rate"].get<float>(),     g["adam_b1"].get<float>(),
                          g["adam_b2"].get<float>(),           g["epsilon"].get<float>(),
                          g["adam_weight_decay"].get<float>(), 1,
                          g["gradient_scale"].get<float>(),    true};
  std::vector<float> param = as<float>(c["param"]), m(param.size()), v(param.size());
  std::vector<double> param_ref = as<double>(c["param"]), m_ref(param.size()), v_ref(param.size());
  for (int64_t t = 1; t <= g["steps"].get<int64_t>(); ++t) {
    step.step = t;
    const auto i = static_cast<size_t>(t - 1);
    const std::vector<float> grad = as<float>(c["grads"][i]);
    const std::vector<double> grad_ref = as<double>(c["grads"][i]);
    kernels::adamw_update(param.data(), grad.data(), m.data(), v.data(), static_cast<int64_t>(param.size()),
                          step, true);
    kernels::adamw_reference_update(param_ref.data(), grad_ref.data(), m_ref.data(), v_ref.data(),
                                    static_cast<int64_t>(param.size()), step, true);
    expect_near(param_ref, c["params"][i], 1e-6, "reference step " + std::to_string(t));
    expect_near(param, c["params"][i], 2e-6, "fast step " + std::to_string(t));
  }
}

// Whether every eigenvalue of the symmetric [n, n] `gram` (double) lies in [low, high]: both gram - low I and
// high I - gram have a Cholesky factor.
bool eigenvalues_within(const std::vector<double>& gram, int64_t n, double low, double high) {
  for (const double sign : {1.0, -1.0}) {
    std::vector<double> a(gram.size());
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < n; ++j) {
        const double shift = i == j ? (sign > 0 ? low : high) : 0.0;
        a[static_cast<size_t>(i * n + j)] = sign * (gram[static_cast<size_t>(i * n + j)] - shift);
      }
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t k = 0; k < j; ++k)
        a[static_cast<size_t>(j * n + j)] -=
            a[static_cast<size_t>(j * n + k)] * a[static_cast<size_t>(j * n + k)];
      if (!(a[static_cast<size_t>(j * n + j)] > 0.0)) return false;
      a[static_cast<size_t>(j * n + j)] = std::sqrt(a[static_cast<size_t>(j * n + j)]);
      for (int64_t i = j + 1; i < n; ++i) {
        for (int64_t k = 0; k < j; ++k)
          a[static_cast<size_t>(i * n + j)] -=
              a[static_cast<size_t>(i * n + k)] * a[static_cast<size_t>(j * n + k)];
        a[static_cast<size_t>(i * n + j)] /= a[static_cast<size_t>(j * n + j)];
      }
    }
  }
  return true;
}

// O^T O (tall) or O O^T (wide): [n, n] with n = min(rows, cols).
std::vector<double> gram_of(const std::vector<float>& o, int64_t rows, int64_t cols) {
  const bool tall = rows > cols;
  const int64_t n = std::min(rows, cols), m = std::max(rows, cols);
  std::vector<double> gram(static_cast<size_t>(n * n));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t k = 0; k < m; ++k) {
        const auto at = [&](int64_t a, int64_t b) {
          return static_cast<double>(o[static_cast<size_t>(tall ? b * cols + a : a * cols + b)]);
        };
        gram[static_cast<size_t>(i * n + j)] += at(i, k) * at(j, k);
      }
  return gram;
}

// Five quintic Newton-Schulz steps take every singular value of a normalised matrix (of a moderate condition
// number: uniform random 32 x 16) into [0.68, 1.14] (PyTorch measures [0.6818, 1.1344] over 200 Gaussian
// ones); the input's lie far outside.
TEST(Muon, NewtonSchulzOutputHasSingularValuesNearOne) {
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{32, 16}, {16, 32}}) {
    std::mt19937 generator(static_cast<uint32_t>(rows));
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    std::vector<float> gradient(static_cast<size_t>(rows * cols));
    for (float& value : gradient) value = uniform(generator);
    // beta 0, lr 1, scale 1, no decay: param (zero) becomes minus the orthogonalised gradient.
    std::vector<float> param(gradient.size(), 0.0f), momentum(gradient.size(), 0.0f);
    std::vector<float> scratch(static_cast<size_t>(kernels::muon_scratch_floats(rows, cols)));
    const kernels::MuonStep step{1.0f, 0.0f, 1e-8f, 0.0f, 1.0f, 1, 1.0f};
    kernels::muon_update(param.data(), gradient.data(), momentum.data(), 1, rows, cols, step, false,
                         scratch.data());
    for (float& value : param) value = -value;
    const int64_t n = std::min(rows, cols);
    EXPECT_TRUE(eigenvalues_within(gram_of(param, rows, cols), n, 0.68 * 0.68, 1.14 * 1.14))
        << rows << "x" << cols;
    // The reference's output alike, and the gradient itself far from orthogonal.
    const std::vector<double> reference = kernels::newton_schulz_reference(
        std::vector<double>(gradient.begin(), gradient.end()), rows, cols, 1e-8);
    EXPECT_TRUE(
        eigenvalues_within(gram_of(std::vector<float>(reference.begin(), reference.end()), rows, cols), n,
                           0.68 * 0.68, 1.14 * 1.14));
    EXPECT_FALSE(eigenvalues_within(gram_of(gradient, rows, cols), n, 0.68 * 0.68, 1.14 * 1.14));
  }
}

TEST(Muon, GroupsStepHiddenMatricesWithMuonAndTheRestWithAdamW) {
  const Config config = testing::tiny_deepseek_config({"opt_type=muon", "scan_layers=true"});
  ModelSpec spec = build_model_spec(config);
  const OptimizerDecl optimizer = apply_optimizer(spec, config);
  std::map<std::string, bool> muon;  // per-layer canonical name -> stepped by Muon
  for (size_t p = 0; p < spec.parameters.size(); ++p) {
    const ParameterDecl& parameter = spec.parameters[p];
    const ParameterState& state = optimizer.state(p);
    const std::vector<std::string> expected_moments =
        state.muon ? std::vector<std::string>{"muon_mu"} : std::vector<std::string>{"adam_m", "adam_v"};
    EXPECT_EQ(state.moment_names, expected_moments);
    EXPECT_EQ(optimizer.update[spec.parameters.size() + 2 + p].role,
              state.muon ? OpRole::muon : OpRole::adamw);
    if (!parameter.stacked()) muon[parameter.canonical_name] = state.muon;
    for (const ParameterDecl::Member& member : parameter.members) muon[member.canonical_name] = state.muon;
  }
  EXPECT_EQ(optimizer.moment_names, (std::vector<std::string>{"adam_m", "adam_v", "muon_mu"}));
  for (const auto& [name, by_muon] : muon) {
    // Every linear map's weights but the router's, the head's, mHC's coefficients' and Engram's taps.
    const bool linear_map = name.ends_with("/kernel") || name.find("/routed_experts/") != std::string::npos;
    const bool not_hidden =
        name.find("/moe/gate/") != std::string::npos || name.find("logits_dense") != std::string::npos ||
        name.find("/mhc_") != std::string::npos || name.find("short_conv") != std::string::npos;
    const bool hidden_matrix = linear_map && !not_hidden;
    EXPECT_EQ(by_muon, hidden_matrix) << name;
  }
  // AdamW for the embedding, the head, norms, biases, the router, Engram's tables and convolution, mHC.
  for (const std::string name :
       {"token_embedder/embedding", "decoder/logits_dense/kernel", "decoder/layers_1/moe/gate/kernel",
        "decoder/layers_1/engram/short_conv/conv/kernel", "decoder/layers_0/mhc_attention/alpha/kernel",
        "decoder/decoder_norm/scale"}) {
    ASSERT_TRUE(muon.contains(name)) << name;
    EXPECT_FALSE(muon.at(name)) << name;
  }
  EXPECT_TRUE(muon.at("decoder/layers_1/moe/routed_experts/wo"));
  // An expert tensor [E, F, D] is E matrices [F, D]; attention's out [H, d, D] one [H d, D] matrix.
  for (size_t p = 0; p < spec.parameters.size(); ++p) {
    const ParameterDecl& parameter = spec.parameters[p];
    if (!optimizer.state(p).muon) continue;
    const MuonMatrices matrices = muon_matrices(spec, parameter);
    EXPECT_EQ(matrices.batch * matrices.rows * matrices.cols, spec.buffer(parameter.value).shape.elements());
    if (parameter.canonical_name.ends_with("routed_experts/wo")) {
      EXPECT_EQ(matrices.batch,
                std::max<int64_t>(1, static_cast<int64_t>(parameter.members.size())) * config.num_experts);
      EXPECT_EQ(matrices.cols, config.base_emb_dim);
    }
  }
}

// The plan holds Muon's state (one moment per matrix instead of AdamW's two) and its update's FLOPs: the
// Newton-Schulz count of every matrix on top of 12 per element, in the update kernel's total.
TEST(Muon, PlanCountsItsStateBytesAndNewtonSchulzFlops) {
  const TrainingPlan adamw = testing::tiny_plan();
  const TrainingPlan muon = testing::tiny_plan({"opt_type=muon"});
  int64_t matrix_elements = 0;
  double newton_schulz = 0.0;
  for (size_t p = 0; p < muon.spec.parameters.size(); ++p) {
    if (!muon.optimizer.state(p).muon) continue;
    const MuonMatrices matrices = muon_matrices(muon.spec, muon.spec.parameters[p]);
    matrix_elements += matrices.batch * matrices.rows * matrices.cols;
    newton_schulz +=
        static_cast<double>(matrices.batch) * kernels::newton_schulz_flops(matrices.rows, matrices.cols);
  }
  ASSERT_GT(matrix_elements, 0);
  EXPECT_EQ(adamw.persistent_bytes - muon.persistent_bytes,
            static_cast<size_t>(matrix_elements) * sizeof(float));
  const auto update_flops = [](const TrainingPlan& plan) {
    for (const KernelPlan& kernel : plan.kernels)
      if (kernel.kernel == KernelName::update) return kernel.flops;
    return 0.0;
  };
  EXPECT_DOUBLE_EQ(update_flops(muon) - update_flops(adamw), newton_schulz);
  // One [16, 32] matrix's count written out: n = 16, m = 32, 5 steps.
  EXPECT_DOUBLE_EQ(
      kernels::newton_schulz_flops(32, 16),
      3.0 * 32 * 16 + 5 * (4.0 * 16 * 16 * 32 + 2.0 * 16 * 16 * 16 + 3.0 * 16 * 16 + 2.0 * 32 * 16));
}

TEST(Muon, BadInputsAreErrorsBeforeAllocation) {
  EXPECT_THROW(testing::tiny_config({"opt_type=moun"}), MeshError);
  EXPECT_THROW(testing::tiny_config({"muon_beta=1.0"}), MeshError);
  EXPECT_THROW(testing::tiny_config({"muon_weight_decay=-0.1"}), MeshError);
  EXPECT_THROW(testing::tiny_config({"muon_consistent_rms=0"}), MeshError);
  EXPECT_FALSE(testing::tiny_config({"muon_consistent_rms=null"}).muon_consistent_rms.has_value());
  EXPECT_EQ(testing::tiny_config({"muon_consistent_rms=0.2"}).muon_consistent_rms, 0.2);
  try {
    testing::tiny_config({"opt_type=moun"});
  } catch (const MeshError& error) {
    EXPECT_NE(std::string(error.what()).find("did you mean 'muon'"), std::string::npos) << error.what();
  }
  // Muon needs whole matrices: under FSDP and tensor the update gathers each sharded one over its axis;
  // replicated kv heads (mesh.tensor beyond base_num_kv_heads=2) are refused before anything is allocated.
  for (const auto& [mesh, axis] :
       {std::pair{"mesh.fsdp=2", MeshAxis::fsdp}, {"mesh.tensor=2", MeshAxis::tensor}}) {
    const TrainingPlan plan = testing::tiny_plan({"opt_type=muon", mesh});
    int gathers = 0;
    for (const KernelPlan& kernel : plan.kernels) {
      for (const PlanOp& op : kernel.ops)
        gathers += op.op->role == OpRole::muon_gather && op.op->collective.axis == axis ? 1 : 0;
    }
    EXPECT_GT(gathers, 0) << mesh;
  }
  try {
    testing::tiny_plan({"opt_type=muon", "mesh.tensor=4"});
    ADD_FAILURE() << "Muon over replicated kv heads was accepted";
  } catch (const MeshError& error) {
    EXPECT_NE(std::string(error.what()).find("at most base_num_kv_heads"), std::string::npos) << error.what();
  }
  // No hidden matrix: the spec's matrices all taken (a model always has some; the groups' data decides).
  Config config = testing::tiny_config({"opt_type=muon"});
  ModelSpec spec = build_model_spec(config);
  for (ParameterDecl& parameter : spec.parameters) {
    if (parameter.role == ParameterRole::matrix) parameter.role = ParameterRole::head;
  }
  try {
    apply_optimizer(spec, config);
    ADD_FAILURE() << "Muon without a hidden matrix was accepted";
  } catch (const MeshError& error) {
    EXPECT_NE(std::string(error.what()).find("config key 'opt_type'"), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace meshtrain
