// Pipeline stages' layer placement (model/pipeline_placement.h): the default split (even, uneven,
// deepseek-v3's 61 layers over 16 stages), an explicit split, V chunks a rank round robin, that the chunks
// build the whole model between them, and each refusal's message.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "error_text.h"
#include "meshtrain/kernels/backend.h"
#include "meshtrain/model/pipeline_placement.h"

namespace meshtrain {
namespace {

using testing::error_of;

Config layers_config(int64_t layers, const std::vector<std::string>& overrides = {}) {
  std::vector<std::string> all = {"base_num_decoder_layers=" + std::to_string(layers)};
  all.insert(all.end(), overrides.begin(), overrides.end());
  return load_config("qwen3-tiny", all);
}

// Each chunk's layer count, in layer order.
std::vector<int64_t> sizes(const PipelinePlacement& placement) {
  std::vector<int64_t> counts;
  for (const LayerChunk& chunk : placement.chunks) counts.push_back(chunk.last_layer - chunk.first_layer + 1);
  return counts;
}

// The chunks are contiguous, cover layers 0 .. L - 1 once, and only the first holds the embedding and only
// the last the head.
void expect_contiguous(const PipelinePlacement& placement, int64_t layers) {
  int64_t next = 0;
  for (size_t c = 0; c < placement.chunks.size(); ++c) {
    const LayerChunk& chunk = placement.chunks[c];
    EXPECT_EQ(chunk.first_layer, next) << "chunk " << c;
    EXPECT_GE(chunk.last_layer, chunk.first_layer) << "chunk " << c;
    EXPECT_EQ(chunk.with_embedding, c == 0) << "chunk " << c;
    EXPECT_EQ(chunk.with_head, c + 1 == placement.chunks.size()) << "chunk " << c;
    next = chunk.last_layer + 1;
  }
  EXPECT_EQ(next, layers);
}

TEST(PipelinePlacement, OneStageIsTheWholeModel) {
  const PipelinePlacement placement = pipeline_placement(layers_config(2), 1);
  ASSERT_EQ(placement.chunks.size(), 1u);
  const LayerChunk whole;
  EXPECT_EQ(placement.chunks[0].first_layer, 0);
  EXPECT_EQ(placement.chunks[0].last_layer, 1);
  EXPECT_EQ(placement.chunks[0].with_embedding, whole.with_embedding);
  EXPECT_EQ(placement.chunks[0].with_head, whole.with_head);
  EXPECT_EQ(placement.chunks_of(0), (std::vector<int64_t>{0}));
}

TEST(PipelinePlacement, EvenSplitIsEqualChunks) {
  const PipelinePlacement placement = pipeline_placement(layers_config(8), 4);
  EXPECT_EQ(sizes(placement), (std::vector<int64_t>{2, 2, 2, 2}));
  expect_contiguous(placement, 8);
  EXPECT_FALSE(placement.explicit_split);
  for (int64_t stage = 0; stage < 4; ++stage) {
    EXPECT_EQ(placement.chunks_of(stage), (std::vector<int64_t>{stage}));
    EXPECT_EQ(placement.stage_of(stage), stage);
  }
}

TEST(PipelinePlacement, UnevenSplitPutsOneExtraLayerOnTheFirstChunks) {
  const PipelinePlacement placement = pipeline_placement(layers_config(10), 4);
  EXPECT_EQ(sizes(placement), (std::vector<int64_t>{3, 3, 2, 2}));
  expect_contiguous(placement, 10);
  EXPECT_EQ(placement.chunks[1].first_layer, 3);
  EXPECT_EQ(placement.chunks[1].last_layer, 5);
  EXPECT_EQ(placement.chunks[3].first_layer, 8);
}

// DeepSeek-V3 was trained with 16 stages over its 61 layers: 61 = 13 x 4 + 3 x 3 (Megatron #1304 built fewer
// layers than asked in such a case).
TEST(PipelinePlacement, DeepSeekV3sSixtyOneLayersOverSixteenStages) {
  const Config config = load_config("deepseek-v3", {});
  ASSERT_EQ(config.base_num_decoder_layers, 61);
  const PipelinePlacement placement = pipeline_placement(config, 16);
  std::vector<int64_t> expected(13, 4);
  expected.insert(expected.end(), 3, 3);
  EXPECT_EQ(sizes(placement), expected);
  expect_contiguous(placement, 61);
  EXPECT_EQ(placement.chunks[12].last_layer, 51);
  EXPECT_EQ(placement.chunks[13].first_layer, 52);
  EXPECT_EQ(placement.chunks[15].last_layer, 60);
}

TEST(PipelinePlacement, ExplicitSplitIsTakenAsGiven) {
  // torchtitan's "first and last stages hold fewer layers" (they also hold the embedding and the head).
  const PipelinePlacement placement =
      pipeline_placement(layers_config(10, {"pipeline_layers_per_chunk=[2,4,3,1]"}), 4);
  EXPECT_TRUE(placement.explicit_split);
  EXPECT_EQ(sizes(placement), (std::vector<int64_t>{2, 4, 3, 1}));
  expect_contiguous(placement, 10);
}

// V = 2 virtual stages over P = 2 ranks: four chunks in layer order, rank s holding chunks s and s + P.
TEST(PipelinePlacement, RepeatsGoRoundRobinOverTheStageRanks) {
  const Config config = layers_config(7, {"num_pipeline_repeats=2", "pipeline_schedule=interleaved_1f1b"});
  const PipelinePlacement placement = pipeline_placement(config, 2);
  EXPECT_EQ(placement.repeats, 2);
  EXPECT_EQ(sizes(placement), (std::vector<int64_t>{2, 2, 2, 1}));
  expect_contiguous(placement, 7);
  EXPECT_EQ(placement.chunks_of(0), (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(placement.chunks_of(1), (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(placement.stage_of(2), 0);
  EXPECT_EQ(placement.stage_of(3), 1);
  const PipelinePlacement four = pipeline_placement(
      layers_config(8, {"num_pipeline_repeats=2", "pipeline_schedule=interleaved_1f1b"}), 4);
  EXPECT_EQ(four.chunks_of(1), (std::vector<int64_t>{1, 5}));
  EXPECT_EQ(four.chunks_of(3), (std::vector<int64_t>{3, 7}));
}

// The chunks a placement gives build, each with the family's builder, the whole model's parameters between
// them (a tied table on both ends): the placement and the builders agree on what a chunk is.
TEST(PipelinePlacement, ChunksBuildTheWholeModelBetweenThem) {
  const Config config = layers_config(
      5, {"num_pipeline_repeats=2", "pipeline_schedule=interleaved_1f1b", "logits_via_embedding=true"});
  const kernels::KernelBackend& cpu = kernels::kernel_backend_for_device("cpu");
  std::set<std::string> whole, joined;
  for (const ParameterDecl& parameter : build_model_spec(config).parameters)
    whole.insert(parameter.canonical_name);
  int64_t tables = 0;
  for (const LayerChunk& chunk : pipeline_placement(config, 2).chunks) {
    for (const ParameterDecl& parameter : build_model_spec(config, Mesh{}, cpu, {chunk}).parameters) {
      joined.insert(parameter.canonical_name);
      tables += parameter.canonical_name == "token_embedder/embedding" ? 1 : 0;
    }
  }
  EXPECT_EQ(joined, whole);
  EXPECT_EQ(tables, 2) << "the first and the last chunk each hold the tied table";
}

TEST(PipelinePlacement, RepeatsBelowOneAreRefused) {
  const std::string error =
      error_of([] { pipeline_placement(layers_config(4, {"num_pipeline_repeats=0"}), 2); });
  EXPECT_NE(error.find("config key 'num_pipeline_repeats'"), std::string::npos) << error;
  EXPECT_NE(error.find("expected 1 or more chunks a stage rank"), std::string::npos) << error;
  EXPECT_NE(error.find("found 0"), std::string::npos) << error;
  EXPECT_NE(error.find("set num_pipeline_repeats=1"), std::string::npos) << error;
}

TEST(PipelinePlacement, MoreChunksThanLayersAreRefused) {
  const std::string stages = error_of([] { pipeline_placement(layers_config(2), 3); });
  EXPECT_NE(stages.find("config keys 'mesh.stage' / 'num_pipeline_repeats'"), std::string::npos) << stages;
  EXPECT_NE(stages.find("expected at most base_num_decoder_layers = 2 chunks"), std::string::npos) << stages;
  EXPECT_NE(stages.find("found mesh.stage x num_pipeline_repeats = 3 x 1 = 3 chunks"), std::string::npos)
      << stages;
  EXPECT_NE(stages.find("mesh.stage x num_pipeline_repeats <= 2"), std::string::npos) << stages;
  const std::string repeats = error_of([] {
    pipeline_placement(layers_config(5, {"num_pipeline_repeats=3", "pipeline_schedule=interleaved_1f1b"}), 2);
  });
  EXPECT_NE(repeats.find("found mesh.stage x num_pipeline_repeats = 2 x 3 = 6 chunks"), std::string::npos)
      << repeats;
}

TEST(PipelinePlacement, ExplicitSplitOfAnotherLengthIsRefused) {
  const std::string error =
      error_of([] { pipeline_placement(layers_config(10, {"pipeline_layers_per_chunk=[5,5]"}), 4); });
  EXPECT_NE(error.find("config key 'pipeline_layers_per_chunk'"), std::string::npos) << error;
  EXPECT_NE(error.find("expected mesh.stage x num_pipeline_repeats = 4 x 1 = 4 layer counts"),
            std::string::npos)
      << error;
  EXPECT_NE(error.find("found 2 ([5, 5])"), std::string::npos) << error;
  EXPECT_NE(error.find("the default placement is [3, 3, 2, 2]"), std::string::npos) << error;
  // A one-stage mesh takes one count (or none).
  const std::string one_stage =
      error_of([] { pipeline_placement(layers_config(2, {"pipeline_layers_per_chunk=[1,1]"}), 1); });
  EXPECT_NE(one_stage.find("= 1 x 1 = 1 layer counts"), std::string::npos) << one_stage;
}

TEST(PipelinePlacement, ExplicitSplitWithAnEmptyChunkIsRefused) {
  for (const char* split : {"pipeline_layers_per_chunk=[4,0,3,3]", "pipeline_layers_per_chunk=[4,-1,4,3]"}) {
    const std::string error = error_of([&] { pipeline_placement(layers_config(10, {split}), 4); });
    EXPECT_NE(error.find("config key 'pipeline_layers_per_chunk'"), std::string::npos) << error;
    EXPECT_NE(error.find("expected a positive layer count for every chunk"), std::string::npos) << error;
    EXPECT_NE(error.find("for chunk 1"), std::string::npos) << error;
  }
}

TEST(PipelinePlacement, ExplicitSplitThatDoesNotSumToTheLayersIsRefused) {
  const std::string error = error_of([] {
    std::vector<std::string> split = {"pipeline_layers_per_chunk=[4,4,4,4,4,4,4,4,4,4,4,4,4,3,3,2]"};
    pipeline_placement(load_config("deepseek-v3", split), 16);
  });
  EXPECT_NE(error.find("config key 'pipeline_layers_per_chunk'"), std::string::npos) << error;
  EXPECT_NE(error.find("expected counts summing to base_num_decoder_layers = 61"), std::string::npos)
      << error;
  EXPECT_NE(error.find("found a sum of 60 ("), std::string::npos) << error;
  EXPECT_NE(error.find("the default placement is [4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 3, 3, 3]"),
            std::string::npos)
      << error;
}

}  // namespace
}  // namespace meshtrain
