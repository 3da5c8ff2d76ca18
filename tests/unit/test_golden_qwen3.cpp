// Golden Qwen3: logits, loss and every gradient against an independent float64 PyTorch implementation of
// Hugging Face's Qwen3 modeling code (tests/reference/qwen3_golden/make_golden.py), loaded through the
// Hugging Face name mapping. Both the tied and the untied unembedding are covered.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "golden_files.h"
#include "gradcheck.h"
#include "meshtrain/interchange/hf_names.h"
#include "meshtrain/io/safetensors.h"
#include "meshtrain/kernels/cpu/cross_entropy.h"
#include "meshtrain/runtime/engine.h"

namespace meshtrain {
namespace {

const std::string kGoldenDir = std::string(MESHTRAIN_SOURCE_DIR) + "/tests/reference/qwen3_golden/";

// The engine config equivalent to a Hugging Face Qwen3 config.json.
Config config_from_hf(const std::string& path, int64_t batch, int64_t length) {
  const nlohmann::json hf = nlohmann::json::parse(std::ifstream(path));
  const auto key = [&](const char* name) { return hf.at(name).dump(); };
  return load_config(
      "qwen3-tiny",
      {"base_emb_dim=" + key("hidden_size"), "base_mlp_dim=" + key("intermediate_size"),
       "base_num_decoder_layers=" + key("num_hidden_layers"),
       "base_num_query_heads=" + key("num_attention_heads"),
       "base_num_kv_heads=" + key("num_key_value_heads"), "head_dim=" + key("head_dim"),
       "vocab_size=" + key("vocab_size"), "normalization_layer_epsilon=" + key("rms_norm_eps"),
       "rope_max_timescale=" + key("rope_theta"), "logits_via_embedding=" + key("tie_word_embeddings"),
       "per_device_batch_size=" + std::to_string(batch), "max_target_length=" + std::to_string(length)});
}

using testing::golden_batch;
using testing::read_all;

void check_variant(const std::string& variant) {
  const SafetensorsFile weights = SafetensorsFile::open(kGoldenDir + variant + "/model.safetensors");
  const SafetensorsFile golden = SafetensorsFile::open(kGoldenDir + variant + "/golden.safetensors");
  const std::vector<int64_t> token_shape = golden.find("inputs")->shape;
  const int64_t B = token_shape[0], S = token_shape[1], N = B * S;
  Engine engine(config_from_hf(kGoldenDir + variant + "/config.json", B, S));
  const ModelSpec& spec = engine.spec();
  load_hf_weights(weights, spec, [&](BufferId id) { return engine.view(id).f32(); });

  const Batch batch = golden_batch(golden);
  engine.set_poison_temporaries(true);
  const LossSums sums = engine.fwd_bwd(batch);

  // float32 end to end against a float64 reference: a few ulps of accumulated rounding.
  const double loss_error = std::fabs(sums.loss_sum / static_cast<double>(sums.valid_count) -
                                      static_cast<double>(read_all(golden, "loss")[0])) /
                            static_cast<double>(read_all(golden, "loss")[0]);
  testing::report_error(variant + " loss", loss_error, 2e-6);
  EXPECT_LT(loss_error, 2e-6);
  EXPECT_EQ(sums.valid_count, N);

  const ModelDims& m = spec.dims;
  const bool tied = spec.config.logits_via_embedding;
  const BufferId unembedding = tied ? spec.parameters.front().value : spec.parameters.back().value;
  std::vector<float> logits(static_cast<size_t>(N * m.V));
  kernels::unembed_logits(logits.data(), engine.view(spec.final_hidden).f32(), engine.view(unembedding).f32(),
                          tied ? kernels::UnembedLayout::table_VD : kernels::UnembedLayout::kernel_DV, N, m.D,
                          m.V, m.V_valid);
  const double logits_error = testing::relative_error(logits, read_all(golden, "logits"));
  testing::report_error(variant + " logits", logits_error, 1e-5);
  EXPECT_LT(logits_error, 1e-5);

  // The engine's gradients are of the loss SUM (the step divides by the global count); the golden's of the
  // mean.
  for (const HfTensorMapping& entry : hf_mapping(spec)) {
    const std::vector<float> expected = read_all(golden, "grad." + entry.hf_name);
    const float* gradient = engine.view(engine.spec().parameters.at(0).gradient).f32();
    for (const ParameterDecl& parameter : spec.parameters) {
      if (parameter.value == entry.parameter) gradient = engine.view(parameter.gradient).f32();
    }
    std::vector<float> actual(expected.size());
    const int64_t engine_out = spec.buffer(entry.parameter).shape.elements() / entry.hf_cols;
    for (int64_t row = 0; row < std::max<int64_t>(entry.hf_rows, 1); ++row) {
      for (int64_t col = 0; col < entry.hf_cols; ++col) {
        const int64_t from = entry.transpose ? col * engine_out + row : row * entry.hf_cols + col;
        actual[static_cast<size_t>(row * entry.hf_cols + col)] = gradient[from] / static_cast<float>(N);
      }
    }
    const double error = testing::relative_error(actual, expected);
    testing::report_error(variant + " grad " + entry.hf_name, error, 1e-5);
    EXPECT_LT(error, 1e-5) << entry.hf_name;
  }
}

TEST(GoldenQwen3, TiedMatchesPyTorch) {
  check_variant("tied");
}
TEST(GoldenQwen3, UntiedMatchesPyTorch) {
  check_variant("untied");
}

}  // namespace
}  // namespace meshtrain
