// The parameter store: every parameter of a spec by index and checkpoint name over its runtime's storage,
// and copying values between a training engine and a decode plan's engine.
#include <gtest/gtest.h>

#include <cstring>

#include "meshtrain/config/config.h"
#include "meshtrain/core/error.h"
#include "meshtrain/model/parameter_store.h"
#include "meshtrain/plan/decode.h"
#include "meshtrain/runtime/engine.h"

namespace meshtrain {
namespace {

Config tiny_config() {
  return load_config("qwen3-tiny",
                     {"base_emb_dim=32", "base_num_query_heads=4", "base_num_kv_heads=2", "head_dim=8",
                      "base_mlp_dim=48", "base_num_decoder_layers=1", "vocab_size=100", "max_target_length=8",
                      "per_device_batch_size=1", "dataset_type=synthetic", "tokenizer_path="});
}

TEST(ParameterStore, FindsEveryParameterByCheckpointName) {
  const Engine engine(tiny_config());
  const ParameterStore& store = engine.parameters();
  const ModelSpec& spec = engine.spec();
  ASSERT_EQ(store.size(), spec.parameters.size());
  for (size_t p = 0; p < store.size(); ++p) {
    EXPECT_EQ(store.name(p), spec.buffer(spec.parameters[p].value).name);
    EXPECT_EQ(store.find(store.name(p)), p);
    EXPECT_EQ(store.value(p).data, engine.view(spec.parameters[p].value).data) << store.name(p);
  }
  EXPECT_FALSE(store.find("decoder/layers_9/mlp/wo/kernel").has_value());
}

TEST(ParameterStore, CopiesATrainingEnginesValuesIntoADecodePlan) {
  const Config config = tiny_config();
  Engine training(config);
  const std::optional<size_t> table = training.parameters().find("token_embedder/embedding");
  ASSERT_TRUE(table.has_value());
  training.parameters().value(*table).f32()[3] = 42.0f;
  Engine decoding(plan_decode(config, 4));
  decoding.parameters().copy_from(training.parameters());
  const std::optional<size_t> copied = decoding.parameters().find("token_embedder/embedding");
  ASSERT_TRUE(copied.has_value());
  EXPECT_EQ(decoding.parameters().value(*copied).f32()[3], 42.0f);
  for (size_t p = 0; p < training.parameters().size(); ++p) {
    const TensorView a = training.parameters().value(p), b = decoding.parameters().value(p);
    ASSERT_EQ(a.bytes(), b.bytes());
    EXPECT_EQ(std::memcmp(a.data, b.data, a.bytes()), 0) << training.parameters().name(p);
  }
  // Another model's store is refused.
  const Engine wider(load_config(
      "qwen3-tiny", {"base_emb_dim=64", "base_num_query_heads=4", "base_num_kv_heads=2", "head_dim=8",
                     "base_mlp_dim=48", "base_num_decoder_layers=1", "vocab_size=100", "max_target_length=8",
                     "per_device_batch_size=1", "dataset_type=synthetic", "tokenizer_path="}));
  EXPECT_ANY_THROW(decoding.parameters().copy_from(wider.parameters()));
}

}  // namespace
}  // namespace meshtrain
