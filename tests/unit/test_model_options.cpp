// The layers' typed options (model/options.h): filled once from the config's keys, and what the spec's
// layers read in place of the config.
#include <gtest/gtest.h>

#include "meshtrain/config/config.h"
#include "meshtrain/model/options.h"
#include "meshtrain/model/spec.h"

namespace meshtrain {
namespace {

TEST(ModelOptions, CarryEachLayersKeys) {
  const Config config = load_config(
      "deepseek-custom", {"num_threads=3", "rope_max_timescale=5000", "normalization_layer_epsilon=1e-5",
                          "context_parallel_strategy=ring", "remat_policy=full", "sinkhorn_iterations=7"});
  const ModelOptions options = model_options(config);
  EXPECT_EQ(options.attention.threads, 3);
  EXPECT_EQ(options.attention.rope_max_timescale, 5000.0);
  EXPECT_EQ(options.norm.epsilon, 1e-5);
  EXPECT_EQ(options.context.strategy, ContextParallelStrategy::ring);
  EXPECT_TRUE(options.context.attention_recomputed);
  EXPECT_EQ(options.mhc.sinkhorn_iterations, 7);
  EXPECT_EQ(options.mla.kv_lora_rank, config.kv_lora_rank);
  EXPECT_EQ(options.moe.experts, config.num_experts);
  EXPECT_EQ(options.moe.routing.top_k, config.num_experts_per_tok);
  for (int64_t layer = 0; layer < config.base_num_decoder_layers; ++layer) {
    EXPECT_EQ(options.moe.at(layer), moe_layer(config, layer)) << layer;
    EXPECT_EQ(options.engram.at(layer), engram_layer(config, layer)) << layer;
  }
  EXPECT_EQ(options.engram.table_sizes, engram_layer_table_sizes(config));
}

TEST(ModelOptions, AreWhatTheSpecsLayersRead) {
  // The spec carries the options of its config, and its Engram layers take their tables' sizes from them.
  const Config config = load_config("deepseek-custom", {});
  ASSERT_FALSE(config.engram_layers.empty());
  const ModelSpec spec = build_model_spec(config);
  EXPECT_EQ(spec.options.engram.layers, config.engram_layers);
  ASSERT_EQ(spec.engram.size(), config.engram_layers.size());
  for (size_t i = 0; i < spec.engram.size(); ++i)
    EXPECT_EQ(spec.engram[i].table_sizes, spec.options.engram.table_sizes[i]);
}

}  // namespace
}  // namespace meshtrain
