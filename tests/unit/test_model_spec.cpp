// The model spec: exact parameter counts of the public shapes, the standard FLOPs formula's test vector,
// and the shape errors raised before anything is allocated.
#include <gtest/gtest.h>

#include <sstream>

#include "error_text.h"
#include "meshtrain/cli/info.h"
#include "meshtrain/core/cpu_features.h"
#include "meshtrain/core/error.h"
#include "meshtrain/model/spec.h"
#include "meshtrain/runtime/engine.h"

namespace meshtrain {
namespace {

int64_t parameters_of(const std::string& preset) {
  return build_model_spec(load_config(preset, {})).parameter_count();
}

using testing::error_of;

TEST(ModelSpec, ParameterCountsOfPublicShapes) {
  // Hugging Face config.json shapes; qwen3-8b's count is the plan issue's cross-check figure.
  EXPECT_EQ(parameters_of("qwen3-0.6b"), 596049920);
  EXPECT_EQ(parameters_of("qwen3-8b"), 8190735360);
  // GPT-2 124M: 124,439,808 with the 50,257-row table; 47 padding rows x 768 bring it to llm.c's 124,475,904.
  EXPECT_EQ(parameters_of("gpt2-124m"), 124475904);
}

TEST(ModelSpec, StandardTrainingFlopsTestVector) {
  const StandardFlops flops = standard_training_flops(
      load_config("qwen3-0.6b", {"per_device_batch_size=1", "max_target_length=2048"}));
  EXPECT_NEAR(flops.learnable / 1e12, 7.3235, 5e-5);
  EXPECT_NEAR(flops.attention / 1e12, 1.4431, 5e-5);
  EXPECT_NEAR(flops.total() / 1e12, 8.7666, 5e-5);
  // performance.md: 1,547.0 GFLOP for GPT-2 124M at B=8, T=256.
  const StandardFlops gpt2 =
      standard_training_flops(load_config("gpt2-124m", {"per_device_batch_size=8", "max_target_length=256"}));
  EXPECT_NEAR(gpt2.total() / 1e9, 1547.0, 0.05);
}

TEST(ModelSpec, InfoPrintsTheTestVector) {
  std::ostringstream out;
  run_info({"qwen3-0.6b", "per_device_batch_size=1", "max_target_length=2048"}, out);
  EXPECT_NE(out.str().find("parameters: 596049920"), std::string::npos) << out.str();
  EXPECT_NE(out.str().find("8.7666"), std::string::npos) << out.str();
}

// Total and activated parameters of the public MoE shapes, from the spec; a hand count (embedding and
// untied unembedding, per layer attention and norms, router and experts) gives the same numbers:
// Qwen3-30B-A3B 30.5B / 3.3B as its model card; DeepSeek-V3 671,026,419,200 (its 58 x 256 selection-bias
// entries included) / 37.6B.
TEST(ModelSpec, InfoPrintsTotalAndActivatedParametersOfMoeModels) {
  std::ostringstream qwen, deepseek;
  run_info({"qwen3-30b-a3b"}, qwen);
  EXPECT_NE(qwen.str().find("parameters: 30532122624\n"), std::string::npos) << qwen.str();
  EXPECT_NE(
      qwen.str().find("activated parameters per token: 3353032704 (8 of 128 routed experts in each of 48"),
      std::string::npos)
      << qwen.str();
  run_info({"deepseek-v3"}, deepseek);
  EXPECT_NE(deepseek.str().find("parameters: 671026419200\n"), std::string::npos) << deepseek.str();
  EXPECT_NE(
      deepseek.str().find("activated parameters per token: 37552297472 (8 of 256 routed experts in each "
                          "of 58 MoE layers)"),
      std::string::npos)
      << deepseek.str();
}

TEST(ModelSpec, ShapeErrorsNameTheKey) {
  EXPECT_NE(error_of([] {
              build_model_spec(load_config("qwen3-tiny", {"base_num_kv_heads=4"}));
            }).find("'base_num_kv_heads'"),
            std::string::npos);
  EXPECT_NE(error_of([] { build_model_spec(load_config("qwen3-tiny", {"head_dim=63"})); }).find("even"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              build_model_spec(
                  load_config("gpt2-124m", {"base_num_query_heads=7", "base_num_kv_heads=7", "head_dim=0"}));
            }).find("heads dividing the width"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              build_model_spec(load_config("qwen3-tiny", {"decoder_block=qwen"}));
            }).find("did you mean 'qwen3'"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              build_model_spec(load_config("gpt2-124m", {"max_target_length=2048"}));
            }).find("max_position_embeddings"),
            std::string::npos);
}

TEST(ModelSpec, BfloatRunIsRefusedBeforeAllocation) {
  const std::string message = error_of([] { Engine engine(load_config("qwen3-32b", {"dtype=bfloat16"})); });
  const CpuFeatures& cpu = cpu_features();
  if (!cpu.avx512_bf16 && !cpu.amx_bf16) {
    // On a CPU without bf16 instructions the error says what the machine has.
    EXPECT_NE(message.find("'dtype'"), std::string::npos) << message;
    EXPECT_NE(message.find("dtype=float32"), std::string::npos) << message;
    EXPECT_NE(message.find("AVX512-BF16"), std::string::npos) << message;
    EXPECT_NE(message.find(cpu.describe()), std::string::npos) << message;
  } else {
    // bf16 compute runs here: what stops qwen3-32b is its size, still before anything is allocated.
    EXPECT_EQ(message.find("'dtype'"), std::string::npos) << message;
    EXPECT_NE(message.find("largest buffers"), std::string::npos) << message;
  }
  // bf16 storage needs no bf16 instructions: its refusal names its own key and not the CPU.
  const std::string storage =
      error_of([] { Engine engine(load_config("qwen3-32b", {"mu_dtype=bfloat16"})); });
  EXPECT_NE(storage.find("'mu_dtype'"), std::string::npos) << storage;
  EXPECT_EQ(storage.find("AVX512-BF16"), std::string::npos) << storage;
}

TEST(ModelSpec, VocabularyIsPaddedToMultipleOf128) {
  EXPECT_EQ(padded_vocab_size(50257), 50304);
  EXPECT_EQ(padded_vocab_size(151936), 151936);
  EXPECT_EQ(padded_vocab_size(1), 128);
}

}  // namespace
}  // namespace meshtrain
