// The mixture-of-experts block inside a model (model/layers/moe.h): the routing statistics a kernel run
// reports (counted once under remat), the balance loss's value, and the selection bias's load-based update.
#include <gtest/gtest.h>

#include <numeric>
#include <random>

#include "meshtrain/model/spec.h"
#include "meshtrain/runtime/engine.h"

namespace meshtrain {
namespace {

Config tiny_moe(const std::vector<std::string>& extra = {}) {
  std::vector<std::string> overrides = {"base_emb_dim=32",
                                        "base_num_query_heads=4",
                                        "base_num_kv_heads=4",
                                        "base_mlp_dim=48",
                                        "base_num_decoder_layers=3",
                                        "vocab_size=100",
                                        "max_target_length=8",
                                        "per_device_batch_size=2",
                                        "init_weights_seed=3",
                                        "q_lora_rank=12",
                                        "kv_lora_rank=10",
                                        "qk_nope_head_dim=6",
                                        "qk_rope_head_dim=4",
                                        "v_head_dim=8",
                                        "num_experts=6",
                                        "num_experts_per_tok=2",
                                        "base_moe_mlp_dim=12",
                                        "first_num_dense_layers=1"};
  overrides.insert(overrides.end(), extra.begin(), extra.end());
  return load_config("deepseek-tiny", overrides);
}

Batch random_batch(const ModelDims& m, uint64_t seed) {
  std::mt19937 generator(static_cast<uint32_t>(seed));
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(m.V_valid - 1));
  Batch batch;
  for (int64_t i = 0; i < m.B * m.S; ++i) {
    batch.tokens.push_back(token(generator));
    batch.targets.push_back(token(generator));
    batch.positions.push_back(static_cast<int32_t>(i % m.S));
    batch.segment_ids.push_back(0);
    batch.loss_mask.push_back(1);
  }
  return batch;
}

TEST(Moe, RoutingStatisticsCountEveryAssignmentOnceUnderAnyRemat) {
  std::vector<RoutingSums> by_policy;
  for (const char* policy : {"none", "full"}) {
    Engine engine(tiny_moe(
        {std::string("remat_policy=") + policy, "capacity_factor=1.0", "load_balance_loss_weight=0.1"}));
    const ModelSpec& spec = engine.spec();
    ASSERT_EQ(spec.moe_layers, (std::vector<std::string>{"decoder/layers_1", "decoder/layers_2"}));
    const LossSums sums = engine.fwd_bwd(random_batch(spec.dims, 7));
    const RoutingSums& routing = sums.routing;
    ASSERT_EQ(routing.expert_load.size(), 2u * 6u);
    for (size_t layer = 0; layer < 2; ++layer) {
      const auto begin = routing.expert_load.begin() + static_cast<std::ptrdiff_t>(layer * 6);
      EXPECT_EQ(std::accumulate(begin, begin + 6, 0.0), 16.0 * 2.0) << "N k assignments, layer " << layer;
      // Capacity ceil(1.0 x 16 x 2 / 6) = 6 per expert: whatever an expert takes beyond 6 is dropped.
      double beyond = 0.0;
      for (auto it = begin; it != begin + 6; ++it) beyond += std::max(*it - 6.0, 0.0);
      EXPECT_EQ(routing.dropped[layer], beyond) << "layer " << layer;
      // The balance loss's sum over the 16 tokens (weight x E x sum_e f_e P_e per token): positive.
      EXPECT_GT(routing.balance_loss[layer], 0.0) << "layer " << layer;
    }
    by_policy.push_back(routing);
  }
  EXPECT_EQ(by_policy[0].expert_load, by_policy[1].expert_load);
  EXPECT_EQ(by_policy[0].dropped, by_policy[1].dropped);
  EXPECT_EQ(by_policy[0].balance_loss, by_policy[1].balance_loss);
}

TEST(Moe, SelectionBiasMovesTowardsTheMeanLoadAndNoGradientReachesIt) {
  Engine engine(tiny_moe({"routed_bias=true"}));
  const ModelSpec& spec = engine.spec();
  ASSERT_EQ(spec.moe_selection_biases.size(), 2u);
  engine.fwd_bwd(random_batch(spec.dims, 3));
  for (const ParameterDecl& parameter : spec.parameters) {
    if (parameter.value != spec.moe_selection_biases[0]) continue;
    const TensorView gradient = engine.view(parameter.gradient);
    for (int64_t e = 0; e < gradient.elements(); ++e) EXPECT_EQ(gradient.f32()[e], 0.0f);
  }
  // Mean load 5: under-loaded experts rise by the rate, over-loaded ones fall, one at the mean stays.
  const std::vector<double> load = {5, 9, 1, 5, 7, 3, /* layer 2 */ 0, 0, 0, 0, 0, 30};
  engine.update_selection_biases(load, 0.25);
  const float* first = engine.view(spec.moe_selection_biases[0]).f32();
  EXPECT_EQ(std::vector<float>(first, first + 6), (std::vector<float>{0, -0.25f, 0.25f, 0, -0.25f, 0.25f}));
  const float* second = engine.view(spec.moe_selection_biases[1]).f32();
  EXPECT_EQ(std::vector<float>(second, second + 6),
            (std::vector<float>{0.25f, 0.25f, 0.25f, 0.25f, 0.25f, -0.25f}));
}

}  // namespace
}  // namespace meshtrain
